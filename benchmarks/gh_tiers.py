"""Gauss-Hermite node tiers (``pyro_gpn.moments.quadrature.GH_TIERS``) against a 300-node rule.

For ill-conditioned units (random targets on 14 equidistant points in [-2, 2], lengthscale
``lambda``, target variances ``S`` times U(0.5, 1.5), the Cholesky jitter of the layers' default
1e-6), at each tier's largest ratio ``sqrt(v) / lambda`` and 41 x 3 means in [-2.5, 2.5]: the
fewest nodes whose output variance is within 1e-6 and 1e-7 relative of the 300-node rule's, and
the library's own variance (``response_moments`` on the reference and CPU backends, which choose
their tier per row) against the same rule. The 300-node rule is independent of the tiers: the
mean function ``m(a) = alpha(a)^T beta`` and the conditional variance ``1 - alpha(a)^T C alpha(a)``
written out at the nodes in float64.

    python benchmarks/gh_tiers.py            # a few seconds
    python benchmarks/gh_tiers.py --broad    # past the narrow regime: the fused parametric
                                             # layer node (cpu_layer_response) at 1.2 to 2
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from pyro_gpn.moments.backend import backend, numba_available
from pyro_gpn.moments.cpu_kernels import cpu_virtual_observation_weights
from pyro_gpn.moments.gaussian import Moments
from pyro_gpn.moments.propagate import response_moments
from pyro_gpn.moments.quadrature import GH_TIERS

F64 = torch.float64
CANDIDATES = (8, 12, 16, 20, 24, 32, 40, 48, 56, 64, 80, 96, 128)
UNITS = ((0.4, 1e-2), (0.6, 1e-6), (1.0, 1e-6), (1.8, 1e-6))


def unit(lengthscale: float, target_var: float, jitter: float, seed: int = 17):
    """One layer of three units: points ``[3, R]``, lengthscales ``[3]``, targets and target
    variances ``[3, R]``, and their ``beta`` and ``C``."""
    g = torch.Generator().manual_seed(seed)
    points = torch.linspace(-2, 2, 14, dtype=F64).expand(3, -1).clone()
    targets = torch.randn(3, 14, generator=g, dtype=F64)
    svar = target_var * (0.5 + torch.rand(3, 14, generator=g, dtype=F64))
    ls = lengthscale * (0.8 + 0.4 * torch.rand(3, generator=g, dtype=F64))
    kappa, beta = cpu_virtual_observation_weights(points, targets, svar, ls, jitter)
    return points, ls, targets, svar, beta.detach(), kappa.detach()


def activations(ratio: float, ls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """41 x 3 means in [-2.5, 2.5] and the variances of ``sqrt(v) / lambda = ratio``."""
    mu = torch.linspace(-2.5, 2.5, 41, dtype=F64)[:, None] + torch.tensor(
        [0.0, 0.05, 0.11], dtype=F64
    )
    return mu, (ratio * ls) ** 2 * torch.ones(41, 3, dtype=F64)


def quadrature_variance(mu, v, points, ls, beta, kappa, nodes: int) -> torch.Tensor:
    """``Var[f]`` of ``a ~ N(mu, v)`` by ``nodes`` Gauss-Hermite nodes, ``[S, N]``."""
    z, w = np.polynomial.hermite_e.hermegauss(nodes)
    z, w = torch.tensor(z, dtype=F64), torch.tensor(w / w.sum(), dtype=F64)
    a = mu[..., None] + v.sqrt()[..., None] * z
    alpha = torch.exp(-0.5 * (a[..., None] - points[:, None, :]) ** 2 / ls[:, None, None] ** 2)
    m = (alpha * beta[:, None, :]).sum(-1)
    s = 1 - torch.einsum("snqr,nrt,snqt->snq", alpha, kappa, alpha)
    mean = (w * m).sum(-1)
    return (w * s).sum(-1) + (w * (m - mean[..., None]) ** 2).sum(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jitter", type=float, default=1e-6)
    p.add_argument("--broad", action="store_true", help="the broad regime, through the layer node")
    a = p.parse_args()
    if a.broad:
        broad(a.jitter)
        return
    backends = ["reference"] + (["cpu"] if numba_available() else [])
    print(f"tiers {GH_TIERS[1:]}; jitter {a.jitter}; backends {backends}")
    for lengthscale, target_var in UNITS:
        points, ls, _, _, beta, kappa = unit(lengthscale, target_var, a.jitter)
        print(f"lambda {lengthscale}, S {target_var}: max |beta| {float(beta.abs().max()):.1e}")
        for ratio, tier_nodes in GH_TIERS[1:]:
            mu, v = activations(ratio, ls)
            ref = quadrature_variance(mu, v, points, ls, beta, kappa, 300)

            def err(var, ref=ref):
                return float(((var - ref).abs() / ref.abs()).max())

            need = []
            for tol in (1e-6, 1e-7):
                ok = [
                    n
                    for n in CANDIDATES
                    if err(quadrature_variance(mu, v, points, ls, beta, kappa, n)) <= tol
                ]
                need.append(str(ok[0]) if ok else f">{CANDIDATES[-1]}")
            lib = []
            for which in backends:
                with backend(which):
                    out = response_moments(
                        Moments(mu, var=v), points, ls, beta, kappa, None, "meanvar"
                    )
                lib.append(f"{which} {err(out.var):.1e}")
            print(
                f"  sqrt(v)/lambda {ratio}: tier {tier_nodes} nodes; needed for 1e-6 / 1e-7: "
                f"{need[0]} / {need[1]}; library's error: {', '.join(lib)}"
            )


def broad(jitter: float) -> None:
    """Past ``GH_MAX_STD_RATIO`` (the closed form, no node rule): the fused parametric layer's
    autograd node (``cpu_layer_response``: weights, rows and the layer's refinement) against the
    300-node rule on the same units."""
    from pyro_gpn.moments.cpu_layer import cpu_layer_response

    for lengthscale, target_var in UNITS:
        points, ls, targets, svar, beta, kappa = unit(lengthscale, target_var, jitter)
        row = []
        for ratio in (1.2, 1.26, 1.3, 1.5, 2.0):
            mu, v = activations(ratio, ls)
            with torch.no_grad():
                ref = quadrature_variance(mu, v, points, ls, beta, kappa, 300)
                _, var = cpu_layer_response(mu, v, points[:1], ls, targets, svar, None, jitter)
            row.append(f"{ratio}: {float(((var - ref).abs() / ref.abs()).max()):.1e}")
        print(f"lambda {lengthscale}, S {target_var}: " + "; ".join(row))


if __name__ == "__main__":
    main()
