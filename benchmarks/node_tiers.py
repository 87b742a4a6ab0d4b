"""Node tiers of the narrow regime (``pyro_gpn.moments.quadrature.NODE_TIERS``) against a
3,001-node trapezoidal rule.

For ill-conditioned units (random targets on 14 equidistant points in [-2, 2], lengthscale
``lambda``, target variances ``S`` times U(0.5, 1.5), the Cholesky jitter of the layers' default
1e-6), at each tier's largest ratio ``sqrt(v) / lambda`` and 41 x 3 means in [-2.5, 2.5]: the
fewest nodes of the tier's rule whose output variance is within 1e-8 and 1e-9 relative of the
reference, and the library's own variance (``response_moments`` on the reference and CPU
backends, which choose their tier per row) against the same reference. With ``--broad``: the
library at ratios from 0.05 to 12, both sides of ``NODE_MAX_STD_RATIO``, and a ``GPNLayer`` of
the same units through its own path. The reference is independent of the library's rules: the
mean function ``m(a) = alpha(a)^T beta`` and the conditional variance ``1 - alpha(a)^T C
alpha(a)`` (or ``1 - |L^-1 alpha(a)|^2`` through ``C``'s factor) written out in float64 at
3,001 equally spaced nodes on [-10, 10] standard deviations (a 2,001-node rule on [-9.5, 9.5]
agrees to 1.6e-12 or better from 1.25 to 6; Gauss-Hermite rules of 250 and 300 nodes differ
from each other by up to 8.9e-3 at ``sqrt(v) / lambda = 4``: ``--references``).

    python benchmarks/node_tiers.py            # the tiers (a few seconds)
    python benchmarks/node_tiers.py --broad    # about two minutes
    python benchmarks/node_tiers.py --references
    PYRO_GPN_UCI_DIR=../shared/datasets python benchmarks/node_tiers.py --trained boston kin8nm
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from pyro_gpn.moments.backend import backend, numba_available
from pyro_gpn.moments.cpu_kernels import cpu_virtual_observation_weights
from pyro_gpn.moments.gaussian import Moments
from pyro_gpn.moments.propagate import response_moments
from pyro_gpn.moments.quadrature import NODE_MAX_STD_RATIO, NODE_TIERS, TRAPEZOID_HALF_WIDTH

F64 = torch.float64
UNITS = (
    (0.4, 1e-2),
    (0.6, 1e-6),
    (0.8, 1e-6),
    (1.0, 1e-6),
    (1.2, 1e-6),
    (1.8, 1e-6),
    (1.0, 1e-5),
    (2.5, 1e-6),
)
BROAD_RATIOS = (0.05, 0.4, 1.0, 1.25, 1.26, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 6.05, 8.0, 12.0)


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


def factor(points, ls, svar, jitter: float) -> torch.Tensor:
    """``L = chol(K(V, V) + diag(S + jitter))`` ``[3, R, R]``, written out here."""
    d = points[:, :, None] - points[:, None, :]
    gram = torch.exp(-0.5 * d.square() / ls[:, None, None] ** 2)
    return torch.linalg.cholesky(gram + torch.diag_embed(svar + jitter))


def layer_variance(mu, v, ls, targets, svar) -> torch.Tensor:
    """The output variance (noise-free) of a float64 ``GPNLayer`` of these three units, through
    the layer's own path (``respond``: the fused CPU layer where Numba is installed, with its
    refinement of the rows an explicit ``C`` cannot give)."""
    from pyro_gpn import GPNLayer
    from pyro_gpn.layers.respond import respond

    layer = GPNLayer(1, 3, num_inducing=14, dtype=F64)
    with torch.no_grad():
        layer.response.targets.copy_(targets)
        layer.response.target_variances = svar.clone()
        layer.lengthscales = ls.clone()
        return respond(layer, Moments(mu, var=v), "meanvar", noise=False).var


def activations(ratio: float, ls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """41 x 3 means in [-2.5, 2.5] and the variances of ``sqrt(v) / lambda = ratio``."""
    mu = torch.linspace(-2.5, 2.5, 41, dtype=F64)[:, None] + torch.tensor(
        [0.0, 0.05, 0.11], dtype=F64
    )
    return mu, (ratio * ls) ** 2 * torch.ones(41, 3, dtype=F64)


def rule(nodes: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """A rule for ``E[g(Z)]``, ``Z ~ N(0, 1)``, written out here (not the library's)."""
    if kind == "gauss-hermite":
        z, w = np.polynomial.hermite_e.hermegauss(nodes)
    else:
        z = np.linspace(-TRAPEZOID_HALF_WIDTH, TRAPEZOID_HALF_WIDTH, nodes)
        w = np.exp(-0.5 * z * z)
    return z, w / w.sum()


def reference_rule() -> tuple[np.ndarray, np.ndarray]:
    z = np.linspace(-10.0, 10.0, 3001)
    w = np.exp(-0.5 * z * z)
    return z, w / w.sum()


def quadrature_variance(mu, v, points, ls, beta, kappa, z, w, chol=None) -> torch.Tensor:
    """``Var[f]`` of ``a ~ N(mu, v)`` by the rule ``(z, w)``, ``[S, N]``, one mean at a time:
    the conditional variance ``1 - alpha^T C alpha`` with the explicit ``C = kappa``, or with
    ``chol`` (``L``, ``C = (L L^T)^-1``) as ``1 - |L^-1 alpha|^2`` (accurate to ~eps where the
    explicit ``C`` carries ``eps tr(C)``)."""
    z, w = torch.tensor(z, dtype=F64), torch.tensor(w, dtype=F64)
    out = []
    for i in range(mu.shape[0]):
        a = mu[i, :, None] + v[i].sqrt()[:, None] * z
        alpha = torch.exp(-0.5 * (a[..., None] - points[:, None, :]) ** 2 / ls[:, None, None] ** 2)
        m = (alpha * beta[:, None, :]).sum(-1)
        if chol is None:
            s = 1 - torch.einsum("nqr,nrt,nqt->nq", alpha, kappa, alpha)
        else:
            s = 1 - torch.linalg.solve_triangular(chol, alpha.mT, upper=False).square().sum(-2)
        mean = (w * m).sum(-1)
        out.append((w * s).sum(-1) + (w * (m - mean[..., None]) ** 2).sum(-1))
    return torch.stack(out)


def relative_error(var: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((var - ref).abs() / ref.abs()).max())


def tiers(jitter: float) -> None:
    backends = ["reference"] + (["cpu"] if numba_available() else [])
    print(f"tiers {NODE_TIERS[1:]}; jitter {jitter}; backends {backends}")
    for lengthscale, target_var in UNITS:
        points, ls, _, _, beta, kappa = unit(lengthscale, target_var, jitter)
        print(f"lambda {lengthscale}, S {target_var}: max |beta| {float(beta.abs().max()):.1e}")
        for ratio, tier_nodes, kind in NODE_TIERS[1:]:
            mu, v = activations(ratio, ls)
            ref = quadrature_variance(mu, v, points, ls, beta, kappa, *reference_rule())
            need = []
            for tol in (1e-8, 1e-9):
                found = next(
                    (
                        n
                        for n in range(5, 301, 2)
                        if relative_error(
                            quadrature_variance(mu, v, points, ls, beta, kappa, *rule(n, kind)),
                            ref,
                        )
                        <= tol
                    ),
                    None,
                )
                need.append(str(found) if found else ">300")
            lib = []
            for which in backends:
                with backend(which):
                    out = response_moments(
                        Moments(mu, var=v), points, ls, beta, kappa, None, "meanvar"
                    )
                lib.append(f"{which} {relative_error(out.var, ref):.1e}")
            print(
                f"  sqrt(v)/lambda {ratio}: {kind} {tier_nodes} nodes; needed for 1e-8 / 1e-9: "
                f"{need[0]} / {need[1]}; library's error: {', '.join(lib)}"
            )


def broad(jitter: float) -> None:
    """Both sides of ``NODE_MAX_STD_RATIO``: ``response_moments`` on the reference and CPU
    backends, given the explicit ``C`` (against the reference with that ``C``: the input's own
    rounding is not theirs to mend), and a ``GPNLayer`` of the same units
    (:func:`layer_variance`, against the reference through ``C``'s factor), the largest
    relative error per ratio, over the units and two seeds of targets."""
    backends = ["reference"] + (["cpu"] if numba_available() else [])
    print(f"NODE_MAX_STD_RATIO {NODE_MAX_STD_RATIO}; columns: {backends} and the layer")
    worst = {}
    for seed in (17, 3):
        for lengthscale, target_var in UNITS:
            points, ls, targets, svar, beta, kappa = unit(lengthscale, target_var, jitter, seed)
            row = []
            for ratio in BROAD_RATIOS:
                mu, v = activations(ratio, ls)
                ref = quadrature_variance(mu, v, points, ls, beta, kappa, *reference_rule())
                chol = factor(points, ls, svar, jitter)
                ref_l = quadrature_variance(mu, v, points, ls, beta, None, *reference_rule(), chol)
                errs = []
                with torch.no_grad():
                    for which in backends:
                        with backend(which):
                            out = response_moments(
                                Moments(mu, var=v), points, ls, beta, kappa, None, "meanvar"
                            )
                        errs.append(relative_error(out.var, ref))
                    errs.append(relative_error(layer_variance(mu, v, ls, targets, svar), ref_l))
                worst[ratio] = [max(w, e) for w, e in zip(worst.get(ratio, errs), errs)]
                row.append(f"{ratio}: " + " / ".join(f"{e:.0e}" for e in errs))
            print(f"seed {seed}, lambda {lengthscale}, S {target_var}: " + "; ".join(row))
    print(
        "largest: "
        + "; ".join(f"{r}: " + " / ".join(f"{e:.1e}" for e in es) for r, es in worst.items())
    )


def references(jitter: float) -> None:
    """How far two rules of each kind agree: Gauss-Hermite of 250 and 300 nodes, and the
    trapezoidal rule of 2,001 nodes on [-9.5, 9.5] and 3,001 on [-10, 10] (the reference), the
    largest relative difference of the variance per ratio over :data:`UNITS`."""
    ratios = (1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0)
    worst = {r: [0.0, 0.0] for r in ratios}
    for lengthscale, target_var in UNITS:
        points, ls, _, _, beta, kappa = unit(lengthscale, target_var, jitter)
        for ratio in ratios:
            mu, v = activations(ratio, ls)
            gh = [
                quadrature_variance(mu, v, points, ls, beta, kappa, *rule(n, "gauss-hermite"))
                for n in (250, 300)
            ]
            z = np.linspace(-9.5, 9.5, 2001)
            w = np.exp(-0.5 * z * z)
            coarse = quadrature_variance(mu, v, points, ls, beta, kappa, z, w / w.sum())
            fine = quadrature_variance(mu, v, points, ls, beta, kappa, *reference_rule())
            diffs = (relative_error(gh[0], gh[1]), relative_error(coarse, fine))
            worst[ratio] = [max(a, b) for a, b in zip(worst[ratio], diffs)]
    print("sqrt(v)/lambda: Gauss-Hermite 250 vs 300 / trapezoid 2,001 vs 3,001")
    for ratio, (gh, tr) in worst.items():
        print(f"  {ratio}: {gh:.1e} / {tr:.1e}")


def trained(names: list[str], steps: int = 300) -> None:
    """Where a UCI fit's activations are: ``sqrt(v) / lambda`` of every row of each layer of
    ``VariationalGPN([D, 50, 1])`` (point weights and the default ``q(W)``) after ``steps``
    steps of ``benchmarks/vgpn_step.py``'s fit (predictive objective, Adam 0.05, batches of
    512, split 0), read at the fused layer's entry."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import benchmarks.vgpn_step as vgpn_step
    import pyro_gpn.moments.cpu_layer as cpu_layer

    seen = []
    original = cpu_layer.layer_response

    def spy(kind, mu, v, points, lengthscales, *args, **kwargs):
        if v is not None:
            seen.append((v.detach() / lengthscales.detach().square()).clamp_min(0).sqrt())
        return original(kind, mu, v, points, lengthscales, *args, **kwargs)

    for name in names:
        variants, _ = vgpn_step.steps_of(name, 512, None, "predictive", 0.05)
        for key in ("point", "default"):
            for i in range(steps):
                variants[key](i)
            seen.clear()
            cpu_layer.layer_response = spy
            try:
                variants[key](steps)
            finally:
                cpu_layer.layer_response = original
            for layer, ratio in enumerate(seen):
                r = ratio.flatten()
                print(
                    f"{name} {key} layer {layer}: {r.numel()} rows; past 1.25 "
                    f"{float((r > 1.25).double().mean()):.1%}, past {NODE_MAX_STD_RATIO} "
                    f"{float((r > NODE_MAX_STD_RATIO).double().mean()):.1%}, "
                    f"largest {float(r.max()):.2f}"
                )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jitter", type=float, default=1e-6)
    p.add_argument("--broad", action="store_true", help="both sides of NODE_MAX_STD_RATIO")
    p.add_argument("--trained", nargs="+", metavar="SET", help="UCI fits' activation ratios")
    p.add_argument("--references", action="store_true", help="how far two rules of a kind agree")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.trained:
        trained(a.trained)
    elif a.references:
        references(a.jitter)
    else:
        (broad if a.broad else tiers)(a.jitter)


if __name__ == "__main__":
    main()
