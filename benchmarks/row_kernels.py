"""The Numba row kernels alone (``meanvar_fwd`` / ``meanvar_bwd``), this checkout against the
package at a git revision, in one process: minimum over repeated calls (robust to other jobs on
a shared machine), 50 units, R = 14, lengthscale 0.4, S = 0.316, activations as in
``layer_speed.py``; plus the largest differences of the outputs and gradients.

    OMP_NUM_THREADS=1 python benchmarks/row_kernels.py --baseline 80670e3 --batch 256 1024
"""

from __future__ import annotations

import argparse
import importlib
import os
import time

import numpy as np
import torch
from layer_speed import load_baseline

from pyro_gpn.moments import _numba_params, cpu_kernels


def _kernel(module, name: str):
    return getattr(module, name + "_serial", None) or getattr(module, name)


def setup(S: int, N: int = 50, R: int = 14, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    K = 2 * R - 1
    d = {
        "mu": rng.random((S, N)),
        "v": 0.1 * rng.random((S, N)),
        "V": np.ascontiguousarray(np.tile(np.linspace(-2, 2, R), (N, 1))),
        "lam": np.full(N, 0.4),
        "beta": np.empty((N, R)),
        "P": np.empty((N, K)),
        "PC": np.empty((N, K)),
        "PA": np.empty((N, K)),
        "gm": rng.standard_normal((S, N)),
        "gv": rng.standard_normal((S, N)),
        "noise": np.full(N, 0.01),
    }
    U, Sv = rng.standard_normal((N, R)), np.full((N, R), 0.316)
    _numba_params.params_fwd(
        d["V"], U, Sv, d["lam"], 1e-6, True, d["beta"], np.empty((N, R, R)),
        np.empty((N, R, R)), d["P"], d["PC"], d["PA"],
    )  # fmt: skip
    return d


def steps(module, d: dict, with_var: bool):
    S, N = d["mu"].shape
    R, K = d["V"].shape[1], d["P"].shape[1]
    zs, ws, offs, tr2 = cpu_kernels._tier_rules()
    v = d["v"] if with_var else np.zeros((S, N))
    out = {k: np.empty((S, N)) for k in ("mean", "var", "pre")}
    how = np.zeros((S, N), np.int8)
    scale = cpu_kernels.closed_form_error_scale(R, torch.float64)
    grads: dict[str, np.ndarray] = {}

    def fwd() -> None:
        _kernel(module, "meanvar_fwd")(
            d["mu"], v, d["V"], d["lam"], d["beta"], d["P"], d["PA"], d["PC"], zs, ws, offs,
            tr2, cpu_kernels._ratio2(), scale, cpu_kernels._closed_form_rtol(), d["noise"],
            with_var, out["mean"], out["var"], out["pre"], how,
        )  # fmt: skip

    def bwd() -> None:
        grads.update(
            dmu=np.empty((S, N)), dv=np.empty((S, N)), dl=np.empty(N), db=np.zeros((N, R)),
            dP=np.zeros((N, K)), dPC=np.zeros((N, K)),
        )  # fmt: skip
        _kernel(module, "meanvar_bwd")(
            d["mu"], v, d["V"], d["lam"], d["beta"], d["P"], d["PC"], zs, ws, offs,
            out["mean"], out["pre"], how, d["gm"], d["gv"], with_var, *grads.values(),
        )  # fmt: skip

    fwd()
    bwd()
    return fwd, bwd, out, grads


def best_ms(f, n: int) -> float:
    best = float("inf")
    for _ in range(n):
        start = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - start)
    return 1e3 * best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    import numba

    numba.set_num_threads(1)
    new = cpu_kernels._kernels()[1]
    load_baseline(args.baseline)
    old = importlib.import_module("pyro_gpn_base.moments._numba_kernels")
    print(f"load average {os.getloadavg()}")
    for S in args.batch:
        d = setup(S)
        for label, with_var in (("meanvar", True), ("mean, v = 0", False)):
            fn, bn, on, gn = steps(new, d, with_var)
            fo, bo, oo, go = steps(old, d, with_var)
            keys = ("mean", "var") if with_var else ("mean",)
            err = max(float(np.abs(on[k] - oo[k]).max() / np.abs(oo[k]).max()) for k in keys)
            gerr = max(
                float(np.abs(gn[k] - go[k]).max() / np.abs(go[k]).max())
                for k in gn
                if np.abs(go[k]).max() > 0  # dP, dPC are zero in mean mode
            )
            tf = [(best_ms(fn, args.calls), best_ms(fo, args.calls)) for _ in range(2)]
            tb = [(best_ms(bn, args.calls), best_ms(bo, args.calls)) for _ in range(2)]
            fnew, fold = min(a for a, _ in tf), min(b for _, b in tf)
            bnew, bold = min(a for a, _ in tb), min(b for _, b in tb)
            print(
                f"batch {S} {label}: fwd {fnew:.3f} ms (old {fold:.3f}, {fold / fnew:.2f}x), "
                f"bwd {bnew:.3f} ms (old {bold:.3f}, {bold / bnew:.2f}x); max difference "
                f"outputs {err:.1e}, gradients {gerr:.1e} (relative to the largest entry)",
                flush=True,
            )


if __name__ == "__main__":
    main()
