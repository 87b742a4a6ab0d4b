"""MCMC diagnostics with ArviZ: conversion of Pyro runs and the numbers a comparison table needs.

* :func:`to_inference_data` -- a Pyro :class:`~pyro.infer.MCMC` run (plus optional posterior
  predictive draws) as an ArviZ ``InferenceData`` with the groups ``posterior``,
  ``sample_stats`` (``diverging``), ``observed_data`` and ``posterior_predictive``.
* :func:`summarize` -- ``az.summary`` (mean, sd, HDI, MCSE, bulk/tail ESS, rank-normalised
  split r-hat) with the divergence count attached as ``DataFrame.attrs["num_divergences"]``.
* :func:`max_rhat`, :func:`min_ess`, :func:`num_divergences` -- scalar summaries.
* :func:`convergence_report` -- whether chains of draws meet the usual standard (r-hat
  <= 1.01, bulk ESS >= 100 per chain, divergences < 1 %), with what fails named
  (:class:`ConvergenceReport`; :func:`pyro_gpn.inference.run_nuts` warns with it).

r-hat is the rank-normalised split-R-hat of Vehtari et al. (2021) and ESS the bulk / tail
effective sample size, both as ArviZ computes them. Posterior quantities that a symmetry of the
model leaves unidentified (e.g. the sign of a GPN's weights, or a permutation of hidden units)
do not mix across chains by design; judge convergence on identified quantities (noise scales,
predictions) by passing ``var_names``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

if TYPE_CHECKING:
    import arviz as az
    import pandas as pd
    from pyro.infer import MCMC

__all__ = [
    "ConvergenceReport",
    "ConvergenceWarning",
    "compare_heldout_lpd",
    "convergence_report",
    "heldout_elpd",
    "heldout_lpd_from_draws",
    "max_rhat",
    "min_ess",
    "num_divergences",
    "summarize",
    "to_inference_data",
]


def to_inference_data(
    mcmc: MCMC,
    posterior_predictive: Mapping[str, Tensor] | None = None,
    *,
    log_likelihood: bool | Mapping[str, Tensor] = False,
    sample_stats: Mapping[str, np.ndarray] | None = None,
    coords: Mapping[str, Sequence] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
) -> az.InferenceData:
    """Convert a finished Pyro MCMC run to ArviZ ``InferenceData`` (``az.from_pyro``).

    Args:
        mcmc: a Pyro ``MCMC`` object after ``run``; its model is re-traced once with the run's
            arguments to collect the observed data.
        posterior_predictive: optional draws ``{name: [num_chains * num_samples, ...]}`` in the
            chain-major order of ``mcmc.get_samples()``.
        log_likelihood: ``True``: ArviZ computes the ``log_likelihood`` group by a vectorised
            re-run of the model (one term per observed site's batch element; a joint
            multivariate-normal likelihood over rows then has no per-row terms); a mapping
            ``{name: [num_chains * num_samples, S]}`` (chain-major) supplies the pointwise
            terms instead (e.g. ``NonParametricGPN.pointwise_log_likelihood``), which is what
            ``az.loo`` / ``az.waic`` need.
        sample_stats: extra per-transition statistics ``{name: [num_chains, num_samples]}``
            added to ``sample_stats`` (e.g. ``energy``, ``tree_depth``, ``step_size``).
        coords, dims: ArviZ coordinates and dimension names.

    Returns:
        ``InferenceData`` with ``posterior``, ``sample_stats`` (``diverging`` per draw),
        ``observed_data`` and, when given, ``posterior_predictive``.
    """
    import arviz as az
    from pyro.infer import MCMC

    if not isinstance(mcmc, MCMC):
        raise ValueError(f"mcmc must be a pyro.infer.MCMC, got {type(mcmc).__name__}")
    if mcmc.get_samples() is None:
        raise ValueError("mcmc has no samples: call mcmc.run(...) first")
    if posterior_predictive is not None:
        draws = mcmc.num_chains * mcmc.num_samples
        for name, value in posterior_predictive.items():
            if value.shape[0] != draws:
                raise ValueError(
                    f"posterior_predictive[{name!r}] must have {draws} draws (num_chains x "
                    f"num_samples) in its first dimension, got shape {tuple(value.shape)}"
                )
    pointwise = None
    if isinstance(log_likelihood, Mapping):
        pointwise, log_likelihood = log_likelihood, False
    idata = az.from_pyro(
        mcmc,
        posterior_predictive=None if posterior_predictive is None else dict(posterior_predictive),
        log_likelihood=bool(log_likelihood),
        coords=None if coords is None else dict(coords),
        dims=None if dims is None else dict(dims),
    )
    shape = (mcmc.num_chains, mcmc.num_samples)
    if pointwise:
        data = {}
        for name, value in pointwise.items():
            value = np.asarray(value.detach().cpu() if isinstance(value, Tensor) else value)
            if value.shape[0] != shape[0] * shape[1]:
                raise ValueError(
                    f"log_likelihood[{name!r}] must have {shape[0] * shape[1]} draws in its first "
                    f"dimension, got shape {value.shape}"
                )
            data[name] = value.reshape(*shape, *value.shape[1:])
        idata.add_groups(log_likelihood=az.dict_to_dataset(data, library=None))
    if sample_stats:
        stats = idata.sample_stats
        for name, value in sample_stats.items():
            value = np.asarray(value)
            if value.shape != shape:
                raise ValueError(
                    f"sample_stats[{name!r}] must have shape {shape}, got {value.shape}"
                )
            stats[name] = (("chain", "draw"), value)
    return idata


def summarize(
    idata: az.InferenceData,
    var_names: Sequence[str] | None = None,
    *,
    group: str = "posterior",
    hdi_prob: float = 0.9,
) -> pd.DataFrame:
    """Per-variable posterior summary: ``az.summary`` with r-hat and bulk / tail ESS.

    Args:
        idata: the ``InferenceData`` (needs ``chain`` and ``draw`` dimensions in ``group``).
        var_names: variables to include (default all in ``group``).
        group: ``"posterior"`` or ``"posterior_predictive"``.
        hdi_prob: probability mass of the reported highest-density interval.

    Returns:
        a DataFrame indexed by scalar component (e.g. ``sigma2[0]``) with columns ``mean``,
        ``sd``, ``hdi_5%``, ``hdi_95%``, ``mcse_mean``, ``mcse_sd``, ``ess_bulk``, ``ess_tail``,
        ``r_hat``; ``.attrs["num_divergences"]`` holds the run's divergent transitions (``None``
        without ``sample_stats``).
    """
    import arviz as az

    _check_group(idata, group)
    table = az.summary(
        idata, var_names=_names(var_names), group=group, hdi_prob=hdi_prob, kind="all"
    )
    table.attrs["num_divergences"] = num_divergences(idata) if _has_diverging(idata) else None
    return table


def max_rhat(
    idata: az.InferenceData, var_names: Sequence[str] | None = None, *, group: str = "posterior"
) -> float:
    """The largest rank-normalised split r-hat over all scalar components of ``var_names``."""

    _check_group(idata, group)
    return _max_rhat(_select(idata, var_names, group))


def min_ess(
    idata: az.InferenceData,
    var_names: Sequence[str] | None = None,
    *,
    kind: str = "bulk",
    group: str = "posterior",
) -> float:
    """The smallest effective sample size (``kind`` ``"bulk"`` or ``"tail"``) of ``var_names``."""

    if kind not in ("bulk", "tail"):
        raise ValueError(f"kind must be 'bulk' or 'tail', got {kind!r}")
    _check_group(idata, group)
    return _min_ess(_select(idata, var_names, group), kind)


def _max_rhat(dataset) -> float:
    """The largest r-hat over every scalar component of an ArviZ dataset."""
    import arviz as az

    rhat = az.rhat(dataset)
    return float(max(np.nanmax(v.values) for v in rhat.data_vars.values()))


def _min_ess(dataset, kind: str = "bulk") -> float:
    """The smallest ESS (``kind`` ``"bulk"`` / ``"tail"``) over an ArviZ dataset's components."""
    import arviz as az

    ess = az.ess(dataset, method=kind)
    return float(min(np.nanmin(v.values) for v in ess.data_vars.values()))


class ConvergenceWarning(UserWarning):
    """MCMC chains that do not meet the standard of :class:`ConvergenceReport`."""


@dataclass(frozen=True)
class ConvergenceReport:
    """Whether MCMC chains meet the standard of Vehtari et al. (2021, "Rank-normalization,
    folding, and localization: an improved R-hat"): rank-normalised split r-hat at most
    ``rhat_threshold`` (1.01) and bulk ESS at least ``ess_threshold`` (100 per chain) on every
    scalar component of the checked quantities, and divergent transitions below
    ``divergence_threshold`` (1 %) of the kept ones.

    Attributes:
        quantities: the names checked (identified quantities: predictions, the output noise).
        max_rhat: the largest r-hat over their components (``nan`` if none was checked).
        min_ess_bulk: the smallest bulk ESS over their components.
        divergence_rate: divergent share of the kept transitions.
        num_chains, num_draws: chains, kept draws per chain.
        rhat_threshold, ess_threshold, divergence_threshold: the standard.
    """

    quantities: tuple[str, ...]
    max_rhat: float
    min_ess_bulk: float
    divergence_rate: float
    num_chains: int
    num_draws: int
    rhat_threshold: float
    ess_threshold: float
    divergence_threshold: float

    @property
    def problems(self) -> list[str]:
        """What fails the standard, one phrase each (empty: converged)."""
        out = []
        if self.max_rhat > self.rhat_threshold:
            out.append(f"max r-hat {self.max_rhat:.3f} > {self.rhat_threshold}")
        if self.min_ess_bulk < self.ess_threshold:
            out.append(f"min bulk ESS {self.min_ess_bulk:.1f} < {self.ess_threshold:g}")
        if self.divergence_rate >= self.divergence_threshold:
            out.append(
                f"{100 * self.divergence_rate:.1f} % divergent transitions "
                f"(>= {100 * self.divergence_threshold:g} %)"
            )
        return out

    @property
    def converged(self) -> bool:
        """All quantities meet the standard (and at least one was checked)."""
        return bool(self.quantities) and not self.problems

    def __str__(self) -> str:
        what = ", ".join(self.quantities) or "no identified quantity"
        verdict = "meet the standard" if self.converged else "; ".join(self.problems)
        return f"{self.num_chains} chain(s) x {self.num_draws} draws, checked on {what}: {verdict}"


def convergence_report(
    draws: Mapping[str, Tensor | np.ndarray],
    *,
    divergence_rate: float = 0.0,
    rhat_threshold: float = 1.01,
    ess_per_chain: float = 100.0,
    divergence_threshold: float = 0.01,
) -> ConvergenceReport:
    """Check chains of draws against the standard of :class:`ConvergenceReport`.

    Args:
        draws: ``{name: [num_chains, num_draws, *shape]}`` draws of identified quantities
            (every scalar component is checked), at least 4 draws per chain.
        divergence_rate: divergent share of the kept transitions.
        rhat_threshold: the largest r-hat accepted (1.01).
        ess_per_chain: the bulk ESS asked per chain (100: 400 for four chains).
        divergence_threshold: the divergent share that fails (1 %).

    Returns:
        a :class:`ConvergenceReport`.

    Raises:
        ValueError: draws with fewer than two dimensions, differing chain or draw counts, fewer
            than 4 draws, or non-finite draws.
    """
    import arviz as az

    arrays = {}
    for name, value in draws.items():
        array = np.asarray(value.detach().cpu() if isinstance(value, Tensor) else value, float)
        if array.ndim < 2 or array.shape[1] < 4:
            raise ValueError(
                f"draws[{name!r}] must be [num_chains, num_draws >= 4, ...], got {array.shape}"
            )
        if not np.isfinite(array).all():
            raise ValueError(f"draws[{name!r}] holds non-finite values")
        arrays[name] = array
    shapes = {a.shape[:2] for a in arrays.values()}
    if len(shapes) > 1:
        raise ValueError(f"draws must share [num_chains, num_draws], got {sorted(shapes)}")
    chains, num_draws = shapes.pop() if shapes else (0, 0)
    max_r, min_e = float("nan"), float("nan")
    if arrays:
        dataset = az.convert_to_dataset(arrays)
        max_r, min_e = _max_rhat(dataset), _min_ess(dataset)
    return ConvergenceReport(
        quantities=tuple(arrays),
        max_rhat=max_r,
        min_ess_bulk=min_e,
        divergence_rate=float(divergence_rate),
        num_chains=chains,
        num_draws=num_draws,
        rhat_threshold=rhat_threshold,
        ess_threshold=ess_per_chain * chains,
        divergence_threshold=divergence_threshold,
    )


def num_divergences(idata: az.InferenceData) -> int:
    """Divergent transitions after warm-up, summed over chains (``sample_stats.diverging``)."""
    if not _has_diverging(idata):
        raise ValueError("idata must have a sample_stats group with a 'diverging' variable")
    return int(idata.sample_stats["diverging"].values.sum())


def _has_diverging(idata: az.InferenceData) -> bool:
    return "sample_stats" in idata.groups() and "diverging" in idata.sample_stats


def _check_group(idata: az.InferenceData, group: str) -> None:
    if group not in idata.groups():
        raise ValueError(f"group {group!r} is not in idata, which has {list(idata.groups())}")


def _names(var_names: Sequence[str] | None) -> list[str] | None:
    if isinstance(var_names, str):
        return [var_names]
    return None if var_names is None else list(var_names)


def _select(idata: az.InferenceData, var_names: Sequence[str] | None, group: str):
    dataset = idata[group]
    names = _names(var_names)
    if names is None:
        return dataset
    missing = [n for n in names if n not in dataset]
    if missing:
        raise ValueError(f"var_names {missing} are not in group {group!r}")
    return dataset[names]


def heldout_lpd_from_draws(log_density: Tensor | np.ndarray) -> np.ndarray:
    """Pointwise log predictive density of held-out rows from per-draw log densities.

    ``log p(y_j | data) ~= log mean_d p(y_j | theta_d)`` (log-sum-exp over the draws).

    Shape:
        ``[D, S_test]`` -> ``[S_test]``.
    """
    from scipy.special import logsumexp

    values = np.asarray(
        log_density.detach().cpu() if isinstance(log_density, Tensor) else log_density,
        dtype=float,
    )
    if values.ndim != 2:
        raise ValueError(f"log_density must be [draws, rows], got shape {values.shape}")
    return logsumexp(values, axis=0) - np.log(values.shape[0])


def heldout_elpd(pointwise_lpd: Tensor | np.ndarray, num_draws: int = 1):
    """ArviZ ``ELPDData`` holding a route's pointwise test log predictive densities.

    Held-out data need no leave-one-out correction, so the expected log predictive density is
    the plain sum ``elpd = sum_j log p(y_j | data)`` with standard error
    ``sqrt(S_test) sd_j``. It is stored in ArviZ's LOO layout (``elpd_loo``, ``loo_i``,
    ``p_loo = 0``, no Pareto ``k``) so that ``az.compare`` ranks routes by it and computes the
    standard errors of the differences pointwise; ArviZ labels the column ``elpd_loo``.

    Args:
        pointwise_lpd: ``[S_test]`` log predictive density of each test row (for a sampling
            route, :func:`heldout_lpd_from_draws`; for a closed-form route, its predictive's
            ``log_prob``).
        num_draws: the number of posterior draws behind it (informational).
    """
    import xarray as xr
    from arviz.stats.stats_utils import ELPDData

    values = np.asarray(
        pointwise_lpd.detach().cpu() if isinstance(pointwise_lpd, Tensor) else pointwise_lpd,
        dtype=float,
    )
    if values.ndim != 1 or not np.isfinite(values).all():
        raise ValueError(
            f"pointwise_lpd must be a finite [S_test] vector, got shape {values.shape}"
        )
    n = values.shape[0]
    return ELPDData(
        data=[
            float(values.sum()),
            float(np.sqrt(n) * values.std()),
            0.0,
            int(num_draws),
            n,
            False,
            xr.DataArray(values, dims=["test_row"]).rename("loo_i"),
            xr.DataArray(np.zeros(n), dims=["test_row"]),
            "log",
            0.7,
        ],
        index=[
            "elpd_loo",
            "se",
            "p_loo",
            "n_samples",
            "n_data_points",
            "warning",
            "loo_i",
            "pareto_k",
            "scale",
            "good_k",
        ],
    )


def compare_heldout_lpd(routes: Mapping[str, Tensor | np.ndarray]) -> pd.DataFrame:
    """``az.compare`` of routes by their pointwise test log predictive densities.

    Args:
        routes: ``{route name: [S_test] pointwise test log predictive density}``, every route on
            the same test rows (NUTS: :func:`heldout_lpd_from_draws` of its per-draw densities;
            variational routes: the closed-form predictive's log density per row).

    Returns:
        ArviZ's comparison table (rank, ``elpd_loo`` = the test elpd, ``elpd_diff``, ``dse``
        from the pointwise differences, ``weight`` by stacking).
    """
    import arviz as az

    if len(routes) < 2:
        raise ValueError(f"routes must hold at least two routes, got {list(routes)}")
    sizes = {name: np.shape(v) for name, v in routes.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"every route must score the same test rows, got shapes {sizes}")
    return az.compare({name: heldout_elpd(v) for name, v in routes.items()}, ic="loo")
