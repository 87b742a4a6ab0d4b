"""The closed-form rule's tolerance (``pyro_gpn.moments.quadrature.CLOSED_FORM_RTOL``): how many
narrow rows of a fitted network each tolerance sends to Gauss-Hermite, what the row kernels
then cost, and how far their results are from quadrature on every narrow row (tolerance 0).

``VariationalGPN([D, 50, 1])`` is fitted for ``--warm`` steps on split 0 of each UCI set (as in
``benchmarks/profile_gh_rows.py``); one training step's layer inputs are captured and evaluated
with each tolerance: rows per node tier, forward and backward CPU milliseconds of the kernels,
and the largest difference of the variances and of the gradients of a test function from the
all-quadrature result, relative to the largest entry. ``--grid`` prints instead the worst float64
variance error of the rule's accuracy test units
(``tests/moments/test_accuracy.py::RULE_UNITS``) against the quadrature reference::

    OMP_NUM_THREADS=1 python benchmarks/closed_form_rtol.py --sets kin8nm boston
    OMP_NUM_THREADS=1 python benchmarks/closed_form_rtol.py --grid
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests" / "moments"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402

from benchmarks.profile_gh_rows import captured_step, cpu_ms, rel  # noqa: E402
from pyro_gpn.moments import _numba_kernels as nk  # noqa: E402
from pyro_gpn.moments import cpu_kernels as ck  # noqa: E402
from pyro_gpn.moments import propagate  # noqa: E402
from pyro_gpn.moments.backend import backend  # noqa: E402

DEFAULT = propagate.CLOSED_FORM_RTOL


def evaluate(args: list, rtol: float) -> tuple[list[torch.Tensor], dict[str, float], list[int]]:
    """The layer's variance and input gradients at tolerance ``rtol``, the kernels' CPU ms and
    the rows per node tier."""
    propagate.CLOSED_FORM_RTOL = rtol
    calls = []
    fwd, bwd = nk.meanvar_fwd_serial, nk.meanvar_bwd_serial

    def copy(xs):
        return [x.copy() if isinstance(x, np.ndarray) else x for x in xs]

    def spy_fwd(*x):
        out = fwd(*x)
        calls.append(("f", copy(x)))  # after the call: the tiers are an output
        return out

    def spy_bwd(*x):
        calls.append(("b", copy(x)))
        return bwd(*x)

    nk.meanvar_fwd_serial, nk.meanvar_bwd_serial = spy_fwd, spy_bwd
    fresh = [
        t.detach().clone().requires_grad_(t.dtype.is_floating_point) if torch.is_tensor(t) else t
        for t in args
    ]
    fresh[2].requires_grad_(False)  # the inducing points are not differentiated
    try:
        mean, var = ck.cpu_response_meanvar(*fresh)
        (mean.sin().sum() + var.cos().sum()).backward()
    finally:
        nk.meanvar_fwd_serial, nk.meanvar_bwd_serial = fwd, bwd
        propagate.CLOSED_FORM_RTOL = DEFAULT
    ms = {
        k: sum(cpu_ms(fwd if k == "f" else bwd, c, 10) for kk, c in calls if kk == k) for k in "fb"
    }
    tiers = np.bincount(next(c for k, c in calls if k == "f")[-1].ravel()).tolist()
    return [var.detach()] + [fresh[i].grad for i in (0, 1, 3, 4, 5)], ms, tiers


def fitted(sets: list[str], warm: int, tolerances: list[float]) -> None:
    for name in sets:
        _, layer_args = captured_step(name, warm)
        for layer, args in enumerate(layer_args):
            exact, _, _ = evaluate(args, 0.0)
            for rtol in tolerances:
                outs, ms, tiers = evaluate(args, rtol)
                err = max(rel(p, q) for p, q in zip(outs, exact, strict=True))
                print(f"{name} layer {layer} {tuple(args[0].shape)} rtol {rtol:g}: rows per tier "
                      f"{tiers}, fwd {ms['f']:.2f} + bwd {ms['b']:.2f} ms, max error against "
                      f"quadrature everywhere {err:.1e}", flush=True)  # fmt: skip


def grid(tolerances: list[float]) -> None:
    from test_accuracy import F64, RULE_UNITS, Unit, reference_meanvar, subject_meanvar

    cases = [(mu, v) for mu in (-6.0, -1.1, 0.3, 2.5) for v in (0.0, 1e-8, 1e-3, 0.05, 0.3)]
    columns = [(w, r) for w in ("cpu", "reference") for r in (*tolerances, 0.0)]
    print("| lambda | S | targets | " + " | ".join(f"{w}, {r:g}" for w, r in columns) + " |")
    for ls, s, kind in RULE_UNITS:
        unit, row = Unit.make(ls, s, kind, F64), []
        for which, rtol in columns:
            propagate.CLOSED_FORM_RTOL = rtol
            with backend(which):
                errs = []
                for mu, v in cases:
                    _, ref_var = reference_meanvar(unit, mu, v)
                    _, var = subject_meanvar("newC", unit, mu, v, F64)
                    errs.append(abs(var - ref_var) / ref_var)
            row.append(f"{max(errs):.1e}")
        propagate.CLOSED_FORM_RTOL = DEFAULT
        print(f"| {ls} | {s:g} | {kind} | " + " | ".join(row) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["kin8nm", "boston"])
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--rtol", type=float, nargs="+", default=[1e-8, 1e-6, 1e-5])
    parser.add_argument("--grid", action="store_true", help="the accuracy test's units instead")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pyro.settings.set(module_local_params=True)
    print(f"load {os.getloadavg()}, CLOSED_FORM_RTOL default {DEFAULT:g}")
    if args.grid:
        grid(args.rtol)
    else:
        fitted(args.sets, args.warm, args.rtol)
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
