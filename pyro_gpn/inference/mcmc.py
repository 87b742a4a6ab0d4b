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
* ``init="fit-prior-noise"``: every chain starts from its own maximum-a-posteriori fit
  (:func:`fit_initial_params`) with the noise scales held at their prior median, apart from the
  others (a fit of the noise too overfits it: the MAP is over the latent activations as well);
* ``metric="dense-block"``: a dense mass matrix for the per-unit parameters, and
  ``shrink_dense=True``: each warm-up window's dense estimate shrunk towards its diagonal
  (:class:`~pyro_gpn.inference.nuts_kernel.ShrunkBlockMassMatrix`), so that a window with fewer
  draws than dimensions does not leave most directions with a ``1e-4`` variance;
* ``jit_compile=True``: the potential energy is traced once per chain.

**Which r-hat to read.** The posterior is invariant under permutations of a layer's hidden
units and under sign flips (``w -> -w`` leaves ``eq:gpn_cov_fn`` unchanged; negating a hidden
unit's outputs and the next layer's weights on it leaves the network unchanged), so it has many
symmetric copies and the chains settle in different ones. r-hat and ESS of weights, hidden
outputs or whitened activations then measure which copy a chain is in, not convergence: judge
the run on identified quantities -- the posterior predictive test outputs ``y_test`` (or class
probabilities ``p_test``) and the noise scales -- e.g.
``max_rhat(idata, ["y_test"], group="posterior_predictive")``. :meth:`NUTSResult.convergence`
does this against the usual standard (r-hat <= 1.01, bulk ESS >= 100 per chain, divergences
< 1 %), and :func:`run_nuts` warns (``ConvergenceWarning``) when a run falls short.

**Running the chains.** Each chain is its own Pyro ``MCMC``
(:mod:`pyro_gpn.inference.nuts_chains`): ``workers`` chains at a time in spawned processes (Pyro's
own parallel chains need ``num_chains <= cpu_count - 1``), a progress line per chain every
``progress_every`` iterations, and with ``checkpoint_dir`` every finished chain saved, so that an
interrupted run resumes. Chain ``c`` is seeded by ``(seed, c)`` alone, so the draws do not depend
on ``workers``.

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

import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pyro
import torch
from pyro.infer import MCMC, Predictive
from torch import Tensor

from pyro_gpn._validation import check_int
from pyro_gpn.diagnostics import ConvergenceWarning
from pyro_gpn.models.nonparametric import NonParametricGPN
from pyro_gpn.models.sampled_targets import SampledTargetsGPN

from .nuts_chains import ChainSpec, merge_chains, run_chains
from .nuts_informed import informed_chain_models, twin, whitened_samples
from .nuts_kernel import RecordingNUTS
from .nuts_result import NUTSResult, draw_chunks
from .nuts_setup import (
    fit_initial_params,
    hessian_diagonal_inverse_mass,
    laplace_inverse_mass,
    noise_prior_medians,
)

__all__ = [
    "INITS",
    "METRICS",
    "METRIC_STARTS",
    "NUTSResult",
    "fit_initial_params",
    "laplace_inverse_mass",
    "run_nuts",
]

INITS = ("fit-prior-noise", "best-fit-prior-noise", "fit", "uniform")
"""Where :func:`run_nuts` starts its chains (``init=``)."""

METRICS = ("laplace", "laplace-dense", "dense-block", "dense-activations", "dense", "diag")
"""NUTS metrics (mass matrices) offered by :func:`run_nuts`."""

METRIC_STARTS = ("hessian-diag", "identity")
"""The metrics :func:`run_nuts`' warm-up starts from (``metric_start=``)."""


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
    init: str = "fit-prior-noise",
    init_steps: int = 500,
    metric: str = "dense-block",
    shrink_dense: bool = True,
    metric_start: str = "identity",
    init_strategy: Callable | None = None,
    jit_compile: bool = True,
    mp_context: str | None = None,
    disable_progbar: bool = True,
    workers: int = 1,
    progress_every: int = 0,
    checkpoint_dir: str | Path | None = None,
    check_convergence: bool = True,
) -> NUTSResult:
    """Sample the posterior of a non-parametric GPN with NUTS and predict the test outputs.

    Args:
        model: the network (its priors, parametrisation and dtype).
        x_train: ``[S_train, M]`` training inputs.
        y_train: ``[S_train]`` or ``[S_train, N_L]`` training targets.
        x_test: optional ``[S_test, M]`` test inputs (at least one row).
        num_samples: draws kept per chain.
        warmup_steps: adaptation steps per chain (step size and mass matrix), discarded.
        num_chains: independent chains, each run as its own Pyro ``MCMC`` (see ``workers``)
            and merged into one multi-chain run.
        seed: seeds Pyro's RNGs (initialisation, momenta, predictive draws); an integer >= 0.
        joint: sample the test rows inside the chain (paper's formulation) instead of drawing
            them from their exact conditionals afterwards (see the module docstring).
        target_accept_prob: NUTS step-size adaptation target; raise it (e.g. 0.9) when
            divergences appear.
        max_tree_depth: NUTS tree depth limit (at most ``2^depth - 1`` leapfrog steps per draw).
        init: where the chains start. ``"fit-prior-noise"`` (default): each chain from its own
            maximum-a-posteriori fit of the model (:func:`fit_initial_params`, ``init_steps``
            Adam steps from an independent uniform start) with the noise scales held at their
            prior median (:func:`~pyro_gpn.inference.nuts_setup.noise_prior_medians`), so that
            the chains start apart, near the posterior's bulk, and not overfitted;
            ``"best-fit-prior-noise"``: the same ``num_chains`` fits, and every chain starts
            from the one of lowest potential energy, each moved by its own uniform jitter of up
            to 0.1 in the unconstrained space (``fit_initial_params(..., best=True)``): the
            chains explore one region and r-hat checks that they agree about it, not that the
            posterior has no other (``docs/results/nuts.md``, session of 2026-11-28); ``"fit"``:
            the same fit with the noise fitted too -- a MAP over the latent activations that
            shrinks the noise far below the data's and starts NUTS where the potential is ~30x
            more curved (``docs/results/nuts.md``: step sizes of 4e-4, 1023 leapfrog steps per
            iteration); ``"uniform"``: Pyro's ``init_to_uniform`` (radius 2 in the
            unconstrained space). Ignored when ``init_strategy`` is given.
            With ``NonParametricGPN(activations="likelihood-informed")`` and no anchor set,
            each chain runs on a copy of the model anchored at its own fitted start
            (:func:`~pyro_gpn.inference.nuts_informed.informed_chain_models`), and the
            draws are returned in the whitened coordinates (``Za{L}_train``) with the
            whitened twin of the model as ``NUTSResult.model``; with ``init="uniform"`` and no
            anchor that parametrisation is the whitened one.
        init_steps: Adam steps of each fit (every ``init`` but ``"uniform"``).
        metric: the mass matrix. ``"dense-block"`` (default): adapted, dense for the per-unit
            parameters (weights, noise scales, lengthscales), which are strongly correlated
            (a unit's weight scale trades off against the next layer's weights and the noise),
            and diagonal for the per-row latent outputs, whose number grows with the rows;
            ``"dense-activations"``: dense for the per-unit parameters and the collapsed
            last-layer activations together (:meth:`NonParametricGPN.activation_sites`; with
            centred activations, ``activations="centred"``, their posterior correlations across
            rows are those of a smooth function, which a fixed dense metric captures:
            ``docs/results/nuts.md``), diagonal for the other latent outputs; the same as
            ``"dense-block"`` for models without collapsed activations;
            ``"dense"``: adapted, dense for everything; ``"diag"``: adapted, diagonal (Pyro's
            default); ``"laplace"`` (needs a fitted start): dense and fixed to the inverse
            Hessian of the potential at each chain's start (its fit; with
            ``init="best-fit-prior-noise"`` the best fit jittered: its curvatures are clamped
            below, :func:`laplace_inverse_mass`), only the step size adapted; ``"laplace-dense"``:
            starts from that matrix and adapts a dense one in warm-up.
        shrink_dense: adapt dense mass-matrix blocks shrunk towards their diagonal
            (:class:`~pyro_gpn.inference.nuts_kernel.ShrunkBlockMassMatrix`); ``False``: Pyro's
            (and Stan's) sample covariance with a ``1e-3`` ridge, which is rank-deficient while a
            window has fewer draws than the block has dimensions.
        metric_start: the metric warm-up starts from (with a fitted start; ``metric`` then adapts
            it). ``"identity"`` (default): Pyro's unit metric; ``"hessian-diag"``: per
            coordinate the conditional posterior scale at the chain's start, ``1 / H_ii``
            (:func:`~pyro_gpn.inference.nuts_setup.hessian_diagonal_inverse_mass`; on two moons
            it was not cheaper than the identity, ``docs/results/nuts.md``). Ignored for the
            ``"laplace"`` metrics and ``init="uniform"``.
        init_strategy: a Pyro init strategy instead of ``init``.
        jit_compile: JIT-compile the potential energy. On by default: the model's control flow
            depends only on shapes, so the trace is exact, and it removes the Python overhead
            that dominates small problems (one chain of 100 + 100 draws of a ``[1, 1]`` network
            on 15 points took 4.4 s instead of 16 s on this project's shared 2-core machine).
        mp_context: deprecated and ignored (a ``DeprecationWarning``): parallel chains use
            ``workers``.
        disable_progbar: hide Pyro's progress bar (one per chain).
        workers: chains run at the same time, in spawned worker processes (``1``, the
            default: one after another in this process). Worth it only with idle cores: each
            chain's gradient runs on one thread.
        progress_every: print a line per chain to stderr every that many iterations (stage,
            step size, leapfrog steps of the last transition, divergences, seconds); ``0``
            (default): silent.
        checkpoint_dir: save every finished chain there and reuse saved chains of the same
            settings (:func:`~pyro_gpn.inference.nuts_chains.chain_key`), so that an
            interrupted run resumes with the chains it has not finished; each file is
            written atomically with a checksum and verified before use (a damaged one is
            reported and its chain run again).
        check_convergence: judge the run by :meth:`NUTSResult.convergence` (r-hat <= 1.01 and
            bulk ESS >= 100 per chain on the test predictions and the output noise,
            divergences < 1 %) and warn (:class:`~pyro_gpn.diagnostics.ConvergenceWarning`)
            naming what fails: draws of chains that have not converged are not yet the
            posterior's.

    Returns:
        a :class:`NUTSResult`.

    Raises:
        ValueError: naming the argument: a model of another kind, no ``y_train``, a count or
            ``seed`` out of range, an unknown option, an ``x_test`` with no rows, or data that
            do not fit the model (:meth:`~pyro_gpn.models.NonParametricGPN.check_data`).
    """
    if mp_context is not None:
        warnings.warn(
            "run_nuts(mp_context=...) is ignored and will be removed: chains run in parallel "
            "through workers=",
            DeprecationWarning,
            stacklevel=2,
        )
    if not isinstance(model, (NonParametricGPN, SampledTargetsGPN)):
        raise ValueError(
            f"model must be a NonParametricGPN or SampledTargetsGPN, got {type(model).__name__}"
        )
    if y_train is None:
        raise ValueError("y_train must be given: NUTS samples the posterior given the targets")
    num_samples = check_int("num_samples", num_samples, 1)
    warmup_steps = check_int("warmup_steps", warmup_steps, 0)
    num_chains = check_int("num_chains", num_chains, 1)
    max_tree_depth = check_int("max_tree_depth", max_tree_depth, 1)
    init_steps = check_int("init_steps", init_steps, 0)
    progress_every = check_int("progress_every", progress_every, 0)
    seed = check_int("seed", seed, 0)  # a Python int: random.seed refuses NumPy integers
    if x_test is not None and len(getattr(x_test, "shape", ())) >= 1 and x_test.shape[0] == 0:
        raise ValueError("x_test has 0 rows: pass x_test=None to sample without test predictions")
    if not 0.0 < target_accept_prob < 1.0:
        raise ValueError(f"target_accept_prob must lie in (0, 1), got {target_accept_prob}")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if metric_start not in METRIC_STARTS:
        raise ValueError(f"metric_start must be one of {METRIC_STARTS}, got {metric_start!r}")
    model.check_data(x_train, y_train, x_test)  # raise ValueError before starting the chains

    pyro.set_rng_seed(seed)
    start = time.perf_counter()
    initial_params = None
    kernel_kwargs: dict = {}
    if init_strategy is not None:
        kernel_kwargs["init_strategy"] = init_strategy
    elif init in ("fit", "fit-prior-noise", "best-fit-prior-noise"):
        held = init in ("fit-prior-noise", "best-fit-prior-noise")
        hold = noise_prior_medians(model, x_train) if held else None
        initial_params = fit_initial_params(
            model,
            x_train,
            y_train,
            x_test if joint else None,
            num_chains=num_chains,
            steps=init_steps,
            seed=seed,
            jit_compile=jit_compile,
            hold=hold,
            best=init == "best-fit-prior-noise",
        )
    chain_models = None
    if (
        isinstance(model, NonParametricGPN)
        and model.activations == "likelihood-informed"
        and model.activation_anchor is None
        and initial_params is not None
        and model.activation_sites()
    ):
        chain_models, initial_params = informed_chain_models(
            model, x_train, y_train, x_test if joint else None, initial_params
        )
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    inverse_mass = None
    if metric.startswith("laplace") and initial_params is not None:
        inverse_mass = laplace_inverse_mass(
            model, x_train, y_train, x_test if joint else None, initial_params
        )
        kernel_kwargs.update(full_mass=True, adapt_mass_matrix=metric == "laplace-dense")
    elif metric.startswith("laplace"):
        raise ValueError(
            f"metric={metric!r} needs a fitted start (the Hessian there), not init='uniform'"
        )
    elif metric in ("dense-block", "dense-activations"):
        block = model.parameter_sites()
        if metric == "dense-activations" and isinstance(model, NonParametricGPN):
            block = block + model.activation_sites(with_test=joint and x_test is not None)
        block = tuple(sorted(block))
        kernel_kwargs["full_mass"] = [block] if block else False
    elif metric == "dense":
        kernel_kwargs["full_mass"] = True
    if metric_start == "hessian-diag" and inverse_mass is None and initial_params is not None:
        inverse_mass = hessian_diagonal_inverse_mass(
            model, x_train, y_train, x_test if joint else None, initial_params
        )
    kernel_kwargs.update(
        target_accept_prob=target_accept_prob,
        max_tree_depth=max_tree_depth,
        jit_compile=jit_compile,
        ignore_jit_warnings=jit_compile,
        shrink_dense=shrink_dense,
    )
    args = (x_train, y_train, x_test if joint else None)
    specs = [
        ChainSpec(
            model=model.model if chain_models is None else chain_models[c].model,
            args=args,
            num_samples=num_samples,
            warmup_steps=warmup_steps,
            seed=seed,
            chain=c,
            num_chains=num_chains,
            kernel_kwargs=kernel_kwargs,
            initial_params=None
            if initial_params is None
            else {k: v[c] for k, v in initial_params.items()},
            inverse_mass=None if inverse_mass is None else inverse_mass[c],
            progress_every=progress_every,
            disable_progbar=disable_progbar,
        )
        for c in range(num_chains)
    ]
    init_time = time.perf_counter() - start
    start = time.perf_counter()
    chains = run_chains(specs, workers=workers, checkpoint_dir=checkpoint_dir)
    wall_time = time.perf_counter() - start
    if chain_models is not None:  # each chain's own anchor: back to one set of coordinates
        chains = [
            {**ch, "samples": whitened_samples(m, ch["samples"], args)}
            for m, ch in zip(chain_models, chains, strict=True)
        ]
        model = twin(model, "whitened")
        kernel_kwargs = {k: v for k, v in kernel_kwargs.items() if k != "full_mass"}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="num_chains=.*Chains will be drawn sequentially")
        template = MCMC(
            RecordingNUTS(model.model, **kernel_kwargs),
            num_samples=num_samples,
            warmup_steps=warmup_steps,
            num_chains=num_chains,
        )
    mcmc = merge_chains(chains, template)
    mcmc._args, mcmc._kwargs = args, {}
    samples = mcmc.get_samples()

    predictive: dict[str, Tensor] = {}
    if x_test is not None:
        if joint:
            predictive = {"y_test": samples["y_test"]}
        else:
            sites = ["y_test"] + (["p_test"] if model.likelihood != "gaussian" else [])
            pyro.set_rng_seed(seed)  # the same draws whichever process ran the chains
            # in chunks of draws: all of them at once can exhaust the memory (draws_per_chunk)
            parts = []
            for chunk in draw_chunks(samples, model, len(x_train) + len(x_test)):
                draw = Predictive(
                    model.model, posterior_samples=chunk, return_sites=sites, parallel=True
                )
                with torch.no_grad():
                    parts.append(draw(x_train, y_train, x_test))
            predictive = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        if "p_test" in predictive:  # a deterministic site: Predictive pads a plate dimension
            p_test = predictive["p_test"]
            predictive["p_test"] = p_test.reshape(p_test.shape[0], *p_test.shape[-2:])
        if isinstance(model, SampledTargetsGPN) and model.likelihood == "gaussian":
            predictive["y_test"] = predictive["y_test"].mT  # the [N_L, S_test] site layout
    stats = [c["stats"] for c in chains]
    result = NUTSResult(
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
        chain_wall_s=[round(c["wall_s"], 2) for c in chains],
        chain_cpu_s=[round(c["cpu_s"], 2) for c in chains],
    )
    if check_convergence and num_samples >= 4:
        report = result.convergence()
        if report.quantities and not report.converged:
            warnings.warn(
                f"run_nuts: the chains have not converged ({report}); their draws are not yet "
                "the posterior's. Run more warm-up and draws, or more chains; "
                "result.convergence() has the figures, docs/results/nuts.md what was tried on "
                "GPNs with hidden layers",
                ConvergenceWarning,
                stacklevel=2,
            )
    return result
