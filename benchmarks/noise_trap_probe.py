"""Why some naval fits settle where the output noise explains the data (issue 15, uci.md
section 16): the state of the benchmark's Bayesian GPN along a fit, and two remedies.

The network is naval's ``bgpn_long`` (``VariationalGPN([16, 50, 1])`` at the recommendations,
the paper's closed-form ELBO, Adam from lr 0.02, mini-batches of 512, the model seed of the
split). Validation rows only; test rows are never touched.

``--mode state`` trains at a constant learning rate (no validation stopping) and prints, after
each of ``--steps`` (cumulative), the learned noise, the validation RMSE (standardised), the
mean predictive variance, the KL, the hidden units' mean absolute output and variance, and the
first layer's mean ``|m_ij|`` and ``q(W)`` standard deviation. ``--mode kl-warmup`` runs the
benchmark's schedule for ``--steps[-1]`` steps with the KL weighted by ``min(1, t / W)`` in step
``t`` (``--warmup W``; an annealed ELBO, the usual remedy for posterior collapse), and
``--mode noise-warmup`` with the noise held for the first ``W`` steps
(``fit_vgpn(noise_warmup=W)``); both print the best validation log-likelihood (original
units), its step, the steps run and the learned noise::

    OMP_NUM_THREADS=1 python benchmarks/noise_trap_probe.py --splits 6 5 --mode state
    OMP_NUM_THREADS=1 python benchmarks/noise_trap_probe.py --splits 6 12 19 --mode kl-warmup \\
        --warmup 1000 --steps 2000
"""

from __future__ import annotations

import argparse
import math
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.uci import DATA_DIR, bgpn_sizes, noise_std_of  # noqa: E402


def network(split: int):
    from pyro_gpn.heads import GaussianHead
    from pyro_gpn.models import VariationalGPN

    torch.manual_seed(split)  # the benchmark's model seed (seed 0 + split)
    return VariationalGPN(bgpn_sizes("naval", 16, (1,)), head=GaussianHead(1, 0.1))


def state(split: int, steps: list[int]) -> None:
    from pyro_gpn.data.uci_regression import load_uci_regression
    from pyro_gpn.inference import fit_vgpn

    data = load_uci_regression("naval", DATA_DIR, split=split, seed=0)
    net, done = network(split), 0
    for total in steps:
        fit_vgpn(
            net, data.x_train, data.y_train, val_fraction=0.0, num_steps=total - done, lr=0.02,
            lr_decay=1.0, batch_size=512, seed=split + done, elbo="closed_form",
        )  # fmt: skip
        done = total
        with torch.no_grad():
            pred, hidden = net(data.x_val), net.hidden(data.x_val)
            rmse = float((pred.mean - data.y_val).square().mean().sqrt())
            first = net.layers[0]
            print(
                f"split {split} step {done}: noise {noise_std_of(net.head):.3f}, validation "
                f"RMSE {rmse:.4f}, predictive variance {float(pred.variance.mean()):.4f}, "
                f"KL {float(net.kl_divergence()):.1f}, hidden |mean| "
                f"{float(hidden.mean.abs().mean()):.2f}, hidden variance "
                f"{float(hidden.variance.mean()):.3f}, W1 |m| "
                f"{float(first.weight.abs().mean()):.3f}, "
                f"W1 sd {float(first.weight_scale.mean()):.3f}",
                flush=True,
            )


def warmup(split: int, num_steps: int, mode: str, length: int) -> None:
    from pyro_gpn.data.uci_regression import load_uci_regression
    from pyro_gpn.inference import fit_vgpn

    data = load_uci_regression("naval", DATA_DIR, split=split, seed=0)
    net = network(split)
    if mode == "kl-warmup":  # the KL's weight rises linearly over the first `length` steps
        kl, calls = net.kl_divergence, [0]

        def annealed(self):
            calls[0] += 1  # one call per training step (validation does not use the KL)
            return kl() * min(1.0, calls[0] / length)

        net.kl_divergence = types.MethodType(annealed, net)
    fit = fit_vgpn(
        net, data.x_train, data.y_train, data.x_val, data.y_val, num_steps=num_steps, lr=0.02,
        lr_decay=0.1, batch_size=512, eval_every=25, patience=40, seed=split, elbo="closed_form",
        noise_warmup=length if mode == "noise-warmup" else 0,
    )  # fmt: skip
    shift = math.log(float(data.y_std))
    print(
        f"split {split} {mode} {length}: validation log-lik {fit.best_val_log_lik - shift:.3f} "
        f"at step {fit.best_step} of {fit.num_steps}, noise {noise_std_of(net.head):.3f}",
        flush=True,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--splits", nargs="+", type=int, default=[6])
    p.add_argument("--mode", choices=("state", "kl-warmup", "noise-warmup"), default="state")
    p.add_argument("--steps", nargs="+", type=int, default=[100, 350, 1000, 2000])
    p.add_argument("--warmup", type=int, default=500)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    for split in a.splits:
        if a.mode == "state":
            state(split, a.steps)
        else:
            warmup(split, a.steps[-1], a.mode, a.warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
