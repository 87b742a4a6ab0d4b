"""Time per epoch of the Bayesian GPN against GPyTorch's 2-layer deep GP and the MC-dropout
MLP, side by side.

Same process, same data (the training rows of split 0), same batch size; the models' steps
(``gpn_point`` / ``gpn_variational``: ``VariationalGPN([D, 50, 1])`` with point or variational
weights, closed-form ELBO; ``dgp``: the benchmark's deep GP, 10 likelihood samples; ``mlp``: the
benchmark's MC-dropout net, tanh ``[D, 50, 1]`` with dropout 0.05, its training loss) are timed
in alternating blocks of ``--block`` steps, ``--repeats`` times, so that the load of a shared
machine hits all alike. Reports the median wall and process-CPU seconds per epoch of each model,
their ratios and torch's thread count at the end (the pool fix of ``cpu_kernels._k``: it must
stay 1 under ``OMP_NUM_THREADS=1``). Usage::

    OMP_NUM_THREADS=1 python benchmarks/uci_timing.py --sets boston concrete --batch 0

The GPN's step depends on its state: rows whose activations are narrow against the lengthscale
take the Gauss-Hermite path of the row kernels, and their share grows during a fit (none at the
initial state). ``--warm N`` trains every model for ``N`` untimed steps first, so that the
timing sees a state a fit spends its steps in. ``--elbo predictive`` times the library's
default objective (:func:`~pyro_gpn.inference.predictive_log_likelihood`) instead of the
closed-form ELBO, ``--head heteroscedastic`` the input-dependent noise head, ``--lr`` sets
every model's Adam rate (``pyro_gpn.recommended.VGPN.lr`` is 0.05), ``--gpn-width`` the Bayesian
GPN's hidden width (kin8nm's chosen network has 100 units, protein's 200; the deep GP and the
MLP keep theirs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyro  # noqa: E402
import torch  # noqa: E402

from benchmarks.uci import DATA_DIR, build_dgp  # noqa: E402
from pyro_gpn.data.uci_regression import load_uci_regression  # noqa: E402
from pyro_gpn.heads import HeteroscedasticGaussianHead  # noqa: E402
from pyro_gpn.inference.closed_form import (  # noqa: E402
    closed_form_elbo,
    predictive_log_likelihood,
)
from pyro_gpn.models import VariationalGPN  # noqa: E402
from pyro_gpn.models.baselines import FixedActivationNet  # noqa: E402

MODELS = ("gpn_point", "gpn_variational", "dgp", "mlp")


def parser() -> argparse.ArgumentParser:
    """The command line (its defaults fill the options a caller of :func:`time_set` omits)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", nargs="+", default=["boston", "concrete"])
    p.add_argument("--batch", type=int, default=0, help="batch size (0: full batch)")
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--warm", type=int, default=1, help="untimed training steps per model first")
    p.add_argument("--elbo", default="closed_form", choices=["closed_form", "predictive"])
    p.add_argument("--head", default="gaussian", choices=["gaussian", "heteroscedastic"])
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--gpn-width", type=int, default=50, help="the Bayesian GPN's hidden units")
    p.add_argument(
        "--foreach",
        action="store_true",
        help="every model's Adam with foreach=True (as fit_vgpn and Trainer run it)",
    )
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    pyro.settings.set(module_local_params=True)
    results = [time_set(name, a) for name in a.sets]
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


def time_set(name: str, a: argparse.Namespace) -> dict:
    """Alternating timing blocks on one set (module docstring); options missing from ``a``
    take the command line's defaults."""
    a = argparse.Namespace(**{**vars(parser().parse_args([])), **vars(a)})
    import gpytorch
    import pyro
    from gpytorch.mlls import DeepApproximateMLL, VariationalELBO

    # the networks' PyroParams live in Pyro's global store: start from an empty one, so that
    # no parameter of an earlier network with the same name (another shape) is picked up
    pyro.clear_param_store()
    data = load_uci_regression(name, DATA_DIR, split=0, download=False)
    x, y = data.x_train, data.y_train
    n = x.shape[0]
    batch = n if a.batch <= 0 else min(a.batch, n)
    steps_per_epoch = math.ceil(n / batch)
    torch.manual_seed(0)

    def head():
        return HeteroscedasticGaussianHead(1) if a.head == "heteroscedastic" else "gaussian"

    gpn = {
        w: VariationalGPN([data.num_features, a.gpn_width, 1], head=head(), weights=w, num_data=n)
        for w in ("point", "variational")
    }
    # --foreach: every model's Adam as fit_vgpn and Trainer run it since 2026-11-25
    adam = {"lr": a.lr, "foreach": True} if a.foreach else {"lr": a.lr}
    gpn_opt = {w: torch.optim.Adam(m.parameters(), **adam) for w, m in gpn.items()}
    objective = predictive_log_likelihood if a.elbo == "predictive" else closed_form_elbo
    dgp = build_dgp(data.num_features)
    dgp_opt = torch.optim.Adam(dgp.parameters(), **adam)
    mll = DeepApproximateMLL(VariationalELBO(dgp.likelihood, dgp, n))
    mlp = FixedActivationNet([data.num_features, 50, 1], head="gaussian", dropout=0.05).train()
    mlp_opt = torch.optim.Adam(mlp.parameters(), **adam)

    def mlp_step(idx):
        loss = mlp.loss(x[idx], y[idx]) + mlp.penalty()
        mlp_opt.zero_grad()
        loss.backward()
        mlp_opt.step()

    def gpn_step(w, idx):
        loss = -objective(gpn[w], x[idx], y[idx]) / n
        gpn_opt[w].zero_grad()
        loss.backward()
        gpn_opt[w].step()

    def dgp_step(idx):
        with gpytorch.settings.num_likelihood_samples(10):
            dgp_opt.zero_grad()
            loss = -mll(dgp(x[idx]), y[idx].reshape(-1))
            loss.backward()
            dgp_opt.step()

    def step(key, idx):
        if key == "dgp":
            dgp_step(idx)
        elif key == "mlp":
            mlp_step(idx)
        else:
            gpn_step(key.split("_")[1], idx)

    times = {key: [] for key in a.models}
    cpu = {key: [] for key in times}
    for key in times:  # warm-up, untimed (Numba's compilation, first allocations; --warm)
        for _ in range(a.warm):
            step(key, torch.randperm(n)[:batch])
    for _ in range(a.repeats):
        for key in times:
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(a.block):
                step(key, torch.randperm(n)[:batch])
            times[key].append((time.perf_counter() - t0) / a.block * steps_per_epoch)
            cpu[key].append((time.process_time() - c0) / a.block * steps_per_epoch)
    row = {
        "set": name,
        "num_train": n,
        "batch": batch,
        "warm_steps": a.warm,
        "elbo": a.elbo,
        "head": a.head,
        "lr": a.lr,
        "gpn_width": a.gpn_width,
        "adam_foreach": a.foreach,
        "s_per_epoch_median": {k: statistics.median(v) for k, v in times.items()},
        "s_per_epoch_all": times,
        "cpu_s_per_epoch_median": {k: statistics.median(v) for k, v in cpu.items()},
        "cpu_s_per_epoch_all": cpu,
        "load_avg_1m": os.getloadavg()[0],
        "torch_threads_end": torch.get_num_threads(),
    }
    med, cmed = row["s_per_epoch_median"], row["cpu_s_per_epoch_median"]
    for other in ("dgp", "mlp"):
        for w, short in (("variational", "vi"), ("point", "point")):
            gpn_key = f"gpn_{w}"
            if other in med and gpn_key in med:
                row[f"ratio_{other}_over_gpn_{short}"] = med[other] / med[gpn_key]
                row[f"cpu_ratio_{other}_over_gpn_{short}"] = cmed[other] / cmed[gpn_key]
    print(json.dumps({k: v for k, v in row.items() if not k.endswith("_all")}), flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
