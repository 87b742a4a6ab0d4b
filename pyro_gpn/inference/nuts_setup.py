"""Where :func:`pyro_gpn.inference.mcmc.run_nuts` starts its chains and which mass matrix it
uses: MAP fits from independent random starts, and the Laplace (inverse Hessian) metric."""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from pyro_gpn.models.nonparametric import NonParametricGPN

__all__ = [
    "fit_initial_params",
    "hessian_diagonal_inverse_mass",
    "laplace_inverse_mass",
    "noise_prior_medians",
    "potential_hessians",
]


def noise_prior_medians(model: NonParametricGPN, x_train: Tensor) -> dict[str, Tensor]:
    """The prior median of every noise site, in the unconstrained space (``{site: [N_l]}``).

    For the default ``LogNormal(log 0.1, 1)`` that is ``log 0.1`` per unit. Read from a trace of
    the model (each noise site's prior: ``icdf(0.5)`` where implemented, else the median of 1001
    draws taken under a forked RNG), so it follows whatever ``noise_prior`` the model has.
    """
    from pyro import poutine
    from torch.distributions import biject_to

    trace = poutine.trace(model.model).get_trace(x_train[:2], None, None)
    out = {}
    for name in model.parameter_sites():
        if not name.startswith("sigma"):
            continue
        fn = trace.nodes[name]["fn"]
        base = fn
        while hasattr(base, "base_dist") and not hasattr(base, "transforms"):
            base = base.base_dist  # Independent / expanded wrappers
        try:
            median = base.icdf(torch.full(base.batch_shape, 0.5, dtype=model.dtype))
        except (NotImplementedError, AttributeError):
            with torch.random.fork_rng():
                torch.manual_seed(0)
                median = fn.sample((1001,)).median(0).values
        median = median.expand(trace.nodes[name]["value"].shape).to(model.dtype)
        out[name] = biject_to(fn.support).inv(median).detach()
    return out


def fit_initial_params(
    model: NonParametricGPN,
    x_train: Tensor,
    y_train: Tensor,
    x_test: Tensor | None = None,
    *,
    num_chains: int,
    steps: int = 500,
    lr: float = 0.05,
    radius: float = 2.0,
    seed: int = 0,
    jit_compile: bool = True,
    hold: dict[str, Tensor] | None = None,
    best: bool = False,
    spread: float = 0.1,
) -> dict[str, Tensor]:
    """Starting points for the chains: one maximum-a-posteriori fit of the model per chain.

    Every chain's start is drawn uniformly in ``(-radius, radius)`` in the unconstrained space
    (as ``init_to_uniform``, independently per chain and seeded by ``seed``) and then moved by
    ``steps`` Adam steps on the potential energy (the negative unnormalised log posterior of the
    training rows; for :class:`~pyro_gpn.models.nonparametric.NonParametricGPN` the last layer is
    integrated out in closed form, so this is a type-II maximum-likelihood fit of the last layer
    and a MAP fit of everything below). The chains thus start near high-density regions but
    apart -- in different symmetric copies of the posterior (unit permutations, sign flips) and,
    where the fits disagree, in different local modes, which r-hat then reports.

    With ``best=True`` the ``num_chains`` fits are made the same way, and every chain starts at
    the one of lowest potential energy (the held sites at their held values, so the fits
    compare), each moved by its own uniform jitter in ``(-spread, spread)`` on every free
    coordinate: all chains explore the region the best fit found. The jitter is a fixed width in
    the unconstrained space, not scaled to the posterior, so the starts are not over-dispersed
    in every direction, and r-hat then says whether the chains agree about that region, not
    whether the posterior has others (``docs/results/nuts.md``, session of 2026-11-28: on the
    synthetic ``[1, 4, 1]`` network independent fits start the chains at different noise levels,
    which they do not leave within 500 draws; started together, they agree).

    Args:
        model, x_train, y_train, x_test: as for :func:`run_nuts` (``x_test`` only when the test
            rows are sampled by the chain, ``joint=True``).
        num_chains: number of independent fits.
        steps, lr: Adam steps and learning rate of each fit.
        radius: half-width of the uniform starts.
        seed: seeds the starts (and, with ``best=True``, the jitter).
        jit_compile: JIT-compile the potential energy.
        hold: ``{site: unconstrained value}`` held fixed during the fits (not optimised), e.g.
            :func:`noise_prior_medians`: a fit with the noise held at its prior median cannot
            overfit by shrinking the noise (``docs/results/nuts.md``).
        best: start every chain from the best of the fits (above) instead of its own.
        spread: half-width of the uniform jitter of each chain's start with ``best=True``
            (unconstrained units; the held sites are not moved).

    Raises:
        FloatingPointError: with ``best=True``, no fit reached a finite potential energy.

    Returns:
        ``{site: [num_chains, *site_shape]}`` in the unconstrained space, for ``MCMC``'s
        ``initial_params``.
    """
    from pyro.infer.mcmc.util import initialize_model

    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    if not isinstance(best, bool):
        raise ValueError(f"best must be True or False, got {best!r}")
    if (
        isinstance(spread, bool)
        or not isinstance(spread, (int, float))
        or not (math.isfinite(spread) and spread >= 0)
    ):
        raise ValueError(f"spread must be a non-negative finite number, got {spread!r}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=".*torch.jit.trace. is deprecated")
        init, potential_fn, _, _ = initialize_model(
            model.model,
            (x_train, y_train, x_test),
            jit_compile=jit_compile,
            skip_jit_warnings=True,
        )
    hold = dict(hold or {})
    unknown = sorted(set(hold) - set(init))
    if unknown:
        raise ValueError(f"hold names sites the model does not sample: {unknown}")
    gen = torch.Generator().manual_seed(seed)
    starts: dict[str, list[Tensor]] = {k: [] for k in init}
    energies: list[float] = []
    for _ in range(num_chains):
        params = {
            k: (torch.rand(v.shape, generator=gen, dtype=v.dtype) * 2 - 1) * radius
            for k, v in init.items()
        }
        params = {
            k: hold[k].to(v.dtype).expand(v.shape).clone() if k in hold else v.requires_grad_()
            for k, v in params.items()
        }
        fitted = {k: v.detach().clone() for k, v in params.items()}
        fitted_energy = math.inf
        free = [v for k, v in params.items() if k not in hold]
        optim = torch.optim.Adam(free, lr=lr) if free else None
        for _ in range(steps if optim is not None else 0):
            optim.zero_grad()
            energy = potential_fn(params)
            if not torch.isfinite(energy):
                break
            if float(energy.detach()) < fitted_energy:
                fitted_energy = float(energy.detach())
                fitted = {k: v.detach().clone() for k, v in params.items()}
            energy.backward()
            optim.step()
        for k, v in fitted.items():
            starts[k].append(v)
        if best and not math.isfinite(fitted_energy):  # no step taken: the start's energy
            with torch.no_grad():
                fitted_energy = float(potential_fn(fitted))
        energies.append(fitted_energy if math.isfinite(fitted_energy) else math.inf)
    out = {k: torch.stack(v) for k, v in starts.items()}
    if not best:
        return out
    pick = min(range(num_chains), key=energies.__getitem__)
    if not math.isfinite(energies[pick]):
        raise FloatingPointError(
            "fit_initial_params(best=True): no fit reached a finite potential energy"
        )
    return {
        k: v
        if k in hold
        else v[pick] + (torch.rand(v.shape, generator=gen, dtype=v.dtype) * 2 - 1) * spread
        for k, v in out.items()
    }


def laplace_inverse_mass(
    model: NonParametricGPN,
    x_train: Tensor,
    y_train: Tensor,
    x_test: Tensor | None,
    params: dict[str, Tensor],
    *,
    min_curvature: float = 1.0,
) -> list[Tensor]:
    """Inverse Hessians of the potential energy at each chain's start: a dense metric for NUTS.

    The Laplace approximation's covariance at the fitted point, in the unconstrained space and
    Pyro's block order (sites sorted by name, each flattened). It captures what a diagonal
    metric cannot and what a dense one adapted from a few hundred warm-up draws estimates
    badly in hundreds of dimensions: the hidden outputs' whitened coordinates are constrained
    by the data only along a few rotated directions (the smooth eigenvectors of the layer's
    kernel matrix, scale ``~ noise / sqrt(S)``) and by the prior (scale 1) along the rest.
    Eigenvalues of the Hessian below ``min_curvature`` (flat or negatively curved directions,
    where the start is not a strict maximum) are raised to it. The default 1 is the curvature of
    the standard-normal priors of whitened sites and log noise scales: no direction is given a
    scale wider than the prior's (with 0.01, the earlier default, the flat directions got scale
    10 and NUTS adapted steps of 0.004 on kin8nm, ``docs/results/nuts.md``).

    Args:
        params: ``{site: [num_chains, *shape]}`` unconstrained starts (from
            :func:`fit_initial_params`).

    Returns:
        one ``[D, D]`` inverse mass matrix per chain.
    """
    out = []
    for hess in potential_hessians(model, x_train, y_train, x_test, params):
        if not torch.isfinite(hess).all():  # a non-finite start: eigh raises on all-NaN
            out.append(torch.eye(hess.shape[-1], dtype=hess.dtype))
            continue
        evals, evecs = torch.linalg.eigh(hess)
        if not torch.isfinite(evals).all():
            out.append(torch.eye(hess.shape[-1], dtype=hess.dtype))
            continue
        evals = evals.clamp_min(min_curvature)
        out.append((evecs / evals) @ evecs.mT)
    return out


def hessian_diagonal_inverse_mass(
    model: NonParametricGPN,
    x_train: Tensor,
    y_train: Tensor,
    x_test: Tensor | None,
    params: dict[str, Tensor],
    *,
    min_curvature: float = 1.0,
) -> list[dict[str, Tensor]]:
    """A diagonal starting metric per chain: ``1 / max(H_ii, min_curvature)`` from the Hessian of
    the potential at the chain's start, per site (unconstrained, flattened).

    Pyro's warm-up starts from the identity metric and keeps it for its first 75 iterations. Where
    the data pin some coordinates far more tightly than the prior (first-layer weights on
    kin8nm, 1,000 rows: conditional scale ~0.005 against the others' 0.03-1,
    ``docs/results/nuts.md``) the identity forces steps of the tightest scale and trees of
    depth 9-10 for all of them; scaling every coordinate by its conditional posterior scale
    removes that, and the windows adapt from there. ``min_curvature`` (the standard-normal
    prior's curvature) caps every scale at 1 where the start is flat or not a maximum.

    Returns:
        one ``{site: [numel]}`` dict per chain.
    """
    names = sorted(params)
    sizes = [params[k][0].numel() for k in names]
    out = []
    for hess in potential_hessians(model, x_train, y_train, x_test, params):
        diag = 1.0 / hess.diagonal().clamp_min(min_curvature)
        out.append({k: v for k, v in zip(names, diag.split(sizes), strict=True)})
    return out


def potential_hessians(
    model: NonParametricGPN,
    x_train: Tensor,
    y_train: Tensor,
    x_test: Tensor | None,
    params: dict[str, Tensor],
) -> list[Tensor]:
    """Hessians ``[D, D]`` of the potential energy at each chain's unconstrained start
    (``params``: ``{site: [num_chains, *shape]}``), in Pyro's block order (sites sorted by name,
    each flattened). Their largest eigenvalue bounds NUTS's first step sizes: a leapfrog step
    of size ``eps`` is unstable along a direction of curvature above ``(2 / eps)^2`` (unit
    metric)."""
    from pyro.infer.mcmc.util import initialize_model

    _, potential_fn, _, _ = initialize_model(model.model, (x_train, y_train, x_test))
    names = sorted(params)
    shapes = [params[k].shape[1:] for k in names]
    sizes = [math.prod(s) for s in shapes]
    out = []
    for c in range(next(iter(params.values())).shape[0]):
        flat = torch.cat([params[k][c].reshape(-1) for k in names]).detach()

        def energy(v: Tensor) -> Tensor:
            parts = torch.split(v, sizes)
            return potential_fn(
                {k: p.reshape(s) for k, p, s in zip(names, parts, shapes, strict=True)}
            )

        hess = torch.autograd.functional.hessian(energy, flat)
        out.append(0.5 * (hess + hess.mT))
    return out
