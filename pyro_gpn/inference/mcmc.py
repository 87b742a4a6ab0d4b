r"""Exact Bayesian inference in the non-parametric GPN by NUTS (paper: "Non-Parametric Training
and Inference", route 1 of ``fig:gpn_overview``).

:func:`run_nuts` samples the posterior of the weights, noise scales (and lengthscales, if
sampled) and hidden outputs of a :class:`~pyro_gpn.models.nonparametric.NonParametricGPN` given
the training data, with Pyro's :class:`~pyro.infer.mcmc.NUTS`, and returns the posterior
predictive of the test outputs.

**Where the test predictions come from.** The training likelihood does not depend on the test
rows (each layer's test outputs enter only the test rows of the layers above), so

.. math::

    p(\theta, X_{\text{train}}, X_{\text{test}} \mid y) =
    p(\theta, X_{\text{train}} \mid y)\; p(X_{\text{test}} \mid \theta, X_{\text{train}}, y),

with the second factor a product of Gaussian conditionals, layer by layer. Two exact ways to
sample it are offered:

* ``joint=False`` (default): NUTS on the training rows only (``S_train x S_train``
  factorisations, fewer latent dimensions), then each posterior draw is pushed through the
  test-row conditionals by :class:`~pyro.infer.Predictive` -- independent, exact draws of the
  test outputs given every MCMC state.
* ``joint=True``: the paper's literal formulation; all test rows (hidden and output) are latent
  variables of the chain and the predictive draws are the chain's own ``y_test`` samples.

Both target the same distribution; the first is cheaper and mixes no worse.

**What the defaults do for mixing** (measurements in ``docs/results/nuts.md``):

* the model integrates the last layer out and, with ``collapse=True``, samples the last layer's
  activations instead of the last hidden layer's outputs (exact, fewer dimensions, no hidden
  unit symmetries); latent rows are whitened by the Cholesky factor of their own prior
  covariance;
* ``init="fit"``: every chain starts from its own maximum-a-posteriori fit
  (:func:`fit_initial_params`), apart from the others;
* ``metric="dense-block"``: a dense mass matrix for the per-unit parameters;
* ``jit_compile=True``: the potential energy is traced once per chain.

**Which r-hat to read.** The posterior is invariant under permutations of a layer's hidden
units and under sign flips (``w -> -w`` leaves ``eq:gpn_cov_fn`` unchanged; negating a hidden
unit's outputs and the next layer's weights on it leaves the network unchanged), so it has many
symmetric copies and the chains settle in different ones. r-hat and ESS of weights, hidden
outputs or whitened activations then measure which copy a chain is in, not convergence: judge
the run on identified quantities -- the posterior predictive test outputs ``y_test`` (or class
probabilities ``p_test``) and the noise scales -- e.g.
``max_rhat(idata, ["y_test"], group="posterior_predictive")``.

**ArviZ.** :meth:`NUTSResult.to_arviz` returns ``posterior``, ``posterior_predictive``,
``log_likelihood`` (pointwise terms for ``az.loo`` / ``az.waic``), ``sample_stats`` (with the
energy for ``az.bfmi`` and ``az.plot_energy``) and ``observed_data``;
:meth:`NUTSResult.test_log_density` with
:func:`~pyro_gpn.diagnostics.heldout_lpd_from_draws` and
:func:`~pyro_gpn.diagnostics.compare_heldout_lpd` compares routes on held-out rows.

:class:`~pyro_gpn.models.sampled_targets.SampledTargetsGPN` runs through the same
:func:`run_nuts` (its posterior has no per-row dimensions).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS, Predictive
from torch import Tensor

from pyro_gpn.heads import Prediction
from pyro_gpn.models.nonparametric import NonParametricGPN
from pyro_gpn.models.sampled_targets import SampledTargetsGPN

if TYPE_CHECKING:  # arviz is imported lazily: it is slow to import
    import arviz as az

__all__ = ["METRICS", "NUTSResult", "fit_initial_params", "laplace_inverse_mass", "run_nuts"]

METRICS = ("laplace", "dense-block", "dense", "diag")
"""NUTS metrics (mass matrices) offered by :func:`run_nuts`."""


class _Count(int):
    """An ``int`` that may still be called, for the former method ``num_divergences()``."""

    def __call__(self) -> int:
        warnings.warn(
            "NUTSResult.num_divergences is a property now; drop the call parentheses",
            DeprecationWarning,
            stacklevel=2,
        )
        return int(self)


class _RecordingNUTS(NUTS):
    """Pyro's NUTS that records per-transition statistics for ArviZ's ``sample_stats``.

    For every transition after warm-up: ``energy`` (the Hamiltonian at the start of the
    trajectory, kinetic energy of the fresh momentum plus the potential energy; NUTS conserves
    it along the trajectory up to the integrator's error, and it is what ArviZ's energy plot
    and BFMI need), ``n_steps`` (leapfrog steps = gradient evaluations), ``tree_depth``
    (``ceil(log2(n_steps + 1))``), ``step_size``, ``acceptance_rate`` (the mean Metropolis
    acceptance probability over the trajectory) and ``lp`` (the unnormalised log density of the
    kept state, minus the potential energy). One list per chain (sequential chains only: parallel
    chains run in other processes and their records are not returned).
    """

    def __init__(self, *args, inverse_mass: list[Tensor] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.inverse_mass = inverse_mass
        self.records: list[dict[str, list[float]]] = []
        self._kinetic: float | None = None
        self._in_sample = False
        self._grad_calls = 0

    def setup(self, warmup_steps, *args, **kwargs):
        super().setup(warmup_steps, *args, **kwargs)
        if self.inverse_mass is not None:
            (block,) = self.mass_matrix_adapter.inverse_mass_matrix
            matrix = self.inverse_mass[len(self.records) % len(self.inverse_mass)]
            self.mass_matrix_adapter.inverse_mass_matrix = {block: matrix}
            z, _, _ = self._fetch_from_cache()
            self._adapter.reset_step_size_adaptation(z)
        inner = self.potential_fn

        def counted(z):
            self._grad_calls += 1
            return inner(z)

        self.potential_fn = counted
        self.records.append({k: [] for k in _STAT_NAMES})

    def _sample_r(self, name):
        r, r_unscaled = super()._sample_r(name)
        if self._in_sample and self._kinetic is None:
            self._kinetic = float(self._kinetic_energy(r_unscaled))
        return r, r_unscaled

    def sample(self, params):
        _, start_pe, _ = self._fetch_from_cache()
        t, mean_accept = self._t, self._mean_accept_prob
        self._in_sample, self._kinetic, self._grad_calls = True, None, 0
        try:
            z = super().sample(params)
        finally:
            self._in_sample = False
        if t >= self._warmup_steps and self._kinetic is not None:
            n = self._t - self._warmup_steps
            accept = n * self._mean_accept_prob - (n - 1) * mean_accept
            _, pe, _ = self._fetch_from_cache()
            steps = self._grad_calls
            rec = self.records[-1]
            rec["energy"].append(self._kinetic + float(start_pe))
            rec["lp"].append(-float(pe))
            rec["n_steps"].append(steps)
            rec["tree_depth"].append(math.ceil(math.log2(steps + 1)))
            rec["step_size"].append(float(self.step_size))
            rec["acceptance_rate"].append(float(accept))
        return z


_STAT_NAMES = ("energy", "lp", "n_steps", "tree_depth", "step_size", "acceptance_rate")


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
        init_time_s: seconds spent finding the chains' starting points (``init="fit"``).
        sample_stats: per chain, the per-transition statistics recorded after warm-up
            (``energy``, ``lp``, ``n_steps``, ``tree_depth``, ``step_size``,
            ``acceptance_rate``); ``None`` when the chains ran in other processes.
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
        fn = _test_site(self)["fn"]
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

    def pointwise_log_likelihood(self) -> Tensor:
        """Per-draw, per-training-row log-likelihood terms, ``[num_chains * num_samples,
        S_train]`` (the model's ``pointwise_log_likelihood``: per-row factors, or for the
        non-parametric GPN's Gaussian likelihood the exact leave-one-out conditionals)."""
        return self.model.pointwise_log_likelihood(self.samples, self.x_train, self.y_train)

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


def _test_site(result: NUTSResult) -> dict:
    """The ``y_test`` site of a vectorised re-run of the model over the posterior draws."""
    with torch.no_grad():
        trace = Predictive(
            result.model.model, posterior_samples=result.samples, parallel=True, return_sites=[]
        ).get_vectorized_trace(result.x_train, result.y_train, result.x_test)
    return trace.nodes["y_test"]


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

    Args:
        model, x_train, y_train, x_test: as for :func:`run_nuts` (``x_test`` only when the test
            rows are sampled by the chain, ``joint=True``).
        num_chains: number of independent fits.
        steps, lr: Adam steps and learning rate of each fit.
        radius: half-width of the uniform starts.
        seed: seeds the starts.
        jit_compile: JIT-compile the potential energy.

    Returns:
        ``{site: [num_chains, *site_shape]}`` in the unconstrained space, for ``MCMC``'s
        ``initial_params``.
    """
    from pyro.infer.mcmc.util import initialize_model

    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=".*torch.jit.trace. is deprecated")
        init, potential_fn, _, _ = initialize_model(
            model.model,
            (x_train, y_train, x_test),
            jit_compile=jit_compile,
            skip_jit_warnings=True,
        )
    gen = torch.Generator().manual_seed(seed)
    starts: dict[str, list[Tensor]] = {k: [] for k in init}
    for _ in range(num_chains):
        params = {
            k: (
                (torch.rand(v.shape, generator=gen, dtype=v.dtype) * 2 - 1) * radius
            ).requires_grad_()
            for k, v in init.items()
        }
        best = {k: v.detach().clone() for k, v in params.items()}
        best_energy = math.inf
        optim = torch.optim.Adam(list(params.values()), lr=lr)
        for _ in range(steps):
            optim.zero_grad()
            energy = potential_fn(params)
            if not torch.isfinite(energy):
                break
            if float(energy.detach()) < best_energy:
                best_energy = float(energy.detach())
                best = {k: v.detach().clone() for k, v in params.items()}
            energy.backward()
            optim.step()
        for k, v in best.items():
            starts[k].append(v)
    return {k: torch.stack(v) for k, v in starts.items()}


def laplace_inverse_mass(
    model: NonParametricGPN,
    x_train: Tensor,
    y_train: Tensor,
    x_test: Tensor | None,
    params: dict[str, Tensor],
    *,
    min_curvature: float = 0.01,
) -> list[Tensor]:
    """Inverse Hessians of the potential energy at each chain's start: a dense metric for NUTS.

    The Laplace approximation's covariance at the fitted point, in the unconstrained space and
    Pyro's block order (sites sorted by name, each flattened). It captures what a diagonal
    metric cannot and what a dense one adapted from a few hundred warm-up draws estimates
    badly in hundreds of dimensions: the hidden outputs' whitened coordinates are constrained
    by the data only along a few rotated directions (the smooth eigenvectors of the layer's
    kernel matrix, scale ``~ noise / sqrt(S)``) and by the prior (scale 1) along the rest.
    Eigenvalues of the Hessian below ``min_curvature`` (flat or negatively curved directions,
    where the start is not a strict maximum) are raised to it.

    Args:
        params: ``{site: [num_chains, *shape]}`` unconstrained starts (from
            :func:`fit_initial_params`).

    Returns:
        one ``[D, D]`` inverse mass matrix per chain.
    """
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
        hess = 0.5 * (hess + hess.mT)
        evals, evecs = torch.linalg.eigh(hess)
        if not torch.isfinite(evals).all():
            out.append(torch.eye(flat.numel(), dtype=flat.dtype))
            continue
        evals = evals.clamp_min(min_curvature)
        out.append((evecs / evals) @ evecs.mT)
    return out


def run_nuts(
    model: NonParametricGPN,
    x_train: Tensor,
    y_train: Tensor,
    x_test: Tensor | None = None,
    *,
    num_samples: int = 500,
    warmup_steps: int = 500,
    num_chains: int = 2,
    seed: int = 0,
    joint: bool = False,
    target_accept_prob: float = 0.8,
    max_tree_depth: int = 10,
    init: str = "fit",
    init_steps: int = 500,
    metric: str = "dense-block",
    init_strategy: Callable | None = None,
    jit_compile: bool = True,
    mp_context: str | None = None,
    disable_progbar: bool = True,
) -> NUTSResult:
    """Sample the posterior of a non-parametric GPN with NUTS and predict the test outputs.

    Args:
        model: the network (its priors, parametrisation and dtype).
        x_train: ``[S_train, M]`` training inputs.
        y_train: ``[S_train]`` or ``[S_train, N_L]`` training targets.
        x_test: optional ``[S_test, M]`` test inputs.
        num_samples: draws kept per chain.
        warmup_steps: adaptation steps per chain (step size and mass matrix), discarded.
        num_chains: independent chains. Pyro runs them in parallel processes when more than
            ``num_chains`` CPUs are free, else one after another in this process (the
            sequential path is the one tested here, and the only one that records the
            per-transition ``sample_stats`` beyond divergences).
        seed: seeds Pyro's RNGs (initialisation, momenta, predictive draws).
        joint: sample the test rows inside the chain (paper's formulation) instead of drawing
            them from their exact conditionals afterwards (see the module docstring).
        target_accept_prob: NUTS step-size adaptation target; raise it (e.g. 0.9) when
            divergences appear.
        max_tree_depth: NUTS tree depth limit (at most ``2^depth - 1`` leapfrog steps per draw).
        init: where the chains start. ``"fit"`` (default): each chain from its own
            maximum-a-posteriori fit of the model (:func:`fit_initial_params`, ``init_steps``
            Adam steps from an independent uniform start), so that the chains start apart but
            near the posterior's bulk; ``"uniform"``: Pyro's ``init_to_uniform`` (radius 2 in
            the unconstrained space). Ignored when ``init_strategy`` is given.
        init_steps: Adam steps of each chain's fit for ``init="fit"``.
        metric: the mass matrix. ``"dense-block"`` (default): adapted, dense for the per-unit
            parameters (weights, noise scales, lengthscales), which are strongly correlated
            (a unit's weight scale trades off against the next layer's weights and the noise),
            and diagonal for the per-row latent outputs, whose number grows with the rows;
            ``"dense"``: adapted, dense for everything; ``"diag"``: adapted, diagonal (Pyro's
            default); ``"laplace"`` (needs ``init="fit"``): dense and fixed to the inverse
            Hessian of the potential at each chain's fitted start
            (:func:`laplace_inverse_mass`), only the step size adapted.
        init_strategy: a Pyro init strategy instead of ``init``.
        jit_compile: JIT-compile the potential energy. On by default: the model's control flow
            depends only on shapes, so the trace is exact, and it removes the Python overhead
            that dominates small problems (one chain of 100 + 100 draws of a ``[1, 1]`` network
            on 15 points took 4.4 s instead of 16 s on this project's shared 2-core machine).
        mp_context: multiprocessing context for parallel chains (e.g. ``"spawn"``).
        disable_progbar: hide Pyro's progress bar.

    Returns:
        a :class:`NUTSResult`.
    """
    if not isinstance(model, (NonParametricGPN, SampledTargetsGPN)):
        raise ValueError(
            f"model must be a NonParametricGPN or SampledTargetsGPN, got {type(model).__name__}"
        )
    if y_train is None:
        raise ValueError("y_train must be given: NUTS samples the posterior given the targets")
    for name, value, least in (
        ("num_samples", num_samples, 1),
        ("warmup_steps", warmup_steps, 0),
        ("num_chains", num_chains, 1),
        ("max_tree_depth", max_tree_depth, 1),
        ("init_steps", init_steps, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    if not 0.0 < target_accept_prob < 1.0:
        raise ValueError(f"target_accept_prob must lie in (0, 1), got {target_accept_prob}")
    if init not in ("fit", "uniform"):
        raise ValueError(f"init must be 'fit' or 'uniform', got {init!r}")
    model.check_data(x_train, y_train, x_test)  # raise ValueError before starting the chains

    pyro.set_rng_seed(seed)
    start = time.perf_counter()
    initial_params = None
    kernel_kwargs: dict = {}
    if init_strategy is not None:
        kernel_kwargs["init_strategy"] = init_strategy
    elif init == "fit":
        initial_params = fit_initial_params(
            model,
            x_train,
            y_train,
            x_test if joint else None,
            num_chains=num_chains,
            steps=init_steps,
            seed=seed,
            jit_compile=jit_compile,
        )
        if num_chains == 1:
            initial_params = {k: v[0] for k, v in initial_params.items()}
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    inverse_mass = None
    if metric == "laplace" and initial_params is not None:
        chains = (
            initial_params if num_chains > 1 else {k: v[None] for k, v in initial_params.items()}
        )
        inverse_mass = laplace_inverse_mass(
            model, x_train, y_train, x_test if joint else None, chains
        )
        kernel_kwargs.update(full_mass=True, adapt_mass_matrix=False)
    elif metric == "laplace":
        raise ValueError("metric='laplace' needs init='fit' (the Hessian at the fitted start)")
    elif metric == "dense-block":
        block = tuple(sorted(model.parameter_sites()))
        kernel_kwargs["full_mass"] = [block] if block else False
    elif metric == "dense":
        kernel_kwargs["full_mass"] = True
    kernel = _RecordingNUTS(
        model.model,
        target_accept_prob=target_accept_prob,
        max_tree_depth=max_tree_depth,
        jit_compile=jit_compile,
        ignore_jit_warnings=jit_compile,
        inverse_mass=inverse_mass,
        **kernel_kwargs,
    )
    with warnings.catch_warnings():
        # expected on small machines, and torch's notice about the JIT Pyro uses internally
        warnings.filterwarnings("ignore", message="num_chains=.*Chains will be drawn sequentially")
        warnings.filterwarnings("ignore", message=".*torch.jit.trace. is deprecated")
        mcmc = MCMC(
            kernel,
            num_samples=num_samples,
            warmup_steps=warmup_steps,
            num_chains=num_chains,
            initial_params=initial_params,
            mp_context=mp_context,
            disable_progbar=disable_progbar,
        )
        init_time = time.perf_counter() - start
        start = time.perf_counter()
        mcmc.run(x_train, y_train, x_test if joint else None)
        wall_time = time.perf_counter() - start
    samples = mcmc.get_samples()

    predictive: dict[str, Tensor] = {}
    if x_test is not None:
        if joint:
            predictive = {"y_test": samples["y_test"]}
        else:
            sites = ["y_test"] + (["p_test"] if model.likelihood != "gaussian" else [])
            draw = Predictive(
                model.model, posterior_samples=samples, return_sites=sites, parallel=True
            )
            with torch.no_grad():
                predictive = draw(x_train, y_train, x_test)
        if "p_test" in predictive:  # a deterministic site: Predictive pads a plate dimension
            p_test = predictive["p_test"]
            predictive["p_test"] = p_test.reshape(p_test.shape[0], *p_test.shape[-2:])
        if isinstance(model, SampledTargetsGPN) and model.likelihood == "gaussian":
            predictive["y_test"] = predictive["y_test"].mT  # the [N_L, S_test] site layout
    stats = kernel.records if len(kernel.records) == num_chains else None
    return NUTSResult(
        mcmc=mcmc,
        samples=samples,
        posterior_predictive=predictive,
        model=model,
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        joint=joint,
        wall_time_s=wall_time,
        init_time_s=init_time,
        sample_stats=stats,
    )
