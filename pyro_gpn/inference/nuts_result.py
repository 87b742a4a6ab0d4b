"""The result of :func:`pyro_gpn.inference.mcmc.run_nuts`: draws, predictions and ArviZ data."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyro.distributions as dist
import torch
from pyro.infer import MCMC, Predictive
from torch import Tensor

from pyro_gpn.diagnostics import ConvergenceReport, convergence_report
from pyro_gpn.heads import Prediction
from pyro_gpn.models.nonparametric import NonParametricGPN

if TYPE_CHECKING:  # arviz is imported lazily: it is slow to import
    import arviz as az


__all__ = ["NUTSResult"]


class _Count(int):
    """An ``int`` that may still be called, for the former method ``num_divergences()``."""

    def __call__(self) -> int:
        warnings.warn(
            "NUTSResult.num_divergences is a property now; drop the call parentheses",
            DeprecationWarning,
            stacklevel=2,
        )
        return int(self)


@dataclass
class NUTSResult:
    """The outcome of :func:`run_nuts`.

    Attributes:
        mcmc: the Pyro :class:`~pyro.infer.MCMC` object (samples grouped by chain, diagnostics).
        samples: posterior samples of every latent site, chains concatenated (chain-major),
            ``{name: [num_chains * num_samples, *site_shape]}``.
        posterior_predictive: ``{"y_test": [num_chains * num_samples, N_L, S_test]}`` (site
            layout), empty without test inputs.
        model: the sampled model.
        x_train, y_train, x_test: the data the chain was run on.
        joint: whether the test rows were sampled by the chain (see the module docstring).
        wall_time_s: seconds spent in ``MCMC.run`` (warm-up and sampling, all chains).
        init_time_s: seconds spent finding the chains' starting points (the fits of
            every ``init`` but ``"uniform"``).
        sample_stats: per chain, the per-transition statistics recorded after warm-up
            (``energy``, ``lp``, ``n_steps``, ``tree_depth``, ``step_size``,
            ``acceptance_rate``).
        chain_wall_s, chain_cpu_s: per chain, the wall and process CPU seconds of its warm-up
            and sampling (in the process that ran it; for a resumed chain, of its first run).
    """

    mcmc: MCMC
    samples: dict[str, Tensor]
    posterior_predictive: dict[str, Tensor]
    model: NonParametricGPN
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor | None
    joint: bool
    wall_time_s: float
    init_time_s: float = 0.0
    sample_stats: list[dict[str, list[float]]] | None = None
    chain_wall_s: list[float] | None = None
    chain_cpu_s: list[float] | None = None
    _idata: object = field(default=None, init=False, repr=False, compare=False)

    @property
    def num_chains(self) -> int:
        return self.mcmc.num_chains

    @property
    def num_samples(self) -> int:
        """Draws per chain."""
        return self.mcmc.num_samples

    @property
    def task(self) -> str:
        return "regression" if self.model.likelihood == "gaussian" else "classification"

    @property
    def y_test(self) -> Tensor:
        """Posterior predictive draws of the test outputs (noise included) or labels.

        Regression: ``[num_chains * num_samples, S_test]`` for one output, else
        ``[..., S_test, N_L]``. Classification: labels ``[num_chains * num_samples, S_test]``.
        """
        if "y_test" not in self.posterior_predictive:
            raise ValueError("x_test was not given to run_nuts: there are no test predictions")
        y = self.posterior_predictive["y_test"]
        if self.task == "classification":
            return y
        y = y.mT
        return y.squeeze(-1) if y.shape[-1] == 1 else y

    def predict(self) -> Prediction:
        """The posterior predictive of the test outputs as a :class:`~pyro_gpn.heads.Prediction`,
        the ``predict`` of the other routes.

        Regression: mean and standard deviation over the draws (noise included), ``[S_test]``
        for one output, else ``[S_test, N_L]``. Classification: the class probabilities
        ``[S_test, C]`` averaged over the draws (of the probabilities, not of sampled labels)
        and their standard deviation under the posterior.
        """
        if self.task == "classification":
            if "p_test" not in self.posterior_predictive:
                raise ValueError("x_test was not given to run_nuts: there are no test predictions")
            probs = self.posterior_predictive["p_test"]
            return Prediction(probs.mean(0), probs.std(0), "classification")
        draws = self.y_test
        return Prediction(draws.mean(0), draws.std(0), "regression")

    def test_log_density(self, y_test: Tensor) -> Tensor:
        """``log p(y_test_j | theta_d)`` of every posterior draw and test row, ``[D, S_test]``.

        Each row's marginal predictive density given the draw (the test rows of one draw are
        jointly Gaussian in the non-parametric GPN; the pointwise terms are their marginals),
        for :func:`pyro_gpn.diagnostics.heldout_lpd_from_draws`.
        """
        if self.x_test is None:
            raise ValueError("x_test was not given to run_nuts: there are no test predictions")
        rows = len(self.x_train) + len(self.x_test)
        chunks = draw_chunks(self.samples, self.model, rows)
        return torch.cat([self._test_log_density(chunk, y_test) for chunk in chunks])

    def _test_log_density(self, samples: dict[str, Tensor], y_test: Tensor) -> Tensor:
        """:meth:`test_log_density` of the draws ``samples``."""
        fn = _test_site(self, samples)["fn"]
        if isinstance(fn, dist.MultivariateNormal):  # [D, N_L] batch over S_test rows
            fn = dist.Normal(fn.loc, fn.covariance_matrix.diagonal(dim1=-2, dim2=-1).sqrt())
            y = y_test.to(fn.loc.dtype)
            y = (y[:, None] if y.dim() == 1 else y).mT  # [N_L, S_test]
            return fn.log_prob(y).sum(-2)
        if self.task == "classification":
            y = y_test.reshape(-1)
            y = (
                y.to(torch.long)
                if self.model.likelihood == "categorical"
                else y.to(self.model.dtype)
            )
            return fn.log_prob(y)
        y = y_test.to(self.model.dtype)
        return fn.log_prob(y[:, None] if y.dim() == 1 else y)

    @property
    def num_divergences(self) -> int:
        """Divergent transitions after warm-up, summed over chains.

        A property like :attr:`num_chains` and :attr:`num_samples`. Calling it,
        ``result.num_divergences()``, still works but is deprecated.
        """
        divergences = self.mcmc.diagnostics()["divergences"]
        return _Count(sum(len(v) for v in divergences.values()))

    @property
    def divergence_rate(self) -> float:
        """Share of the kept transitions that diverged, over all chains."""
        return int(self.num_divergences) / (self.num_chains * self.num_samples)

    def convergence(
        self,
        rhat_threshold: float = 1.01,
        ess_per_chain: float = 100.0,
        divergence_threshold: float = 0.01,
    ) -> ConvergenceReport:
        """Whether the chains converged, judged on identified quantities only
        (:func:`~pyro_gpn.diagnostics.convergence_report`): the posterior predictive test
        outputs ``y_test`` (regression) or class probabilities ``p_test`` (classification), and
        the output layer's noise scale ``sigma{L}`` where the model samples it. Weights, hidden
        outputs and hidden units' noise are left out: unit permutations and sign flips leave
        the posterior unchanged, so chains in different symmetric copies disagree on them
        without any failure to converge (see :mod:`pyro_gpn.inference.mcmc`)."""
        shape = (self.num_chains, self.num_samples)
        draws = {}
        site = "y_test" if self.task == "regression" else "p_test"
        if site in self.posterior_predictive:
            value = self.posterior_predictive[site]
            draws[site] = value.reshape(*shape, *value.shape[1:])
        noise = f"sigma{self.model.num_layers}"
        if noise in self.samples:
            value = self.samples[noise]
            draws[noise] = value.reshape(*shape, *value.shape[1:])
        return convergence_report(
            draws,
            divergence_rate=self.divergence_rate,
            rhat_threshold=rhat_threshold,
            ess_per_chain=ess_per_chain,
            divergence_threshold=divergence_threshold,
        )

    def pointwise_log_likelihood(self) -> Tensor:
        """Per-draw, per-training-row log-likelihood terms, ``[num_chains * num_samples,
        S_train]`` (the model's ``pointwise_log_likelihood``: per-row factors, or for the
        non-parametric GPN's Gaussian likelihood the exact leave-one-out conditionals), over
        the draws in chunks (:func:`draws_per_chunk`)."""
        chunks = draw_chunks(self.samples, self.model, len(self.x_train))
        return torch.cat(
            [self.model.pointwise_log_likelihood(c, self.x_train, self.y_train) for c in chunks]
        )

    def to_arviz(self) -> az.InferenceData:
        """ArviZ ``InferenceData``: ``posterior``, ``posterior_predictive`` (``y_test``, plus
        ``p_test`` for classification), ``log_likelihood`` (``y``, from
        :meth:`pointwise_log_likelihood`, for ``az.loo`` / ``az.waic``), ``sample_stats``
        (``diverging``, and with sequential chains ``energy``, ``lp``, ``tree_depth``,
        ``n_steps``, ``step_size``, ``acceptance_rate``) and ``observed_data``; see
        :func:`pyro_gpn.diagnostics.to_inference_data`."""
        if self._idata is None:
            import numpy as np

            from pyro_gpn.diagnostics import to_inference_data

            predictive = None if self.joint else self.posterior_predictive or None
            stats = None
            if self.sample_stats is not None:
                stats = {
                    k: np.stack([np.asarray(c[k]) for c in self.sample_stats])
                    for k in self.sample_stats[0]
                }
            self._idata = to_inference_data(
                self.mcmc,
                posterior_predictive=predictive,
                log_likelihood={"y": self.pointwise_log_likelihood()},
                sample_stats=stats,
            )
        return self._idata


#: memory a vectorised pass over a chunk of posterior draws may take (bytes, an estimate)
CHUNK_BYTES = 2**28


def draws_per_chunk(model, num_rows: int) -> int:
    """How many posterior draws one vectorised re-run of ``model`` over ``num_rows`` rows takes
    at a time: each draw holds a few ``[width, rows, rows]`` kernel matrices (the non-parametric
    GPN's layers), so all draws at once -- ``4 x (500 + 3000)`` on 160 rows -- can exhaust the
    memory. :data:`CHUNK_BYTES` over four such matrices per draw, at least 1."""
    per_draw = 4 * 8 * num_rows * num_rows * max(model.sizes[1:])
    return max(1, CHUNK_BYTES // per_draw)


def draw_chunks(samples: dict[str, Tensor], model, num_rows: int):
    """``samples`` (``{site: [D, ...]}``) in consecutive chunks of at most
    :func:`draws_per_chunk` draws for a re-run of ``model`` over ``num_rows`` rows."""
    size = draws_per_chunk(model, num_rows)
    num_draws = next(iter(samples.values())).shape[0]
    for start in range(0, num_draws, size):
        yield {k: v[start : start + size] for k, v in samples.items()}


def _test_site(result: NUTSResult, samples: dict[str, Tensor]) -> dict:
    """The ``y_test`` site of a vectorised re-run of the model over the draws ``samples``."""
    with torch.no_grad():
        trace = Predictive(
            result.model.model, posterior_samples=samples, parallel=True, return_sites=[]
        ).get_vectorized_trace(result.x_train, result.y_train, result.x_test)
    return trace.nodes["y_test"]
