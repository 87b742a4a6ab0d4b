"""The row kernels (``meanvar_fwd`` / ``meanvar_bwd``) of this checkout against an older
revision's, on the inputs of one training step of a fitted variational GPN: their time, the
share of Gauss-Hermite rows, and how far each is from the reference PyTorch path.

``VariationalGPN([D, 50, 1])`` (recommended defaults) is fitted with ``fit_vgpn`` for
``--warm`` steps (predictive objective, lr 0.05, mini-batches of 512, no hold-out) on the
training rows of split 0 of a UCI set; then one step's kernel inputs are captured. Reports per
layer: the rows per node tier (``how``: 0 closed form, ``t + 1`` Gauss-Hermite tier ``t``),
forward and backward CPU milliseconds of both builds (minimum of 3 x 20 calls), and the largest
differences new-old, new-reference and old-reference of the output variances and every
gradient of a test function, relative to the largest entry (the reference:
``backend("reference")``, plain PyTorch with its own quadrature)::

    OMP_NUM_THREADS=1 python benchmarks/profile_gh_rows.py --sets kin8nm --baseline 1b9e5be
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402

from benchmarks.layer_speed import load_baseline  # noqa: E402
from benchmarks.uci import DATA_DIR  # noqa: E402
from pyro_gpn.data.uci_regression import load_uci_regression  # noqa: E402
from pyro_gpn.inference import fit_vgpn  # noqa: E402
from pyro_gpn.inference.closed_form import predictive_log_likelihood  # noqa: E402
from pyro_gpn.models import VariationalGPN  # noqa: E402
from pyro_gpn.moments import _numba_kernels as nk  # noqa: E402
from pyro_gpn.moments import cpu_kernels as ck  # noqa: E402
from pyro_gpn.moments.backend import backend  # noqa: E402
from pyro_gpn.moments.gaussian import Moments  # noqa: E402
from pyro_gpn.moments.propagate import response_moments  # noqa: E402


def captured_step(name: str, warm: int):
    """A fitted network's kernel calls of one training step: ``(kind, args)`` with kind
    ``"f"``/``"b"``, and the layers' ``cpu_response_meanvar`` arguments."""
    data = load_uci_regression(name, DATA_DIR, split=0, download=False)
    x, y = data.x_train, data.y_train
    n = x.shape[0]
    torch.manual_seed(0)
    net = VariationalGPN([data.num_features, 50, 1], num_data=n)
    options = dict(batch_size=512, val_fraction=0, lr=0.05, lr_decay=1.0)
    if warm:
        fit_vgpn(net, x, y, num_steps=warm, clear_param_store=False, **options)
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:512]
    calls, layer_args = [], []
    fwd, bwd, respond = nk.meanvar_fwd_serial, nk.meanvar_bwd_serial, ck.cpu_response_meanvar

    def spy_respond(*a):
        layer_args.append([t.detach().clone() if torch.is_tensor(t) else t for t in a])
        return respond(*a)

    nk.meanvar_fwd_serial = lambda *a: (calls.append(("f", a)), fwd(*a))[1]
    nk.meanvar_bwd_serial = lambda *a: (calls.append(("b", a)), bwd(*a))[1]
    ck.cpu_response_meanvar = spy_respond
    try:
        (-predictive_log_likelihood(net, x[idx], y[idx]) / n).backward()
    finally:
        nk.meanvar_fwd_serial, nk.meanvar_bwd_serial = fwd, bwd
        ck.cpu_response_meanvar = respond
    return calls, layer_args


def cpu_ms(f, args, reps: int = 20) -> float:
    best = float("inf")
    for _ in range(3):
        f(*args)
        t = time.process_time()
        for _ in range(reps):
            f(*args)
        best = min(best, (time.process_time() - t) / reps * 1e3)
    return best


def rel(p: torch.Tensor, q: torch.Tensor) -> float:
    return float((p - q).abs().max() / q.abs().max())


def accuracy(args, base_meanvar) -> dict[str, tuple[float, float, float]]:
    """new-old, new-reference, old-reference of the variances and the gradients."""
    names = ["var", "d mu", "d v", "d lambda", "d beta", "d C"]
    outs = {}

    def fresh():
        return [t.detach().clone().requires_grad_(True) if torch.is_tensor(t) else t for t in args]

    for key, f in (("new", ck.cpu_response_meanvar), ("old", base_meanvar), ("ref", None)):
        a = fresh()
        a[2].requires_grad_(False)  # the inducing points are not differentiated
        if f is None:
            with backend("reference"):
                o = response_moments(Moments(a[0], var=a[1]), *a[2:], "meanvar", equidistant=True)
            mean, var = o.mean, o.var
        else:
            mean, var = f(*a)
        (mean.sin().sum() + var.cos().sum()).backward()
        outs[key] = [var.detach()] + [a[i].grad for i in (0, 1, 3, 4, 5)]
    return {
        nm: (
            rel(outs["new"][i], outs["old"][i]),
            rel(outs["new"][i], outs["ref"][i]),
            rel(outs["old"][i], outs["ref"][i]),
        )
        for i, nm in enumerate(names)
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["kin8nm"])
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pyro.settings.set(module_local_params=True)
    load_baseline(args.baseline)
    import pyro_gpn_base.moments._numba_kernels as bk
    import pyro_gpn_base.moments.cpu_kernels as bck

    print(f"load {os.getloadavg()}, baseline {args.baseline}, {args.warm} fitted steps")
    for name in args.sets:
        calls, layer_args = captured_step(name, args.warm)
        print(f"{name}:")
        for kind, a in calls:
            a = [c.copy() if isinstance(c, np.ndarray) else c for c in a]
            new_f = nk.meanvar_fwd_serial if kind == "f" else nk.meanvar_bwd_serial
            old_f = bk.meanvar_fwd_serial if kind == "f" else bk.meanvar_bwd_serial
            t_new, t_old = cpu_ms(new_f, a), cpu_ms(old_f, a)
            shape = a[0].shape
            tiers = f", rows per tier {np.bincount(a[-1].ravel()).tolist()}" if kind == "f" else ""
            print(f"  {'forward ' if kind == 'f' else 'backward'} {shape}: {t_old:.3f} -> "
                  f"{t_new:.3f} ms ({t_old / t_new:.2f}x){tiers}")  # fmt: skip
        for a in layer_args:
            print(f"  layer {tuple(a[0].shape)}: new-old / new-reference / old-reference")
            for nm, (no, nr, orf) in accuracy(a, bck.cpu_response_meanvar).items():
                print(f"    {nm:9s} {no:.1e} / {nr:.1e} / {orf:.1e}")
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
