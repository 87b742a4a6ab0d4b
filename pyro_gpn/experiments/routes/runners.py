"""The route runners and :func:`compare_routes`, which fits one data set with each of them.

Each runner trains one route's model on the training split (seeded afresh, with an empty Pyro
parameter store) and returns its predictive over the test rows and the plot grid; the metric
conventions are those of :mod:`pyro_gpn.experiments.routes`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyro
import torch
from torch import Tensor

from ...data.dataset import RegressionData
from ...inference.trainer import seed_everything
from ...metrics import (
    central_interval,
    empirical_interval,
    gaussian_log_likelihood,
    interval_coverage,
    rmse,
)
from ...moments.gaussian import Moments
from .results import ComparisonResult, RouteResult, one_line
from .settings import ROUTES, RouteBudget, check_sizes

if TYPE_CHECKING:
    from ...inference.nuts_result import NUTSResult

__all__ = ["Z90", "compare_routes"]

#: the standard normal's 95 % quantile: ``m +- Z90 sd`` is the central 90 % interval
Z90 = 1.6448536269514722


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
        return cls(mean, var, *central_interval(mean, var, 0.9), kind)

    @classmethod
    def from_draws(cls, draws: Tensor, kind: str) -> _Predictive:
        draws = draws.reshape(draws.shape[0], -1).double()
        return cls(draws.mean(0), draws.var(0), *empirical_interval(draws, 0.9), kind)

    def rows(self, index: slice) -> _Predictive:
        return _Predictive(
            self.mean[index], self.var[index], self.lower[index], self.upper[index], self.kind
        )


def _pointwise_log_lik(pred: _Predictive, y: Tensor, y_std: float) -> Tensor:
    """Each test row's Gaussian predictive log density ``[S]``, original units."""
    gaussian = Moments(pred.mean[:, None], var=pred.var.clamp_min(1e-12)[:, None])
    return gaussian_log_likelihood(gaussian, y.reshape(-1, 1).double(), y_std, reduction="none")


def _metrics(pred: _Predictive, y: Tensor, y_std: float) -> dict[str, float]:
    """RMSE, Gaussian log-likelihood and 90 % coverage in original units."""
    y = y.reshape(-1).double()
    return {
        "rmse": float(rmse(pred.mean, y, y_std)),
        "log_lik": float(_pointwise_log_lik(pred, y, y_std).mean()),
        "coverage90": float(interval_coverage(y, pred.lower, pred.upper)),
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


def _nuts_rows(ctx: _Context, out: RouteResult) -> tuple[Tensor, Tensor]:
    """The training rows both NUTS routes sample with: all, or the seeded ``nuts_subsample``."""
    budget, data = ctx.budget, ctx.data
    x, y = data.x_train, data.y_train
    if budget.nuts_subsample is not None and budget.nuts_subsample < x.shape[0]:
        rows = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(ctx.seed))
        rows = rows[: budget.nuts_subsample]
        x, y = x[rows], y[rows]
    out.num_train = x.shape[0]
    return x, y


def _nuts_kwargs(ctx: _Context) -> dict:
    """The sampler settings both NUTS routes pass to :func:`~pyro_gpn.inference.run_nuts`."""
    budget = ctx.budget
    return {
        "num_samples": budget.nuts_samples,
        "warmup_steps": budget.nuts_warmup,
        "num_chains": budget.nuts_chains,
        "max_tree_depth": budget.nuts_max_tree_depth,
        "seed": ctx.seed,
    }


def _run_nuts(ctx: _Context, out: RouteResult) -> _Predictive:
    from ...inference.mcmc import run_nuts
    from ...models.nonparametric import NonParametricGPN

    budget = ctx.budget
    x, y = _nuts_rows(ctx, out)
    total = x.shape[0] + ctx.x_eval.shape[0]
    if total > budget.nuts_max_rows:
        raise _Skip(
            f"{x.shape[0]} training + {ctx.x_eval.shape[0]} prediction rows exceed "
            f"nuts_max_rows={budget.nuts_max_rows} (O(S^3) per unit and gradient step); "
            "set nuts_subsample"
        )
    model = NonParametricGPN(ctx.full_sizes(budget.nuts_sizes), max_samples=total)
    nuts = run_nuts(model, x.double(), y.double(), ctx.x_eval.double(), **_nuts_kwargs(ctx))
    sigmas = [f"sigma{l}" for l in range(1, model.num_layers + 1)]
    return _nuts_outcome(nuts, sigmas, budget, out)


def _nuts_outcome(
    nuts: NUTSResult, sigmas: list[str], budget: RouteBudget, out: RouteResult
) -> _Predictive:
    """A NUTS route's wall time, r-hat and bulk ESS over the noise scales ``sigmas`` and the
    predictive test outputs, divergences and settings; its predictive from the draws."""
    from ...diagnostics import max_rhat, min_ess

    out.wall_s = nuts.wall_time_s
    idata = nuts.to_arviz()
    out.max_rhat = max(
        max_rhat(idata, sigmas), max_rhat(idata, ["y_test"], group="posterior_predictive")
    )
    out.min_ess = min(
        min_ess(idata, sigmas), min_ess(idata, ["y_test"], group="posterior_predictive")
    )
    out.num_divergences = nuts.num_divergences
    out.details.update(
        sizes=nuts.model.sizes,
        chains=budget.nuts_chains,
        warmup=budget.nuts_warmup,
        samples=budget.nuts_samples,
    )
    return _Predictive.from_draws(nuts.y_test, "draws: moment-matched Gaussian, quantile interval")


def _run_sampled_u(ctx: _Context, out: RouteResult) -> _Predictive:
    from ...inference.mcmc import run_nuts
    from ...models.sampled_targets import SampledTargetsGPN

    budget = ctx.budget
    x, y = _nuts_rows(ctx, out)
    model = SampledTargetsGPN(
        ctx.full_sizes(budget.sampled_u_sizes), num_inducing=budget.sampled_u_inducing
    )
    nuts = run_nuts(model, x.double(), y.double(), ctx.x_eval.double(), **_nuts_kwargs(ctx))
    out.details["num_inducing"] = model.num_inducing
    # the output noise: a hidden unit's is not identified (unit permutations)
    return _nuts_outcome(nuts, [f"sigma{model.num_layers}"], budget, out)


def _run_parametric(ctx: _Context, out: RouteResult) -> _Predictive:
    from ...inference.svi import fit_svi
    from ...models.parametric import ParametricGPN

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
    from ...inference.trainer import TrainConfig, Trainer
    from ...network import GPNNet

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
        from ...inference.closed_form import ClosedFormELBO
        from ...inference.svi import fit_svi
        from ...models.variational import VariationalGPN

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
    "sampled-u": _run_sampled_u,
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
            ``budget.nuts_sizes`` and ``budget.sampled_u_sizes`` may give the NUTS routes their
            own.
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
    sizes = check_sizes("sizes", sizes)
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
            test_pred = pred.rows(slice(0, ctx.num_test))
            for name, value in _metrics(test_pred, data.y_test, y_std).items():
                setattr(out, name, value)
            out.pointwise_log_lik = _pointwise_log_lik(test_pred, data.y_test, y_std).numpy()
            if x_grid is not None:
                grid = pred.rows(slice(ctx.num_test, None))
                unscale = lambda t: t.numpy() * y_std + float(data.y_mean)  # noqa: E731
                out.grid_mean, out.grid_lower, out.grid_upper = (
                    unscale(t) for t in (grid.mean, grid.lower, grid.upper)
                )
        if verbose:
            print(one_line(out), flush=True)
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
