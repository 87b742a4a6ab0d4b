"""Which start keeps the closed-form variational GPN out of the noise-only optimum on UCI yacht?

The diagnostic behind the "Initialisation" finding of ``docs/results/routes.md``: the whitened
``VariationalGPN([6, 4, 1])`` on the bundled yacht split 0, trained by SVI with
``ClosedFormELBO`` for 4000 full-batch steps (Adam, lr 0.05 decaying to 0.005), once per
variant of the start. Prints test RMSE and log-likelihood (original units), the closed-form
negative ELBO per training row at the end, and the learned output noise (standardised units).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/vgpn_starts.py --seeds 1 --variants random identity \\
        scale1 ls1 lr01 noise01
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import pyro
import torch

from pyro_gpn.data import load_dataset
from pyro_gpn.inference import seed_everything
from pyro_gpn.inference.closed_form import ClosedFormELBO
from pyro_gpn.inference.svi import fit_svi
from pyro_gpn.models.variational import VariationalGPN

#: name -> (layer keyword arguments, learning rate)
VARIANTS: dict[str, tuple[dict, float]] = {
    "random": ({"targets_init": "random"}, 0.05),
    "identity": ({"targets_init": "identity"}, 0.05),
    "scale1": ({"targets_init": "random", "targets_scale_init": 1.0}, 0.05),
    "ls1": ({"targets_init": "random", "lengthscale_init": 1.0}, 0.05),
    "lr01": ({"targets_init": "random"}, 0.01),
    "noise01": ({"targets_init": "random", "noise_std_init": 0.01}, 0.05),
}


def run(seed: int, variant: str, steps: int = 4000) -> str:
    layer_kwargs, lr = VARIANTS[variant]
    data = load_dataset("yacht", seed=0, split=0)
    pyro.clear_param_store()
    seed_everything(seed)
    pyro.set_rng_seed(seed)
    vgpn = VariationalGPN([data.num_features, 4, 1], head="gaussian", whiten=True, **layer_kwargs)
    start = time.perf_counter()
    fit_svi(
        vgpn.model, vgpn.guide, data.x_train, data.y_train, loss=ClosedFormELBO(vgpn),
        num_steps=steps, lr=lr, lr_decay=0.1, seed=seed, progress=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    with torch.no_grad():
        pred = vgpn(data.x_test)
        y_std = float(data.y_std.reshape(-1)[0])
        rmse = float((pred.mean - data.y_test).square().mean().sqrt()) * y_std
        normal = torch.distributions.Normal(pred.mean, pred.variance.sqrt())
        log_lik = float(normal.log_prob(data.y_test).mean()) - math.log(y_std)
        loss = ClosedFormELBO(vgpn).loss(vgpn.model, vgpn.guide, data.x_train, data.y_train)
        noise = float(vgpn.noise_std.reshape(-1)[0])
    per_row = loss / data.x_train.shape[0]
    return (
        f"seed {seed} {variant:9s} test RMSE {rmse:.3f}  log-lik {log_lik:.3f}  "
        f"-ELBO/row {per_row:.3f}  output noise {noise:.3f}  {seconds:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=4000)
    args = parser.parse_args(argv)
    for seed in args.seeds:
        for variant in args.variants:
            print(run(seed, variant, args.steps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
