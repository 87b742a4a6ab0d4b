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
``sampled-u``       :class:`~pyro_gpn.models.SampledTargetsGPN` sampled by ``run_nuts``: NUTS
                    over the variational model's targets ``U`` (with their GP prior), weights
                    and noise, the activations integrated in closed form (central limit); its
                    posterior's dimension does not grow with the rows, so it runs on all of them
                    (widths ``budget.sampled_u_sizes``, ``budget.sampled_u_inducing`` targets
                    per unit, the NUTS budget of ``nuts``)
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
  which :class:`~pyro_gpn.models.VariationalGPN` inherits); the two ``vgpn`` routes are evaluated
  identically, so they differ only in the objective they were trained with). For the sampling
  routes (``nuts``, ``sampled-u``, ``parametric-svi``) it is the **moment-matched Gaussian** of
  the predictive draws (noise included): their sample mean and variance. Mixtures over draws are
  not used, because ``NUTS`` and ``ParametricGPN.predict`` return draws of the noisy outputs, not
  per-draw Gaussians (``sampled-u`` has them, and is summarised like ``nuts`` all the same, so
  that the two NUTS routes compare on equal terms);
* ``coverage90``: the fraction of test targets inside the central 90 % predictive interval:
  ``m +- 1.645 sqrt(v)`` for the Gaussian routes, the empirical 5 % and 95 % quantiles of the
  draws for the sampling routes (the same intervals are drawn in
  :func:`~pyro_gpn.plotting.plot_comparison`);
* ``wall_s``: seconds of training (NUTS: warm-up and sampling; the periodic evaluations that
  record the learning curves of the ``vgpn`` routes are excluded);
* NUTS routes only: ``max_rhat`` (rank-normalised split r-hat), ``min_ess`` (bulk ESS) and the
  number of divergent transitions. r-hat and ESS are taken over the *identified* quantities, the
  noise scales ``sigma{l}`` (``sampled-u``: the output layer's) and the posterior-predictive test
  outputs; weights and targets are left out because their sign and the order of hidden units are
  not identified (``pyro_gpn.diagnostics``).

**Learning curves and time to a target.** The ``vgpn`` routes record the test log-likelihood
every ``budget.eval_every`` steps against their training wall time (:attr:`RouteResult.curve`);
:meth:`ComparisonResult.time_to_target` reads off the training time from which each stays at or
above a given test log-likelihood -- the benchmark of the closed-form ELBO against
``Trace_ELBO``.

:func:`~pyro_gpn.data.synthetic_1d` makes a 1-D problem with a gap in the training inputs (so
the bands show epistemic uncertainty), :func:`~pyro_gpn.plotting.plot_comparison` draws the
predictions, and :func:`add_compare_parser` / :func:`run_compare_cli` are the
``pyro-gpn compare`` subcommand.

Modules: :mod:`~.settings` (:data:`ROUTES`, :class:`RouteBudget`), :mod:`~.results`
(:class:`RouteResult`, :class:`ComparisonResult`, markdown), :mod:`~.runners`
(:func:`compare_routes`), :mod:`~.cli` (the subcommand); the metrics are
:mod:`pyro_gpn.metrics`.
"""

from .cli import (
    add_compare_parser,
    add_route_start_arguments,
    route_start_settings,
    run_compare_cli,
)
from .results import METRICS, ComparisonResult, RouteResult, aggregate_markdown
from .runners import Z90, compare_routes
from .settings import ROUTE_LABELS, ROUTES, RouteBudget

__all__ = [
    "METRICS",
    "ROUTES",
    "ROUTE_LABELS",
    "Z90",
    "ComparisonResult",
    "RouteBudget",
    "RouteResult",
    "add_compare_parser",
    "add_route_start_arguments",
    "aggregate_markdown",
    "compare_routes",
    "route_start_settings",
    "run_compare_cli",
]
