"""The measurements behind the float64 refinement of ``layers.respond._with_factored_rows``
(``docs/results/accuracy.md``, first section), each a sub-command::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/factored_rows_probe.py ratio
    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 PYRO_GPN_UCI_DIR=../shared/datasets \\
        python benchmarks/factored_rows_probe.py boston
    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/factored_rows_probe.py letter
    OMP_NUM_THREADS=1 python benchmarks/factored_rows_probe.py triton
    OMP_NUM_THREADS=1 python benchmarks/factored_rows_probe.py nodes

* ``ratio``: the fused kernel's variance error against quadrature over
  ``eps ||L^-1||_F^2 / Var`` (the scale ``EXPLICIT_C_ERROR_FACTOR`` multiplies), worst case per
  lengthscale and posterior scale (``benchmarks/whitened_quadrature.py``'s unit and grid);
* ``boston``: a point-weights Bayesian GPN after 300 steps of its fit (``vgpn_step.py``'s
  ``point`` variant): how many rows the rule refines with the factor 1 and 4, how far the
  closed form was from the refined value on the rows the factor 4 adds, and the step time with
  each factor, side by side in one process;
* ``letter``: the Letter network's step (``GPNNet([16, 30, 15, 26])``) with the rule and with
  it switched off, side by side in one process;
* ``triton``: the float64 Triton path (``backend("triton")``, under ``TRITON_INTERPRET=1``
  without a GPU) on the quadrature cases of ``tests/layers/test_respond.py``;
* ``nodes``: Gauss-Hermite with the factors at 64-256 nodes on the wide grid of
  ``test_respond._wide_grid_unit`` for activations broader than ``1.25 lambda``.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from pyro_gpn.layers import respond as respond_module  # noqa: E402
from pyro_gpn.moments import Moments, quadrature  # noqa: E402
from pyro_gpn.moments.backend import backend  # noqa: E402

F64 = torch.float64
EPS = float(torch.finfo(F64).eps)


def ratio() -> None:
    from benchmarks.whitened_quadrature import MUS, VARS, fused, unit
    from tests.moments.test_cpu_layer import _quadrature_moments

    for lengthscale in (0.4, 1.0, 2.0, 4.0):
        for scale in (1e-3, 1e-2, 0.3, 1.0):
            chol, m, T = unit(lengthscale, scale)
            trace = float(np.square(np.linalg.inv(chol)).sum())
            worst_error = worst_ratio = 0.0
            for mu in MUS:
                for v in VARS:
                    _, want = _quadrature_moments(mu, v, lengthscale, chol, m, T)
                    error = abs(fused(mu, v, lengthscale, m, T)[1] - want)
                    worst_error = max(worst_error, error / want)
                    worst_ratio = max(worst_ratio, error / (EPS * trace))
            print(
                f"lengthscale {lengthscale}, scale {scale:g}: worst relative error "
                f"{worst_error:.1e}, worst error / (eps ||L^-1||_F^2) {worst_ratio:.2f}"
            )


def _alternate(variants: dict, block: int, repeats: int) -> dict:
    """Median process-CPU ms per step of each variant, run in alternating blocks."""
    times: dict = {name: [] for name in variants}
    for _ in range(repeats):
        for name, (setup, step) in variants.items():
            setup()
            start = time.process_time()
            for _ in range(block):
                step()
            times[name].append((time.process_time() - start) / block * 1e3)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def boston() -> None:
    import benchmarks.vgpn_step as vgpn_step

    default = quadrature.EXPLICIT_C_ERROR_FACTOR
    steps, _ = vgpn_step.steps_of("boston", 512, None, "predictive", 0.05)
    step = steps["point"]
    for i in range(300):
        step(i)
    counter = iter(range(300, 10**6))
    seen: dict = {}
    original = respond_module._with_factored_rows

    def watch(layer, activations, outputs, mode, noise, rows=None, inverse_trace=None):
        new = original(layer, activations, outputs, mode, noise, rows, inverse_trace)
        if layer.out_features > 1 and "done" not in seen:
            seen["done"] = True
            seen["total"] = outputs.mean.numel()
            seen["rows"] = 0 if rows is None else int(rows.sum())
            seen["change"] = ((new.variance - outputs.variance).abs() / new.variance).detach()
            seen["rowmask"] = rows
        return new

    respond_module._with_factored_rows = watch
    try:
        for factor in (1.0, 1.25, 1.5, 4.0):
            quadrature.EXPLICIT_C_ERROR_FACTOR = factor
            seen.clear()
            step(next(counter))
            print(f"factor {factor:g}: {seen['rows']} of {seen['total']} hidden rows refined")
            if factor == 4.0 and seen["rows"]:
                change = seen["change"][seen["rowmask"]]
                print(
                    f"  their closed form was off the refined value by at most {change.max():.1e}"
                )
    finally:
        respond_module._with_factored_rows = original
        quadrature.EXPLICIT_C_ERROR_FACTOR = default

    def with_factor(factor):
        def setup():
            quadrature.EXPLICIT_C_ERROR_FACTOR = factor

        return setup, lambda: step(next(counter))

    medians = _alternate({"1": with_factor(default), "4": with_factor(4.0)}, 5, 5)
    quadrature.EXPLICIT_C_ERROR_FACTOR = default
    print(
        f"step (process CPU, median of 5 blocks of 5): factor {default:g} {medians['1']:.2f} ms, "
        f"factor 4 {medians['4']:.2f} ms ({medians['4'] / medians['1']:.2f}x)"
    )


def letter() -> None:
    from pyro_gpn import GPNNet

    torch.manual_seed(0)
    net = GPNNet([16, 30, 15, 26], targets_init="identity")
    x, y = torch.randn(128, 16), torch.randint(0, 26, (128,))

    def step():
        (net.loss(x, y) + net.penalty()).backward()

    for _ in range(20):
        step()
    original = respond_module._with_factored_rows

    def on():
        respond_module._with_factored_rows = original

    def off():
        respond_module._with_factored_rows = lambda layer, activations, outputs, *a, **k: outputs

    medians = _alternate({"rule": (on, step), "no rule": (off, step)}, 100, 5)
    respond_module._with_factored_rows = original
    print(
        f"Letter step (process CPU, median of 5 blocks of 100): with the rule "
        f"{medians['rule']:.2f} ms, without {medians['no rule']:.2f} ms"
    )


def triton() -> None:
    from pyro_gpn.layers.respond import respond
    from tests.layers.test_respond import CASES, MUS, VARS, _activations, _unit
    from tests.moments.test_cpu_layer import _quadrature_moments

    device = "cuda" if torch.cuda.is_available() else "cpu"
    for response, lengthscale, spread in CASES:
        layer, (chol, m, T) = _unit(response, lengthscale, spread)
        acts = _activations()
        layer = layer.to(device)
        acts = Moments(acts.mean.to(device), var=acts.variance.to(device))
        with backend("triton"):
            var = respond(layer, acts, "meanvar", noise=False).var.detach().cpu()
        worst = 0.0
        for i, (mu, v) in enumerate((mu, v) for mu in MUS for v in VARS):
            _, want = _quadrature_moments(mu, v, lengthscale, chol, m, T)
            worst = max(worst, abs(float(var[i, 0]) - want) / want)
        print(f"triton ({device}), {response}, lengthscale {lengthscale}, {spread:g}: {worst:.1e}")


def nodes() -> None:
    from pyro_gpn.moments.quadrature import _node_values
    from tests.layers.test_respond import _wide_grid_unit, _wide_grid_variance

    for lengthscale in (0.8, 1.0, 1.5):
        layer = _wide_grid_unit(lengthscale)
        points = layer.inducing_points.detach()
        gram = torch.exp(-0.5 * (points[0, :, None] - points[0]) ** 2 / lengthscale**2)
        chol = torch.linalg.cholesky(gram + (1e-6 + layer.response.jitter) * torch.eye(61))
        for std_ratio in (2.0, 3.0):
            v = (std_ratio * lengthscale) ** 2
            want = _wide_grid_variance(layer, v)
            errors = []
            for count in (64, 128, 256):
                got = _node_values(
                    torch.zeros(1, 1, dtype=F64), torch.full((1, 1), v, dtype=F64), points,
                    torch.tensor([lengthscale], dtype=F64), torch.zeros(1, 61, dtype=F64),
                    None, chol.unsqueeze(0), None, count,
                ).variance  # fmt: skip
                errors.append(abs(float(got) - want) / want)
            print(
                f"lambda {lengthscale}, sqrt(v) = {std_ratio} lambda: Gauss-Hermite with the "
                "factors, 64 / 128 / 256 nodes: " + " / ".join(f"{e:.1e}" for e in errors)
            )


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    commands = {"ratio": ratio, "boston": boston, "letter": letter, "triton": triton}
    commands["nodes"] = nodes
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: python {sys.argv[0]} {{{','.join(commands)}}}")
    commands[sys.argv[1]]()
