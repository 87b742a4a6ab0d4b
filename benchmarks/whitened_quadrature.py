"""The whitened variational layer's output moments against adaptive quadrature (scipy).

A whitened variational unit (``q(z) = N(m, T T^T)``, ``U = L z``, ``L L^T = K(V, V) + 1e-6 I``,
14 points on ``[-2, 2]``) at lengthscales 0.4, 2 and 4 and posterior scales 1e-3, 0.3 and 1;
activation means -6 to 2.5 and variances 0 to 4. Prints, per unit, the worst relative variance
error and the worst mean error in units of the output's standard deviation of the fused CPU
layer (``cpu_variational_layer_response``); then, for the nearly collapsed posterior at long
lengthscales, the same per row for the paths with an explicit ``Khat`` (reference and CPU
kernels) and the Cholesky-factored variance (``variance_cholesky``, ``variance_inner``); last,
the layers themselves (``layers.respond.respond``, fused CPU and reference path, with the rows
the explicit ``Khat`` cannot give recomputed from its factors: ``_with_factored_rows``). The
quadrature is the test's (``tests/moments/test_cpu_layer.py::_quadrature_moments``). Usage::

    OMP_NUM_THREADS=1 python benchmarks/whitened_quadrature.py
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pyro_gpn.moments import Moments, response_moments  # noqa: E402
from pyro_gpn.moments.backend import backend  # noqa: E402
from pyro_gpn.moments.cpu_layer import cpu_variational_layer_response  # noqa: E402
from tests.moments.test_cpu_layer import _quadrature_moments  # noqa: E402

F64 = torch.float64
R = 14
V = np.linspace(-2, 2, R)
MUS = (-6.0, -1.1, 0.3, 2.5)
VARS = (0.0, 1e-8, 1e-3, 0.05, 0.3, 4.0)


def unit(lengthscale: float, scale: float, seed: int = 0):
    g = np.random.default_rng(seed)
    gram = np.exp(-0.5 * (V[:, None] - V) ** 2 / lengthscale**2)
    chol = np.linalg.cholesky(gram + 1e-6 * np.eye(R))
    m = g.standard_normal(R)
    T = np.tril(0.3 * scale * g.standard_normal((R, R)), -1) + np.diag(scale * (0.5 + g.random(R)))
    return chol, m, T


def fused(mu, v, lengthscale, m, T):
    mean, var = cpu_variational_layer_response(
        torch.tensor([[mu]], dtype=F64), torch.tensor([[v]], dtype=F64),
        torch.tensor(V).reshape(1, -1), torch.tensor([lengthscale], dtype=F64),
        torch.tensor(m).reshape(1, -1), torch.tensor(T).unsqueeze(0), None, 1e-6, True,
    )  # fmt: skip
    return float(mean), float(var)


def paths(mu, v, lengthscale, chol, m, T):
    """Relative variance errors' inputs: the explicit-``Khat`` paths and the factored one."""
    L, loc, scale = (torch.tensor(a).unsqueeze(0) for a in (chol, m, T))
    beta = torch.linalg.solve_triangular(L.mT, loc.unsqueeze(-1), upper=True).squeeze(-1)
    root = torch.linalg.solve_triangular(L.mT, scale, upper=True)
    khat = torch.cholesky_inverse(L) - root @ root.mT
    khat = 0.5 * (khat + khat.mT)
    inner = torch.eye(R, dtype=F64) - scale @ scale.mT
    points, lam = torch.tensor(V).reshape(1, -1), torch.tensor([lengthscale], dtype=F64)
    moments = Moments(torch.tensor([[mu]], dtype=F64), var=torch.tensor([[v]], dtype=F64))
    out = {}
    for name, options, kind in (
        ("reference, explicit Khat", {}, "reference"),
        ("CPU kernels, explicit Khat", {}, "cpu"),
        ("reference, factored", {"variance_cholesky": L, "variance_inner": inner}, "reference"),
    ):
        with backend(kind):
            out[name] = float(
                response_moments(moments, points, lam, beta, khat, None, "meanvar", **options).var
            )
    return out


def main() -> None:
    warnings.simplefilter("ignore")
    for lengthscale in (0.4, 2.0, 4.0):
        for scale in (1e-3, 0.3, 1.0):
            chol, m, T = unit(lengthscale, scale)
            worst_var = worst_mean = 0.0
            smallest = math.inf
            for mu in MUS:
                for v in VARS:
                    want_mean, want_var = _quadrature_moments(mu, v, lengthscale, chol, m, T)
                    got_mean, got_var = fused(mu, v, lengthscale, m, T)
                    worst_var = max(worst_var, abs(got_var - want_var) / want_var)
                    worst_mean = max(worst_mean, abs(got_mean - want_mean) / math.sqrt(want_var))
                    smallest = min(smallest, want_var)
            print(
                f"lengthscale {lengthscale}, scale {scale:g}: fused variance {worst_var:.1e} "
                f"relative, mean {worst_mean:.1e} sd, smallest variance {smallest:.1e}"
            )
    for lengthscale in (2.0, 4.0):
        chol, m, T = unit(lengthscale, 1e-3)
        worst: dict[str, float] = {}
        for mu in MUS:
            for v in VARS:
                _, want_var = _quadrature_moments(mu, v, lengthscale, chol, m, T)
                for name, got in paths(mu, v, lengthscale, chol, m, T).items():
                    worst[name] = max(worst.get(name, 0.0), abs(got - want_var) / want_var)
        print(f"lengthscale {lengthscale}, scale 1e-3, worst variance error per path:", {
            k: f"{e:.1e}" for k, e in worst.items()})  # fmt: skip


def layers() -> None:
    """The worst relative variance error of the float64 layers (``respond``) per case."""
    from pyro_gpn.layers.respond import respond
    from tests.layers.test_respond import MUS as LAYER_MUS
    from tests.layers.test_respond import VARS as LAYER_VARS
    from tests.layers.test_respond import _activations, _unit

    for response, spreads in (("whitened", (1e-3, 0.3, 1.0)), ("observations", (1e-6, 1e-4))):
        for lengthscale in (0.4, 1.0, 2.0, 4.0):
            for spread in spreads:
                layer, (chol, m, T) = _unit(response, lengthscale, spread)
                worst = {}
                for kind in ("cpu", "reference"):
                    with backend(kind):
                        var = respond(layer, _activations(), "meanvar", noise=False).var
                    cases = ((mu, v) for mu in LAYER_MUS for v in LAYER_VARS)
                    for i, (mu, v) in enumerate(cases):
                        _, want = _quadrature_moments(mu, v, lengthscale, chol, m, T)
                        error = abs(float(var[i, 0]) - want) / want
                        worst[kind] = max(worst.get(kind, 0.0), error)
                print(
                    f"layer, {response}, lengthscale {lengthscale}, spread {spread:g}: worst "
                    f"variance error fused {worst['cpu']:.1e}, reference {worst['reference']:.1e}"
                )


def wide_grid() -> None:
    """A unit on 61 points in ``[-15, 15]``, targets 0, ``S = 1e-6`` (variance ~1e-6): the
    float64 layer (``respond``, fused and reference) against adaptive quadrature, broad and
    narrow activations (``docs/results/accuracy.md``: the gap that remains)."""
    from pyro_gpn.layers.respond import respond
    from tests.layers.test_respond import _wide_grid_unit, _wide_grid_variance

    for lengthscale, v in ((1.0, 9.0), (0.8, 9.0), (1.5, 16.0), (1.0, 1.0), (1.5, 0.5)):
        layer = _wide_grid_unit(lengthscale)
        want = _wide_grid_variance(layer, v)
        sd = math.sqrt(v)
        acts = Moments(torch.zeros(1, 1, dtype=F64), var=torch.full((1, 1), v, dtype=F64))
        errors = []
        for kind in ("cpu", "reference"):
            with backend(kind):
                got = float(respond(layer, acts, "meanvar", noise=False).var)
            errors.append(abs(got - want) / want)
        print(
            f"wide grid, lambda {lengthscale}, v {v} (sd / lambda {sd / lengthscale:.2f}): "
            f"variance {want:.2e}, error fused {errors[0]:.1e}, reference {errors[1]:.1e}"
        )


if __name__ == "__main__":
    main()
    layers()
    wide_grid()
