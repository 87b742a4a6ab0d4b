r"""Fit one regression data set with every inference route and compare them.

:func:`compare_routes` trains, on the same :class:`~pyro_gpn.data.RegressionData` and with the
same layer widths and seed, one model per route of the paper's ``fig:gpn_overview``:

==================  =========================================================================
route               what runs
==================  =========================================================================
``nuts``            :class:`~pyro_gpn.models.NonParametricGPN` sampled by
                    :func:`~pyro_gpn.inference.run_nuts` (exact inference; skipped, with the
                    reason, when train + prediction rows exceed ``budget.nuts_max_rows``;
                    ``budget.nuts_subsample`` draws a random subset of the training rows)
``parametric-svi``  :class:`~pyro_gpn.models.ParametricGPN` (sampled, reparameterised outputs,
                    the paper's expected log-likelihood) trained by
                    :func:`~pyro_gpn.inference.fit_svi` with ``Trace_ELBO``
``clt``             :class:`~pyro_gpn.GPNNet` (central-limit, mean and variance propagated)
                    by maximum likelihood with :class:`~pyro_gpn.inference.Trainer`
                    (plateau schedule, early stopping on the validation split)
``vgpn-trace``      :class:`~pyro_gpn.models.VariationalGPN` by ``fit_svi`` with Pyro's
                    sampled ``Trace_ELBO``
``vgpn-closed``     the same model by ``fit_svi`` with the deterministic
                    :class:`~pyro_gpn.inference.ClosedFormELBO`
==================  =========================================================================

Only the CLT route uses the validation split (for its schedule and early stopping); every other
route trains on the training split alone, for a fixed budget of steps (:class:`RouteBudget`).

**Metrics** (test split, targets in original units, i.e. un-standardised with ``data.y_std``):

* ``rmse`` of the predictive mean;
* ``log_lik``: mean over test points of ``log N(y | m, v)`` under a Gaussian predictive
  ``(m, v)``. For ``clt`` and both ``vgpn`` routes this is the model's closed-form predictive
  (:meth:`GPNNet.forward <pyro_gpn.GPNNet.forward>`,
  :meth:`VariationalGPN.predictive_moments
  <pyro_gpn.models.VariationalGPN.predictive_moments>`; the two ``vgpn`` routes are evaluated
  identically, so they differ only in the objective they were trained with). For the sampling
  routes (``nuts``, ``parametric-svi``) it is the **moment-matched Gaussian** of the predictive
  draws (noise included): their sample mean and variance. Mixtures over draws are not used,
  because ``NUTS`` and ``ParametricGPN.predict`` return draws of the noisy outputs, not
  per-draw Gaussians;
* ``coverage90``: the fraction of test targets inside the central 90 % predictive interval:
  ``m +- 1.645 sqrt(v)`` for the Gaussian routes, the empirical 5 % and 95 % quantiles of the
  draws for the sampling routes (the same intervals are drawn in :func:`plot_comparison`);
* ``wall_s``: seconds of training (NUTS: warm-up and sampling; the periodic evaluations that
  record the learning curves of the ``vgpn`` routes are excluded);
* NUTS only: ``max_rhat`` (rank-normalised split r-hat), ``min_ess`` (bulk ESS) and the number of
  divergent transitions. r-hat and ESS are taken over the *identified* quantities, the noise
  scales ``sigma{l}`` and the posterior-predictive test outputs; weights are left out because
  their sign and the order of hidden units are not identified (``pyro_gpn.diagnostics``).

**Learning curves and time to a target.** The ``vgpn`` routes record the test log-likelihood
every ``budget.eval_every`` steps against their training wall time (:attr:`RouteResult.curve`);
:meth:`ComparisonResult.time_to_target` reads off the training time from which each stays at or
above a given test log-likelihood -- the benchmark of the closed-form ELBO against
``Trace_ELBO``.

:func:`synthetic_1d` makes a 1-D problem with a gap in the training inputs (so the bands show
epistemic uncertainty), :func:`plot_comparison` draws the predictions, and
:func:`add_compare_parser` / :func:`run_compare_cli` are the ``pyro-gpn compare`` subcommand.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyro
import torch
from torch import Tensor

from .data.dataset import RegressionData
from .inference.trainer import seed_everything
from .layers.parametric import TARGET_INITS
from .layers.variational import VARIATIONAL_TARGET_INITS as TARGETS_INITS
from .losses import gaussian_predictive_log_likelihood
from .moments.gaussian import Moments

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.figure import Figure

__all__ = [
    "ROUTES",
    "ComparisonResult",
    "RouteBudget",
    "RouteResult",
    "add_compare_parser",
    "aggregate_markdown",
    "compare_routes",
    "plot_comparison",
    "plot_learning_curves",
    "run_compare_cli",
    "synthetic_1d",
]

ROUTES = ("nuts", "parametric-svi", "clt", "vgpn-trace", "vgpn-closed")
ROUTE_LABELS = {
    "nuts": "NUTS, non-parametric GPN",
    "parametric-svi": "SVI, parametric GPN",
    "clt": "ML, central-limit GPN",
    "vgpn-trace": "VI, Trace_ELBO",
    "vgpn-closed": "VI, closed-form ELBO",
}
#: the standard normal's 95 % quantile: ``m +- Z90 sd`` is the central 90 % interval
Z90 = 1.6448536269514722
_METRICS = ("rmse", "log_lik", "coverage90", "wall_s")


# ---------------------------------------------------------------------------------- settings
@dataclass
class RouteBudget:
    """How much work each route may do (shared settings such as the learning rate included).

    Attributes:
        svi_steps: optimiser steps of the three SVI routes.
        svi_lr: Adam learning rate of the parametric SVI route.
        vgpn_lr: Adam learning rate of the two variational routes.
        vgpn_whiten: fit the variational GPN in the whitened parametrisation (``U = L z``).
        vgpn_lr_decay: the variational routes' learning rate decays exponentially to
            ``vgpn_lr * vgpn_lr_decay`` at the last step (``1``: constant); the late small steps
            let the noisy ``Trace_ELBO`` route settle.
            On yacht (split 0, ``[6, 4, 1]``, 3000 closed-form steps at ``lr=0.05``) the
            whitened fit reached test RMSE 1.53 and the plain one 11.2: the plain
            parametrisation barely moves the targets away from the prior.
        targets_init: initial targets of the parametric GPN routes (``parametric-svi`` and
            ``clt``): ``"random"`` or ``"identity"`` (the paper uses both). On yacht (3 seeds)
            random targets gave test RMSE 1.90 ± 2.65 (parametric SVI) and 1.51 ± 1.11 (CLT),
            identity 0.29 / 0.38 / 0.44 and 0.37 / 0.40 / 0.39.
        vgpn_targets_init: initial mean of ``q(U)`` of the variational routes (see
            :class:`~pyro_gpn.layers.VariationalGPNLayer`: ``"random"``, ``"identity"``,
            ``"zero"``). On yacht (split 0, ``[6, 4, 1]``, 4000 closed-form steps, ``lr`` 0.05
            decayed to 0.005) ``"random"`` -- activation functions drawn from the GP prior --
            ended in the noise-only optimum in 2 of 3 seeds (test RMSE 11.6, 10.9) and
            ``"identity"`` reached 0.275, 0.279, 0.297 (``docs/results/routes.md``).
        svi_batch_size: mini-batch size of the SVI routes (``None``: the full training set).
        trace_particles: Monte Carlo particles of the sampled ``Trace_ELBO`` losses.
        eval_every: steps between the test evaluations that record the ``vgpn`` learning curves
            (``0``: only at the end).
        predictive_samples: draws of the ``parametric-svi`` predictive.
        clt_epochs: ``max_epochs`` of the CLT route's trainer.
        clt_lr: initial learning rate of the CLT route (divided by 10 on plateaus).
        clt_batch_size: mini-batch size of the CLT route.
        clt_patience: evaluations without improvement before the CLT learning rate drops.
        nuts_samples, nuts_warmup, nuts_chains: NUTS draws kept per chain, warm-up steps per
            chain and chains.
        nuts_max_tree_depth: NUTS tree-depth limit.
        nuts_max_rows: NUTS is skipped when its training rows plus prediction rows (test and,
            for 1-D data, the plot grid) exceed this.
        nuts_subsample: if set, NUTS sees a random subset of this many training rows (seeded).
        nuts_sizes: hidden widths of the non-parametric GPN (``None``: the common ``sizes``);
            every hidden unit adds one latent dimension per row.
    """

    svi_steps: int = 2000
    svi_lr: float = 1e-2
    vgpn_lr: float = 5e-2
    vgpn_whiten: bool = True
    vgpn_lr_decay: float = 0.1
    targets_init: str = "identity"
    vgpn_targets_init: str = "identity"
    svi_batch_size: int | None = None
    trace_particles: int = 1
    eval_every: int = 50
    predictive_samples: int = 500
    clt_epochs: int = 300
    clt_lr: float = 1e-2
    clt_batch_size: int = 32
    clt_patience: int = 10
    nuts_samples: int = 200
    nuts_warmup: int = 200
    nuts_chains: int = 2
    nuts_max_tree_depth: int = 8
    nuts_max_rows: int = 300
    nuts_subsample: int | None = None
    nuts_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        positive = (
            "svi_steps",
            "trace_particles",
            "predictive_samples",
            "clt_epochs",
            "clt_batch_size",
            "nuts_samples",
            "nuts_chains",
            "nuts_max_tree_depth",
            "nuts_max_rows",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("eval_every", "nuts_warmup", "clt_patience"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        for name in ("svi_lr", "vgpn_lr", "clt_lr"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not (isinstance(self.vgpn_lr_decay, (int, float)) and 0 < self.vgpn_lr_decay <= 1):
            raise ValueError(f"vgpn_lr_decay must lie in (0, 1], got {self.vgpn_lr_decay!r}")
        if self.targets_init not in TARGET_INITS:
            raise ValueError(
                f"targets_init must be one of {TARGET_INITS}, got {self.targets_init!r}"
            )
        if self.vgpn_targets_init not in TARGETS_INITS:
            raise ValueError(
                f"vgpn_targets_init must be one of {TARGETS_INITS}, got {self.vgpn_targets_init!r}"
            )
        for name in ("svi_batch_size", "nuts_subsample"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if self.nuts_sizes is not None:
            self.nuts_sizes = _check_sizes("nuts_sizes", self.nuts_sizes)


def _check_sizes(name: str, sizes: Sequence[int]) -> tuple[int, ...]:
    sizes = tuple(sizes)
    if any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"{name} must be positive integers (hidden widths), got {sizes}")
    return sizes


# ---------------------------------------------------------------------------------- results
@dataclass
class RouteResult:
    """The outcome of one route (metrics in original target units; see the module docstring).

    Attributes:
        route: one of :data:`ROUTES`.
        rmse, log_lik, coverage90, wall_s: test metrics and training seconds (``nan`` if skipped).
        predictive: how the predictive distribution was summarised.
        skipped: the reason the route did not run, else ``None``.
        max_rhat, min_ess, num_divergences: NUTS diagnostics (``None`` for other routes).
        num_train: training rows the route saw.
        curve: ``(step, training seconds, test log-likelihood)`` triples (``vgpn`` routes).
        grid_mean, grid_lower, grid_upper: predictive mean and 90 % interval on the plot grid
            (1-D data), original units.
        details: route-specific facts (steps, epochs, final loss, ...).
    """

    route: str
    rmse: float = math.nan
    log_lik: float = math.nan
    coverage90: float = math.nan
    wall_s: float = math.nan
    predictive: str = ""
    skipped: str | None = None
    max_rhat: float | None = None
    min_ess: float | None = None
    num_divergences: int | None = None
    num_train: int = 0
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    grid_mean: np.ndarray | None = field(default=None, repr=False)
    grid_lower: np.ndarray | None = field(default=None, repr=False)
    grid_upper: np.ndarray | None = field(default=None, repr=False)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return ROUTE_LABELS.get(self.route, self.route)

    def time_to_target(self, target: float, held: bool = True) -> float | None:
        """Training seconds until the recorded test log-likelihood reached ``target``.

        Args:
            target: the test log-likelihood (original units).
            held: ``True``: the time from which the curve stays ``>= target`` to the end (a
                curve that touches the target and falls back, or a noisy one crossing it by
                chance, does not count as there; ``None`` if the last value is below);
                ``False``: the first time the curve touched it (``None`` if never).
        """
        seconds = None
        for _, elapsed, log_lik in self.curve:
            if log_lik < target:
                seconds = None if held else seconds
            elif seconds is None:
                seconds = elapsed
                if not held:
                    break
        return seconds


@dataclass
class ComparisonResult:
    """All routes on one data set (:func:`compare_routes`).

    Attributes:
        dataset: the data set's name; ``description`` its provenance.
        routes: one :class:`RouteResult` per requested route, in order.
        sizes: the common hidden widths; ``seed``, ``budget``: the settings.
        num_train, num_test: rows of the training and test splits.
        x_train, y_train, x_test, y_test: the data in original units (numpy) for plots.
        x_grid: the plot grid (1-D inputs) in original units, else ``None``.
    """

    dataset: str
    description: str
    routes: list[RouteResult]
    sizes: tuple[int, ...]
    seed: int
    budget: RouteBudget
    num_train: int
    num_test: int
    x_train: np.ndarray = field(repr=False)
    y_train: np.ndarray = field(repr=False)
    x_test: np.ndarray = field(repr=False)
    y_test: np.ndarray = field(repr=False)
    x_grid: np.ndarray | None = field(default=None, repr=False)

    def __getitem__(self, route: str) -> RouteResult:
        for result in self.routes:
            if result.route == route:
                return result
        raise KeyError(route)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per route: the table's columns."""
        return [
            {
                "route": r.route,
                "rmse": r.rmse,
                "log_lik": r.log_lik,
                "coverage90": r.coverage90,
                "wall_s": r.wall_s,
                "max_rhat": r.max_rhat,
                "min_ess": r.min_ess,
                "divergences": r.num_divergences,
                "num_train": r.num_train,
                "predictive": r.predictive,
                "skipped": r.skipped,
            }
            for r in self.routes
        ]

    def to_frame(self):
        """The table as a ``pandas.DataFrame`` indexed by route."""
        import pandas as pd

        return pd.DataFrame(self.rows()).set_index("route")

    def to_markdown(self) -> str:
        """The table as GitHub markdown (skipped routes list their reason)."""
        header = (
            "| route | train rows | test RMSE | test log-lik | 90 % coverage | wall s | "
            "max r-hat | min bulk ESS | divergences |"
        )
        lines = [header, "|" + " --- |" * 9]
        for r in self.routes:
            if r.skipped is not None:
                lines.append(f"| {r.route} | skipped: {r.skipped} |" + " |" * 7)
                continue
            nuts = [_fmt(r.max_rhat, 3), _fmt(r.min_ess, 0), _fmt(r.num_divergences, 0)]
            cells = [
                r.route,
                str(r.num_train),
                _fmt(r.rmse, 3),
                _fmt(r.log_lik, 3),
                _fmt(r.coverage90, 2),
                _fmt(r.wall_s, 1),
                *nuts,
            ]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def time_to_target(
        self, target: float | None = None, held: bool = True
    ) -> tuple[float, dict[str, float | None]]:
        """Training seconds each route with a learning curve needed to reach a test log-lik.

        Args:
            target: the test log-likelihood (original units); ``None`` takes the lower of the
                routes' final values minus 0.05, a level every curve ends above.
            held: see :meth:`RouteResult.time_to_target`.

        Returns:
            ``(target, {route: seconds or None})`` over the routes that recorded a curve.
        """
        curved = [r for r in self.routes if r.curve]
        if target is None:
            if not curved:
                raise ValueError("no route recorded a learning curve (budget.eval_every)")
            target = min(r.curve[-1][2] for r in curved) - 0.05
        return target, {r.route: r.time_to_target(target, held) for r in curved}


def _fmt(value: float | int | None, digits: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}"


def aggregate_markdown(results: Sequence[ComparisonResult]) -> str:
    """A markdown table of mean +- standard deviation over several runs (e.g. seeds).

    Routes are matched by name; skipped runs are left out of the statistics and counted.
    """
    if not results:
        raise ValueError("results must hold at least one ComparisonResult")
    lines = [
        "| route | runs | test RMSE | test log-lik | 90 % coverage | wall s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for route in [r.route for r in results[0].routes]:
        runs = [res[route] for res in results if route in {r.route for r in res.routes}]
        done = [r for r in runs if r.skipped is None]
        if not done:
            lines.append(f"| {route} | 0 of {len(runs)} (skipped: {runs[0].skipped}) |" + " |" * 4)
            continue
        cells = [_mean_sd([getattr(r, m) for r in done], d) for m, d in zip(_METRICS, (3, 3, 2, 1))]
        lines.append(f"| {route} | {len(done)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean_sd(values: Sequence[float], digits: int) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


# ---------------------------------------------------------------------------------- data
def synthetic_1d(
    n_train: int = 60,
    n_test: int = 100,
    seed: int = 0,
    noise_std: float = 0.1,
    gap: tuple[float, float] = (-0.5, 0.5),
    x_range: tuple[float, float] = (-2.0, 2.0),
) -> RegressionData:
    """A 1-D regression problem ``y = sin(3 x) + N(0, noise_std^2)`` with a gap.

    Training inputs are uniform on ``x_range`` minus ``gap`` (no training data in the gap), test
    inputs uniform on the whole ``x_range``, so test points in the gap probe the epistemic
    uncertainty. Returned as :class:`~pyro_gpn.data.RegressionData` standardised with training
    statistics; 10 % of the ``n_train`` training rows are held out for validation.
    """
    if not isinstance(n_train, int) or n_train < 10:
        raise ValueError(f"n_train must be an integer >= 10, got {n_train!r}")
    if not isinstance(n_test, int) or n_test < 1:
        raise ValueError(f"n_test must be a positive integer, got {n_test!r}")
    lo, hi = x_range
    if not (lo <= gap[0] < gap[1] <= hi):
        raise ValueError(f"gap {gap} must be an interval inside x_range {x_range}")
    rng = np.random.default_rng(seed)
    width = (hi - lo) - (gap[1] - gap[0])
    u = rng.uniform(0.0, width, n_train)
    x_train = np.where(u < gap[0] - lo, lo + u, gap[1] + u - (gap[0] - lo))
    x = np.concatenate([x_train, rng.uniform(lo, hi, n_test)])[:, None]
    y = np.sin(3.0 * x[:, 0]) + noise_std * rng.standard_normal(len(x))
    index = np.arange(n_train + n_test)
    return RegressionData.from_arrays(
        "synthetic-1d",
        x,
        y,
        index[:n_train],
        index[n_train:],
        feature_names=("x",),
        description=(
            f"synthetic y = sin(3x) + N(0, {noise_std}^2); train x ~ U({x_range}) without the "
            f"gap {gap} ({n_train} rows, 10 % held out for validation), test x ~ U({x_range}) "
            f"({n_test} rows); data seed {seed}"
        ),
        seed=seed,
    )


# ---------------------------------------------------------------------------------- predictions
@dataclass
class _Predictive:
    """A predictive in standardised units: Gaussian ``(mean, var)`` or draws ``[K, S]``."""

    mean: Tensor
    var: Tensor
    lower: Tensor
    upper: Tensor
    kind: str

    @classmethod
    def gaussian(cls, mean: Tensor, var: Tensor, kind: str) -> _Predictive:
        mean, var = mean.reshape(-1).double(), var.reshape(-1).double()
        half = Z90 * var.sqrt()
        return cls(mean, var, mean - half, mean + half, kind)

    @classmethod
    def from_draws(cls, draws: Tensor, kind: str) -> _Predictive:
        draws = draws.reshape(draws.shape[0], -1).double()
        bounds = torch.quantile(draws, torch.tensor([0.05, 0.95], dtype=draws.dtype), dim=0)
        return cls(draws.mean(0), draws.var(0), bounds[0], bounds[1], kind)

    def rows(self, index: slice) -> _Predictive:
        return _Predictive(
            self.mean[index], self.var[index], self.lower[index], self.upper[index], self.kind
        )


def _metrics(pred: _Predictive, y: Tensor, y_std: float) -> dict[str, float]:
    """RMSE, Gaussian log-likelihood and 90 % coverage in original units."""
    y = y.reshape(-1).double()
    gaussian = Moments(pred.mean[:, None], var=pred.var.clamp_min(1e-12)[:, None])
    log_lik = gaussian_predictive_log_likelihood(gaussian, y[:, None], reduction="mean")
    inside = (y >= pred.lower) & (y <= pred.upper)
    return {
        "rmse": float((y - pred.mean).square().mean().sqrt()) * y_std,
        "log_lik": float(log_lik) - math.log(y_std),
        "coverage90": float(inside.double().mean()),
    }


@dataclass
class _Context:
    """What every route runner gets."""

    data: RegressionData
    sizes: tuple[int, ...]
    seed: int
    budget: RouteBudget
    x_eval: Tensor  # test rows, then grid rows
    num_test: int
    y_std: float

    def full_sizes(self, hidden: Sequence[int] | None = None) -> list[int]:
        hidden = self.sizes if hidden is None else hidden
        return [self.data.num_features, *hidden, 1]

    def test_log_lik(self, pred: _Predictive) -> float:
        return _metrics(pred.rows(slice(0, self.num_test)), self.data.y_test, self.y_std)["log_lik"]


_Runner = Callable[[_Context, RouteResult], _Predictive]


def _fresh(ctx: _Context) -> None:
    """Seed everything and empty Pyro's param store before a route builds its model."""
    pyro.clear_param_store()
    seed_everything(ctx.seed)
    pyro.set_rng_seed(ctx.seed)


def _run_nuts(ctx: _Context, out: RouteResult) -> _Predictive:
    from .diagnostics import max_rhat, min_ess
    from .inference.mcmc import run_nuts
    from .models.nonparametric import NonParametricGPN

    budget, data = ctx.budget, ctx.data
    x, y = data.x_train, data.y_train
    if budget.nuts_subsample is not None and budget.nuts_subsample < x.shape[0]:
        rows = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(ctx.seed))
        rows = rows[: budget.nuts_subsample]
        x, y = x[rows], y[rows]
    total = x.shape[0] + ctx.x_eval.shape[0]
    if total > budget.nuts_max_rows:
        raise _Skip(
            f"{x.shape[0]} training + {ctx.x_eval.shape[0]} prediction rows exceed "
            f"nuts_max_rows={budget.nuts_max_rows} (O(S^3) per unit and gradient step); "
            "set nuts_subsample"
        )
    out.num_train = x.shape[0]
    model = NonParametricGPN(ctx.full_sizes(budget.nuts_sizes), max_samples=total)
    nuts = run_nuts(
        model,
        x.double(),
        y.double(),
        ctx.x_eval.double(),
        num_samples=budget.nuts_samples,
        warmup_steps=budget.nuts_warmup,
        num_chains=budget.nuts_chains,
        max_tree_depth=budget.nuts_max_tree_depth,
        seed=ctx.seed,
    )
    out.wall_s = nuts.wall_time_s
    idata = nuts.to_arviz()
    sigmas = [f"sigma{l}" for l in range(1, model.num_layers + 1)]
    out.max_rhat = max(
        max_rhat(idata, sigmas), max_rhat(idata, ["y_test"], group="posterior_predictive")
    )
    out.min_ess = min(
        min_ess(idata, sigmas), min_ess(idata, ["y_test"], group="posterior_predictive")
    )
    out.num_divergences = nuts.num_divergences()
    out.details.update(
        sizes=model.sizes,
        chains=budget.nuts_chains,
        warmup=budget.nuts_warmup,
        samples=budget.nuts_samples,
    )
    return _Predictive.from_draws(nuts.y_test, "draws: moment-matched Gaussian, quantile interval")


def _run_parametric(ctx: _Context, out: RouteResult) -> _Predictive:
    from .inference.svi import fit_svi
    from .models.parametric import ParametricGPN

    budget, data = ctx.budget, ctx.data
    gpn = ParametricGPN(ctx.full_sizes(), head="gaussian", targets_init=budget.targets_init)
    fit = fit_svi(
        gpn.model,
        gpn.guide,
        data.x_train,
        data.y_train,
        loss="trace",
        num_steps=budget.svi_steps,
        lr=budget.svi_lr,
        batch_size=budget.svi_batch_size,
        num_particles=budget.trace_particles,
        seed=ctx.seed,
        progress=False,
    )
    out.wall_s = fit.wall_time
    out.details.update(steps=fit.num_steps, final_loss_per_row=fit.final_loss / fit.num_data)
    draws = gpn.sample_predictive(ctx.x_eval, num_samples=budget.predictive_samples)["y"]
    return _Predictive.from_draws(draws, "draws: moment-matched Gaussian, quantile interval")


def _run_clt(ctx: _Context, out: RouteResult) -> _Predictive:
    from .inference.trainer import TrainConfig, Trainer
    from .network import GPNNet

    budget, data = ctx.budget, ctx.data
    net = GPNNet(
        ctx.full_sizes(), mode="meanvar", head="gaussian", targets_init=budget.targets_init
    )
    config = TrainConfig(
        lr=budget.clt_lr,
        batch_size=budget.clt_batch_size,
        max_epochs=budget.clt_epochs,
        patience=budget.clt_patience,
        seed=ctx.seed,
        task="regression",
        progress=False,
    )
    start = time.perf_counter()
    fit = Trainer(net, config).fit((data.x_train, data.y_train), (data.x_val, data.y_val))
    out.wall_s = time.perf_counter() - start
    out.details.update(epochs=fit.epochs, best_epoch=fit.best_epoch, stop=fit.stop_reason)
    with torch.no_grad():
        moments = net(ctx.x_eval)
    return _Predictive.gaussian(moments.mean, moments.variance, "closed-form Gaussian")


def _vgpn_route(loss_name: str) -> _Runner:
    """The runner of a variational-GPN route trained with ``"trace"`` or ``"closed"``."""

    def run(ctx: _Context, out: RouteResult) -> _Predictive:
        from .inference.closed_form import ClosedFormELBO
        from .inference.svi import fit_svi
        from .models.variational import VariationalGPN

        budget, data = ctx.budget, ctx.data
        num_train = data.x_train.shape[0]
        batched = budget.svi_batch_size is not None and budget.svi_batch_size < num_train
        vgpn = VariationalGPN(
            ctx.full_sizes(),
            head="gaussian",
            whiten=budget.vgpn_whiten,
            targets_init=budget.vgpn_targets_init,
            num_data=num_train if batched else None,
        )

        def predict() -> _Predictive:
            with torch.no_grad():
                moments = vgpn(ctx.x_eval)
            return _Predictive.gaussian(moments.mean, moments.variance, "closed-form Gaussian")

        start, evaluating = time.perf_counter(), 0.0

        def record(step: int, _loss: float) -> None:
            nonlocal evaluating
            if budget.eval_every and (step % budget.eval_every == 0 or step == 1):
                entered = time.perf_counter()
                trained = entered - start - evaluating
                out.curve.append((step, trained, ctx.test_log_lik(predict())))
                evaluating += time.perf_counter() - entered

        trace = loss_name == "trace"
        fit = fit_svi(
            vgpn.model,
            vgpn.guide,
            data.x_train,
            data.y_train,
            loss="trace" if trace else ClosedFormELBO(vgpn),
            num_steps=budget.svi_steps,
            lr=budget.vgpn_lr,
            lr_decay=budget.vgpn_lr_decay,
            batch_size=budget.svi_batch_size,
            num_particles=budget.trace_particles if trace else None,
            seed=ctx.seed,
            progress=False,
            callback=record,
        )
        out.wall_s = fit.wall_time - evaluating
        prediction = predict()
        if budget.eval_every and (not out.curve or out.curve[-1][0] != fit.num_steps):
            out.curve.append((fit.num_steps, out.wall_s, ctx.test_log_lik(prediction)))
        out.details.update(steps=fit.num_steps, final_loss_per_row=fit.final_loss / num_train)
        return prediction

    return run


class _Skip(Exception):
    """Raised by a runner that cannot run on this data; the message is the reason."""


_RUNNERS: dict[str, _Runner] = {
    "nuts": _run_nuts,
    "parametric-svi": _run_parametric,
    "clt": _run_clt,
    "vgpn-trace": _vgpn_route("trace"),
    "vgpn-closed": _vgpn_route("closed"),
}


# ---------------------------------------------------------------------------------- entry point
def compare_routes(
    data: RegressionData,
    routes: Sequence[str] = ROUTES,
    sizes: Sequence[int] = (4,),
    seed: int = 0,
    budget: RouteBudget | None = None,
    grid_size: int = 200,
    verbose: bool = False,
) -> ComparisonResult:
    """Fit ``data`` with every route in ``routes`` and measure them on its test split.

    Args:
        data: a regression data set with one target (standardised, with ``y_std``).
        routes: any of :data:`ROUTES`, in the order to run and report.
        sizes: hidden widths shared by all routes (``[]``: a single GPN layer);
            ``budget.nuts_sizes`` may give NUTS its own.
        seed: seeds every route's initialisation, mini-batches, sampler and NUTS subsample.
        budget: steps, samples and learning rates (:class:`RouteBudget`; default settings).
        grid_size: points of the plot grid for 1-D inputs (predicted by every route, and
            counted in NUTS's rows).
        verbose: print one line per finished route.

    Returns:
        a :class:`ComparisonResult`; a route that cannot run (NUTS on too many rows) is kept
        with ``skipped`` set to the reason and ``nan`` metrics.
    """
    if not isinstance(data, RegressionData):
        raise TypeError(f"data must be a RegressionData, got {type(data).__name__}")
    if data.y_train.shape[1] != 1:
        raise ValueError(f"data must have one target, got {data.y_train.shape[1]}")
    routes = tuple(routes)
    unknown = [r for r in routes if r not in _RUNNERS]
    if unknown or not routes or len(set(routes)) != len(routes):
        raise ValueError(f"routes must be distinct names from {ROUTES}, got {routes}")
    sizes = _check_sizes("sizes", sizes)
    budget = RouteBudget() if budget is None else budget
    if not isinstance(grid_size, int) or grid_size < 2:
        raise ValueError(f"grid_size must be an integer >= 2, got {grid_size!r}")
    y_std = float(data.y_std.reshape(-1)[0])
    x_std, x_mean = data.x_std.double().numpy(), data.x_mean.double().numpy()
    x_eval, x_grid = data.x_test, None
    if data.num_features == 1:
        seen = torch.cat([data.x_train, data.x_test])
        pad = 0.25 * float(seen.max() - seen.min())
        grid = torch.linspace(float(seen.min()) - pad, float(seen.max()) + pad, grid_size)
        x_eval = torch.cat([data.x_test, grid[:, None]])
        x_grid = grid.double().numpy() * x_std[0] + x_mean[0]
    ctx = _Context(data, sizes, int(seed), budget, x_eval, data.x_test.shape[0], y_std)

    results = []
    for route in routes:
        out = RouteResult(route, num_train=data.x_train.shape[0])
        _fresh(ctx)
        try:
            pred = _RUNNERS[route](ctx, out)
        except _Skip as skip:
            out.skipped, out.num_train = str(skip), 0
        else:
            out.predictive = pred.kind
            for name, value in _metrics(
                pred.rows(slice(0, ctx.num_test)), data.y_test, y_std
            ).items():
                setattr(out, name, value)
            if x_grid is not None:
                grid = pred.rows(slice(ctx.num_test, None))
                unscale = lambda t: t.numpy() * y_std + float(data.y_mean)  # noqa: E731
                out.grid_mean, out.grid_lower, out.grid_upper = (
                    unscale(t) for t in (grid.mean, grid.lower, grid.upper)
                )
        if verbose:
            print(_one_line(out), flush=True)
        results.append(out)

    def original(x: Tensor, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
        return x.double().numpy() * std + mean

    y_mean, y_scale = data.y_mean.double().numpy(), data.y_std.double().numpy()
    return ComparisonResult(
        dataset=data.name,
        description=data.description,
        routes=results,
        sizes=sizes,
        seed=int(seed),
        budget=budget,
        num_train=data.x_train.shape[0],
        num_test=data.x_test.shape[0],
        x_train=original(data.x_train, x_mean, x_std),
        y_train=original(data.y_train, y_mean, y_scale)[:, 0],
        x_test=original(data.x_test, x_mean, x_std),
        y_test=original(data.y_test, y_mean, y_scale)[:, 0],
        x_grid=x_grid,
    )


def _one_line(r: RouteResult) -> str:
    if r.skipped is not None:
        return f"{r.route:>15}: skipped ({r.skipped})"
    text = (
        f"{r.route:>15}: RMSE {r.rmse:.3f}, log-lik {r.log_lik:.3f}, "
        f"coverage {r.coverage90:.2f}, {r.wall_s:.1f} s"
    )
    if r.max_rhat is not None:
        text += f", max r-hat {r.max_rhat:.3f}, min ESS {r.min_ess:.0f}, "
        text += f"{r.num_divergences} divergences"
    return text


# ---------------------------------------------------------------------------------- plots
def plot_comparison(results: ComparisonResult | Sequence[ComparisonResult]) -> Figure:
    """Plot a comparison.

    1-D inputs: one panel per route with the training (black) and test (grey) points and the
    predictive mean with its 90 % interval over the grid (of the first result when several are
    given). Multi-D inputs: bars of test RMSE, log-likelihood and 90 % coverage per route (mean
    and standard deviation over the results, e.g. seeds), with the nominal 0.9 marked.
    """
    import matplotlib.pyplot as plt

    runs = [results] if isinstance(results, ComparisonResult) else list(results)
    if not runs:
        raise ValueError("results must hold at least one ComparisonResult")
    first = runs[0]
    if first.x_grid is not None:
        return _plot_bands(first, plt)
    names = [r.route for r in first.routes if r.skipped is None]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), constrained_layout=True)
    for ax, metric, title in zip(
        axes, _METRICS, ("test RMSE", "test log-likelihood", "90 % interval coverage")
    ):
        values = [
            [res[name].__dict__[metric] for res in runs if res[name].skipped is None]
            for name in names
        ]
        means = [statistics.fmean(v) for v in values]
        sds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
        ax.bar(range(len(names)), means, yerr=sds, capsize=3, color="tab:blue", alpha=0.8)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_title(title)
        if metric == "coverage90":
            ax.axhline(0.9, color="k", linestyle="--", linewidth=1)
            ax.set_ylim(0, 1.05)
    fig.suptitle(f"{first.dataset}: {len(runs)} run(s), hidden widths {list(first.sizes)}")
    return fig


def plot_learning_curves(
    results: Sequence[ComparisonResult], target: float | Sequence[float | None] | None = None
) -> Figure:
    """Test log-likelihood against training seconds of the routes with a learning curve.

    One panel per result (e.g. per data set); ``target`` (one per result, or one for all) is
    drawn as a dashed line.
    """
    import matplotlib.pyplot as plt

    results = list(results)
    targets = target if isinstance(target, Sequence) else [target] * len(results)
    fig, axes = plt.subplots(
        1, len(results), figsize=(4.5 * len(results), 3.4), constrained_layout=True
    )
    for ax, result, level in zip(np.atleast_1d(axes), results, targets, strict=True):
        for r in result.routes:
            if r.curve:
                _, seconds, log_lik = zip(*r.curve)
                ax.plot(seconds, log_lik, marker=".", label=r.label)
        curves = [[ll for *_, ll in r.curve] for r in result.routes if r.curve]
        if curves:  # start at the lowest final value: the early, poor steps would squash it
            top = max(max(c) for c in curves)
            ax.set_ylim(min(c[-1] for c in curves) - 1.0, top + 0.1 * (abs(top) + 1.0))
        if level is not None:
            ax.axhline(level, color="k", linestyle="--", linewidth=1, label="target")
        ax.set_xlabel("training wall time [s]")
        ax.set_ylabel("test log-likelihood")
        ax.set_title(f"{result.dataset}, seed {result.seed}")
        ax.legend(fontsize=7)
    return fig


def _plot_bands(result: ComparisonResult, plt) -> Figure:
    panels = result.routes
    fig, axes = plt.subplots(
        1, len(panels), figsize=(3.2 * len(panels), 3.2), sharey=True, constrained_layout=True
    )
    axes = np.atleast_1d(axes)
    lows = [r.grid_lower.min() for r in panels if r.grid_lower is not None]
    highs = [r.grid_upper.max() for r in panels if r.grid_upper is not None]
    span = np.concatenate([result.y_train, result.y_test])
    ylim = (min(span.min(), *lows) - 0.2, max(span.max(), *highs) + 0.2)
    for ax, r in zip(axes, panels, strict=True):
        ax.scatter(result.x_test[:, 0], result.y_test, s=6, color="0.6", label="test")
        ax.scatter(result.x_train[:, 0], result.y_train, s=8, color="k", label="train")
        if r.skipped is None:
            ax.fill_between(
                result.x_grid, r.grid_lower, r.grid_upper, alpha=0.3, label="90 % interval"
            )
            ax.plot(result.x_grid, r.grid_mean, color="tab:blue", label="mean")
            ax.set_title(f"{r.route}\nlog-lik {r.log_lik:.2f}, cov. {r.coverage90:.2f}")
        else:
            ax.set_title(f"{r.route}\nskipped")
        ax.set_ylim(*ylim)
        ax.set_xlabel("x")
    axes[0].legend(loc="lower left", fontsize=7)
    return fig


# ---------------------------------------------------------------------------------- CLI
def add_route_start_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options that set how the gradient-trained routes start and how the variational
    routes' learning rate decays (``--vgpn-lr-decay``, ``--vgpn-targets-init``,
    ``--targets-init``), with :class:`RouteBudget`'s defaults; read them back with
    :func:`route_start_settings`. Shared by ``pyro-gpn compare`` and
    ``benchmarks/compare_routes.py``."""
    defaults = RouteBudget()
    parser.add_argument(
        "--vgpn-lr-decay",
        type=float,
        default=defaults.vgpn_lr_decay,
        help="variational routes: learning-rate factor reached at the last step (exponential "
        "decay; 1: constant)",
    )
    parser.add_argument(
        "--vgpn-targets-init",
        choices=TARGETS_INITS,
        default=defaults.vgpn_targets_init,
        help="variational routes: initial mean of q(U)",
    )
    parser.add_argument(
        "--targets-init",
        choices=TARGET_INITS,
        default=defaults.targets_init,
        help="parametric routes (parametric-svi, clt): initial targets",
    )


def route_start_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`RouteBudget` fields set by :func:`add_route_start_arguments`."""
    return {
        "vgpn_lr_decay": args.vgpn_lr_decay,
        "vgpn_targets_init": args.vgpn_targets_init,
        "targets_init": args.targets_init,
    }


def add_compare_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``compare`` subcommand (``func=run_compare_cli``) on ``subparsers``."""
    defaults = RouteBudget()
    parser = subparsers.add_parser(
        "compare",
        help="fit one regression set with every inference route and compare them",
        description=(
            "Fit a regression data set with NUTS (non-parametric GPN), SVI (parametric GPN), the "
            "central-limit GPN and the variational GPN (Trace_ELBO and closed-form ELBO); write "
            "a markdown table of test RMSE, log-likelihood, 90 %% coverage and wall time (and "
            "NUTS diagnostics) and a plot."
        ),
    )
    parser.add_argument(
        "--dataset", default="synthetic", help="'synthetic' (1-D sin with a gap) or a UCI name"
    )
    parser.add_argument("--split", type=int, default=0, help="UCI train/test split")
    parser.add_argument("--n-train", type=int, default=60, help="synthetic training rows")
    parser.add_argument("--n-test", type=int, default=100, help="synthetic test rows")
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    parser.add_argument("--sizes", type=int, nargs="*", default=[4], help="hidden widths")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--svi-steps", type=int, default=defaults.svi_steps)
    parser.add_argument("--svi-lr", type=float, default=defaults.svi_lr)
    parser.add_argument("--vgpn-lr", type=float, default=defaults.vgpn_lr)
    parser.add_argument(
        "--vgpn-no-whiten", action="store_true", help="fit the variational GPN unwhitened"
    )
    add_route_start_arguments(parser)
    parser.add_argument("--clt-epochs", type=int, default=defaults.clt_epochs)
    parser.add_argument("--nuts-samples", type=int, default=defaults.nuts_samples)
    parser.add_argument("--nuts-warmup", type=int, default=defaults.nuts_warmup)
    parser.add_argument("--nuts-chains", type=int, default=defaults.nuts_chains)
    parser.add_argument("--nuts-max-rows", type=int, default=defaults.nuts_max_rows)
    parser.add_argument("--nuts-subsample", type=int, default=None, help="NUTS training rows")
    parser.add_argument(
        "--nuts-sizes",
        type=int,
        nargs="*",
        default=[],
        help="hidden widths of the non-parametric GPN sampled by NUTS (default: none, a single "
        "GPN layer; every hidden unit adds one latent dimension per training row)",
    )
    parser.add_argument("--grid-size", type=int, default=200, help="plot grid (1-D data)")
    parser.add_argument("--out", default="pyro-gpn-compare", help="output folder")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.set_defaults(func=run_compare_cli)


def run_compare_cli(args: argparse.Namespace) -> int:
    """Run ``pyro-gpn compare``: writes ``<out>/compare.md`` (and ``compare.png``), returns 0."""
    from .experiments import machine_description

    if args.dataset == "synthetic":
        data = synthetic_1d(args.n_train, args.n_test, seed=args.seed)
    else:
        from .data import load_dataset

        data = load_dataset(args.dataset, seed=args.seed, split=args.split)
    budget = RouteBudget(
        svi_steps=args.svi_steps,
        svi_lr=args.svi_lr,
        vgpn_lr=args.vgpn_lr,
        vgpn_whiten=not args.vgpn_no_whiten,
        **route_start_settings(args),
        clt_epochs=args.clt_epochs,
        nuts_samples=args.nuts_samples,
        nuts_warmup=args.nuts_warmup,
        nuts_chains=args.nuts_chains,
        nuts_max_rows=args.nuts_max_rows,
        nuts_subsample=args.nuts_subsample,
        nuts_sizes=tuple(args.nuts_sizes),
    )
    result = compare_routes(
        data, args.routes, args.sizes, args.seed, budget, args.grid_size, verbose=True
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = getattr(args, "command", None)
    text = [
        f"# Route comparison on {result.dataset}",
        "",
        f"- data: {result.description}",
        f"- command: `{command}`" if command else "- command: (library call)",
        f"- machine: {machine_description()}; seed {result.seed}; hidden widths "
        f"{list(result.sizes)}",
        f"- budget: `{asdict(budget)}`",
        "",
        result.to_markdown(),
        "",
    ]
    (out / "compare.md").write_text("\n".join(text))
    print(f"table: {out / 'compare.md'}")
    if not args.no_plot:
        import matplotlib

        matplotlib.use("Agg")
        fig = plot_comparison(result)
        fig.savefig(out / "compare.png", dpi=110)
        print(f"plot: {out / 'compare.png'}")
    return 0
