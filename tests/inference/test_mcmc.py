"""NUTS on the non-parametric GPN: convergence (r-hat), recovery of a known function at the test
inputs, the joint (paper) and factorised ways of predicting, and argument checks; exactness of
both routes against posteriors integrated on a grid (the single-layer GPN's exact predictive,
the sampled-targets GPN's closed-form posterior of two targets), within Monte Carlo error."""

from __future__ import annotations

import math
import warnings

import arviz as az
import numpy as np
import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import Predictive
from pyro.infer.mcmc.util import initialize_model

from pyro_gpn.diagnostics import (
    ConvergenceWarning,
    compare_heldout_lpd,
    heldout_lpd_from_draws,
    max_rhat,
    num_divergences,
)
from pyro_gpn.inference.mcmc import NUTSResult, run_nuts
from pyro_gpn.models.nonparametric import NonParametricGPN
from pyro_gpn.models.sampled_targets import SampledTargetsGPN, clt_layer_moments
from tests.mc import assert_mcmc_mean, assert_mcmc_runs_agree

F64 = torch.float64
NOISE = 0.1


def sine_data(num_train: int, num_test: int, seed: int = 1):
    """``y = sin(x) + N(0, 0.1^2)``, one ``x`` uniform in each of ``num_train`` equal cells of
    [-3, 3] (so the test grid on [-2.7, 2.7] is interpolation, not extrapolation)."""
    g = torch.Generator().manual_seed(seed)
    cells = torch.arange(num_train, dtype=F64) + torch.rand(num_train, generator=g, dtype=F64)
    x = (cells * 6 / num_train - 3)[:, None]
    y = torch.sin(x[:, 0]) + NOISE * torch.randn(num_train, generator=g, dtype=F64)
    x_test = torch.linspace(-2.7, 2.7, num_test, dtype=F64)[:, None]
    return x, y, x_test


def check_recovery(
    result: NUTSResult, last: int, coverage: float = 0.75, rhat_noise: float = 1.1
) -> None:
    """Converged on identified quantities, and the 90 % predictive band covers sin(x_test).

    The noise's split r-hat from 100 draws of one chain scatters by a few hundredths between
    chains that differ only in rounding (1.008 on this CI's CPU, 1.081 on an AVX-512 CPU of a lent
    GPU machine, same seed): ``rhat_noise`` is Gelman's 1.1. A chain that does not mix is far
    above it (1.7 for a hidden layer, ``docs/results/nuts.md``)."""
    idata = result.to_arviz()
    assert max_rhat(idata, [f"sigma{last}"]) < rhat_noise
    assert max_rhat(idata, ["y_test"], group="posterior_predictive") < 1.05
    truth = torch.sin(result.x_test[:, 0])
    low, high = result.y_test.quantile(0.05, dim=0), result.y_test.quantile(0.95, dim=0)
    assert ((truth >= low) & (truth <= high)).double().mean() >= coverage
    # not covered by being vague: the band is a few noise widths, the mean close to the truth
    assert (high - low).median() < 8 * NOISE  # the prior's band is ~3.3 wide
    assert (result.y_test.mean(0) - truth).square().mean().sqrt() < 2 * NOISE
    noise = result.samples[f"sigma{last}"]
    assert 0.5 * NOISE < noise.median() < 2 * NOISE


@pytest.fixture(scope="module")
def gp_run():
    """A one-layer GPN (a GP with the projected kernel): 15 train, 8 test points."""
    pyro.enable_validation(True)
    x, y, x_test = sine_data(15, 8)
    return run_nuts(
        NonParametricGPN([1, 1]),
        x,
        y,
        x_test,
        num_samples=100,
        warmup_steps=100,
        seed=0,
        init_steps=100,
    )


def test_nuts_recovers_sine(gp_run):
    check_recovery(gp_run, last=1)
    assert gp_run.num_divergences == num_divergences(gp_run.to_arviz())


def test_num_divergences_is_a_property_with_a_deprecated_call(gp_run):
    count = gp_run.num_divergences
    assert isinstance(count, int) and count == int(count)
    assert gp_run.divergence_rate == count / (gp_run.num_chains * gp_run.num_samples)
    with pytest.warns(DeprecationWarning, match="property"):
        assert gp_run.num_divergences() == count


def test_result_layout_and_arviz_groups(gp_run):
    assert gp_run.num_chains == 2 and gp_run.num_samples == 100
    assert gp_run.samples["W1"].shape == (200, 1, 1)
    assert gp_run.samples["sigma1"].shape == (200, 1)
    assert gp_run.posterior_predictive["y_test"].shape == (200, 1, 8)
    assert gp_run.y_test.shape == (200, 8)
    prediction = gp_run.predict()  # the predict of every route
    torch.testing.assert_close(prediction.mean, gp_run.y_test.mean(0))
    torch.testing.assert_close(prediction.std, gp_run.y_test.std(0))
    assert prediction.task == "regression"
    assert gp_run.wall_time_s > 0
    idata = gp_run.to_arviz()
    assert {"posterior", "posterior_predictive", "sample_stats", "observed_data"} <= set(
        idata.groups()
    )
    assert set(idata.posterior.data_vars) == {"W1", "sigma1"}
    assert idata.posterior_predictive["y_test"].shape == (2, 100, 1, 8)
    assert idata.observed_data["y_train"].shape == (1, 15)
    assert idata.sample_stats["diverging"].shape == (2, 100)
    for name in ("energy", "lp", "tree_depth", "n_steps", "step_size", "acceptance_rate"):
        assert idata.sample_stats[name].shape == (2, 100), name
    # lp is minus the potential energy of the kept state, recomputed here by Pyro's own
    # initialize_model on the draws mapped to the unconstrained space: to rounding with the
    # JIT-traced potential the run uses, and closely with the eager one (the two differ by a
    # constant ~4e-7 on this model)
    args = (gp_run.x_train, gp_run.y_train, None)
    _, jit_potential, transforms, _ = initialize_model(
        gp_run.model.model, model_args=args, jit_compile=True
    )
    _, eager_potential, _, _ = initialize_model(gp_run.model.model, model_args=args)
    lp = idata.sample_stats["lp"].values
    energy = idata.sample_stats["energy"].values
    draws = gp_run.mcmc.get_samples(group_by_chain=True)
    for c, i in [(0, 0), (0, 57), (1, 3), (1, 99)]:
        z = {k: transforms[k](v[c, i]) for k, v in draws.items()}
        with warnings.catch_warnings():  # the JIT trace's TracerWarnings
            warnings.simplefilter("ignore")
            jit_pe = float(jit_potential(z))
        assert lp[c, i] == pytest.approx(-jit_pe, abs=1e-8, rel=1e-10)
        assert lp[c, i] == pytest.approx(-float(eager_potential(z)), abs=1e-5)
    # energy: the kinetic energy of the fresh momentum (chi^2_D / 2 for the D = 2 unconstrained
    # dimensions, > 0) plus the potential at the start, the previous kept draw
    kinetic = energy[:, 1:] + lp[:, :-1]
    assert (kinetic > 0).all()
    assert 0.6 < kinetic.mean() < 1.4  # E = D / 2 = 1; s.e. ~0.07 over 198 transitions
    steps = idata.sample_stats["n_steps"].values
    assert ((steps >= 1) & (steps <= 2**10)).all()
    assert (idata.sample_stats["tree_depth"].values == np.ceil(np.log2(steps + 1))).all()
    assert idata.log_likelihood["y"].shape == (2, 100, 15)
    assert az.bfmi(idata).shape == (2,)


def test_acceptance_rate_is_per_transition_and_averages_to_pyros_acc_prob():
    """Pyro's kernel reports ("acc. prob") the running mean of the acceptance probabilities of
    the sampling transitions; the recorded per-transition rates must average to it after every
    transition, so they are the individual values, not the running mean itself."""
    from pyro.infer import MCMC

    from pyro_gpn.inference.nuts_kernel import RecordingNUTS

    def model():
        pyro.sample("a", pyro.distributions.Normal(0.0, 1.0))
        pyro.sample("b", pyro.distributions.LogNormal(0.0, 1.0))

    reported = []

    def hook(kernel, params, stage, i):
        if stage == "Sample":
            reported.append(kernel._mean_accept_prob)
            assert kernel.logging()["acc. prob"] == f"{kernel._mean_accept_prob:.3f}"

    pyro.set_rng_seed(0)
    kernel = RecordingNUTS(model)
    MCMC(kernel, num_samples=30, warmup_steps=10, hook_fn=hook, disable_progbar=True).run()
    rates = np.array(kernel.records[-1]["acceptance_rate"])
    assert rates.shape == (30,) and ((rates >= 0) & (rates <= 1)).all()
    running = np.cumsum(rates) / np.arange(1, 31)
    np.testing.assert_allclose(running, reported, rtol=0, atol=1e-12)
    assert not np.allclose(rates, reported)  # the check has power: the rates vary


def test_loo_and_waic_work_on_the_run(gp_run):
    """PSIS-LOO on the exact leave-one-out terms of the marginal normal likelihood."""
    idata = gp_run.to_arviz()
    loo = az.loo(idata, pointwise=True)
    waic = az.waic(idata)
    assert math.isfinite(loo.elpd_loo) and math.isfinite(waic.elpd_waic)
    assert loo.loo_i.shape == (15,)
    # effective number of parameters: the model has two (W1, sigma1) and a GP's smoothing;
    # a wrong sign or scale of the pointwise terms would put it far outside this range
    assert 0.5 < loo.p_loo < 8 and 0.5 < waic.p_waic < 8
    # the LOO predictive density of a row is below its in-sample one
    lppd_i = heldout_lpd_from_draws(gp_run.pointwise_log_likelihood())
    assert (loo.loo_i.values <= lppd_i + 1e-9).all()


def test_heldout_comparison_of_routes(gp_run):
    """az.compare via pointwise test log predictive densities: the posterior predictive
    beats a deliberately wrong route (a constant Gaussian at 0 with sd 3)."""
    y_test = torch.sin(gp_run.x_test[:, 0])
    nuts = heldout_lpd_from_draws(gp_run.test_log_density(y_test))
    wrong = torch.distributions.Normal(0.0, 3.0).log_prob(y_test).numpy()
    table = compare_heldout_lpd({"nuts": nuts, "constant": wrong})
    assert list(table.index) == ["nuts", "constant"]
    assert table.loc["constant", "elpd_diff"] > 0 and table.loc["constant", "dse"] > 0


def test_joint_sampling_keeps_test_rows_in_the_chain():
    x, y, x_test = sine_data(6, 3)
    joint = run_nuts(
        NonParametricGPN([1, 2, 1]),
        x,
        y,
        x_test,
        num_samples=4,
        warmup_steps=4,
        num_chains=1,
        joint=True,
        init_steps=20,
    )
    assert set(joint.samples) == {"W1", "sigma1", "W2", "Za2_train", "Za2_test", "sigma2", "y_test"}
    assert joint.samples["Za2_test"].shape == (4, 3)
    torch.testing.assert_close(joint.posterior_predictive["y_test"], joint.samples["y_test"])
    idata = joint.to_arviz()
    assert "y_test" in idata.posterior and "posterior_predictive" not in idata.groups()


@pytest.mark.slow
def test_joint_sampling_of_test_rows_agrees(gp_run):
    """The paper's formulation (test outputs inside the chain) predicts the same."""
    joint = run_nuts(
        gp_run.model,
        gp_run.x_train,
        gp_run.y_train,
        gp_run.x_test,
        num_samples=100,
        warmup_steps=100,
        seed=1,
        joint=True,
    )
    assert joint.y_test.shape == gp_run.y_test.shape
    # Monte Carlo standard error of each mean is ~0.02 here
    torch.testing.assert_close(joint.y_test.mean(0), gp_run.y_test.mean(0), atol=0.1, rtol=0.0)


@pytest.mark.slow
def test_nuts_two_layer_network_recovers_sine():
    """Network [1, 2, 1] (last layer's activations latent, collapsed), 20 train and 10 test
    points: the run of ``benchmarks/nuts_synthetic.py`` recorded in
    ``docs/results/nuts_synthetic.md``."""
    pyro.enable_validation(True)
    x, y, x_test = sine_data(20, 10)
    result = run_nuts(
        NonParametricGPN([1, 2, 1]), x, y, x_test, num_samples=150, warmup_steps=150, seed=0
    )
    # 150 + 150 draws per chain are too few for the output noise to reach r-hat 1.05 in this
    # posterior (the recorded run measured 1.088); the predictions do (1.019).
    check_recovery(result, last=2, coverage=0.8, rhat_noise=1.1)


def _two_layer_run(seed: int, **model_options) -> NUTSResult:
    """4 chains of 300 + 500 on the ``[1, 1, 1]`` network of the agreement test, at the library's
    defaults (each chain from its own fitted start)."""
    x, y, x_test = sine_data(12, 6)
    return run_nuts(
        NonParametricGPN([1, 1, 1], **model_options),
        x,
        y,
        x_test,
        num_samples=500,
        warmup_steps=300,
        num_chains=4,
        seed=seed,
        check_convergence=False,
    )


def _identified_draws(result: NUTSResult) -> dict[str, torch.Tensor]:
    """The quantities the agreement test compares, ``[chains, draws, *shape]``: the predictive
    mean and second moment about ``sin`` at the test inputs, and the output noise's log."""
    chains, draws = result.num_chains, result.num_samples
    truth = torch.sin(result.x_test[:, 0])
    y_test = result.y_test.reshape(chains, draws, -1)
    return {
        "y_test mean": y_test,
        "y_test second moment about sin": (y_test - truth).square(),
        "log sigma2": result.samples["sigma2"].reshape(chains, draws).log(),
    }


@pytest.mark.slow
def test_two_layer_runs_from_independent_starts_agree():
    """Issue 16, Build 5: with a hidden layer there is no analytic posterior, so two independent
    runs of the two-layer network ``[1, 1, 1]`` (12 rows of the noisy sine; the last layer's
    activations latent, collapsed) -- different seeds, so different fitted starts (each chain's
    own MAP fit from its own uniform start), momenta and predictive draws -- must estimate the
    same posterior: the predictive mean and second moment at the 6 test inputs and the log of
    the output noise scale, each within 4 combined Monte Carlo standard errors (ArviZ's mcse
    from each run's ESS, which must reach 400 on the predictions and 40 on the noise;
    ``tests.mc.assert_mcmc_runs_agree``). Only quantities invariant to the network's symmetries
    are compared (the signs of the weights and activations are not identified).

    What it guards: results that depend on the start or the seed, and runs that do not mix. A
    change or a bias shared by both runs (a wrong potential, the divergences' bias) passes it.
    Neither run meets the library's convergence standard on the noise (r-hat 1.035 / 1.017,
    divergences 4.9 % / 1.9 %: the funnel between the noise and the activations), so the
    predictions' r-hat and the divergence rate are held to looser guards here.

    Measured (``docs/results/nuts.md``, session of 2026-11-29): the two runs agree within 2.6
    mcse (ESS of the means >= 929 on the predictions, 66 on the noise); a run with the noise
    prior's median tripled is 9.5 mcse (second moment), 6.9 (mean) and 5.1 (noise) from the
    first, the size of difference the test resolves. 23 minutes beside two benchmark processes
    on this 2-core CPU."""
    runs = []
    for seed in (0, 1):
        result = _two_layer_run(seed)
        assert max_rhat(result.to_arviz(), ["y_test"], group="posterior_predictive") <= 1.01
        assert result.divergence_rate < 0.1
        runs.append(_identified_draws(result))
    ess_floor = {"log sigma2": 40}
    for name in runs[0]:
        assert_mcmc_runs_agree(
            runs[0][name], runs[1][name], n_se=4.0, min_ess=ess_floor.get(name, 400), name=name
        )


def test_runs_agree_checks_means_within_combined_mcse_and_the_ess():
    """The agreement helper on independent AR(1) chains (correlation 0.5, mean 0): two runs of
    the same chain agree; a shift of 6 combined mcse fails; a run that mixes worse fails the
    ESS floor instead of widening the tolerance."""

    def ar1(seed, shift=0.0, rho=0.5, chains=4, draws=1000):
        g = torch.Generator().manual_seed(seed)
        noise = torch.randn(chains, draws, 3, generator=g, dtype=F64)
        out = torch.empty_like(noise)
        out[:, 0] = noise[:, 0]
        for t in range(1, draws):
            out[:, t] = rho * out[:, t - 1] + (1 - rho**2) ** 0.5 * noise[:, t]
        return out + shift

    z = assert_mcmc_runs_agree(ar1(0), ar1(1), min_ess=400)
    assert z.shape == (3,) and bool((z < 4).all())
    # mcse of one run ~ sqrt((1 + rho) / (1 - rho) / 4000) = 0.027; combined ~0.039
    with pytest.raises(AssertionError, match="runs disagree"):
        assert_mcmc_runs_agree(ar1(0), ar1(1, shift=0.23), min_ess=400)
    # the slowly mixing run is not caught by its means (z ~0.2-1.1) but by the ESS floor
    assert_mcmc_runs_agree(ar1(0), ar1(1, rho=0.99), min_ess=0)
    with pytest.raises(AssertionError, match="ESS of the mean"):
        assert_mcmc_runs_agree(ar1(0), ar1(1, rho=0.99), min_ess=400)
    with pytest.raises(AssertionError, match="different shapes"):
        assert_mcmc_runs_agree(ar1(0), ar1(1)[..., :2])


def test_without_test_inputs():
    x, y, _ = sine_data(6, 1)
    result = run_nuts(
        NonParametricGPN([1, 1]), x, y, num_samples=5, warmup_steps=5, num_chains=1, init_steps=20
    )
    assert result.posterior_predictive == {}
    with pytest.raises(ValueError, match="x_test"):
        _ = result.y_test
    assert "posterior_predictive" not in result.to_arviz().groups()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"y_train": None}, "y_train"),
        ({"num_samples": 0}, "num_samples"),
        ({"num_chains": 1.5}, "num_chains"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"target_accept_prob": 1.0}, "target_accept_prob"),
        ({"model": "gpn"}, "model"),
        ({"init": "prior"}, "init"),
        ({"metric": "euclid"}, "metric"),
        ({"metric_start": "laplace"}, "metric_start"),
        ({"init_steps": -1}, "init_steps"),
        ({"x_test": torch.zeros(500, 1, dtype=F64)}, "max_samples"),
        ({"x_train": torch.zeros(6, 2, dtype=F64)}, "x_train"),
        # these raised torch's, NumPy's or Python's own errors, or printed every step
        ({"x_test": torch.zeros(0, 1, dtype=F64)}, "x_test has 0 rows"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"seed": "a"}, "seed must be a non-negative integer"),
        ({"progress_every": -1}, "progress_every must be a non-negative integer"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    x, y, x_test = sine_data(6, 2)
    args = {"model": NonParametricGPN([1, 1]), "x_train": x, "y_train": y, "x_test": x_test}
    args |= {"num_samples": 5, "warmup_steps": 2} | kwargs
    with pytest.raises(ValueError, match=match):
        run_nuts(**args)


def test_sine_data_noise_level():
    """The synthetic data really has the stated noise (guards the recovery thresholds)."""
    x, y, _ = sine_data(2000, 1)
    residual = y - torch.sin(x[:, 0])
    assert abs(residual.std().item() - NOISE) < 0.01
    assert abs(residual.mean().item()) < 3 * NOISE / math.sqrt(2000)


def _gp_predictive(w, sigma, x, y, x_test, jitter=1e-6):
    """The single-layer GPN's GP given its hyperparameters, for each of ``G`` pairs ``w [G]``,
    ``sigma [G]`` (lengthscale 1): the predictive mean and variance (noise included) at
    ``x_test``, ``[G, S_test]`` each, and the log marginal likelihood of ``y``, ``[G]``."""
    x_all = torch.cat([x, x_test])[:, 0]
    diff = x_all[:, None] - x_all[None, :]
    k = torch.exp(-0.5 * (w[:, None, None] * diff) ** 2)  # [G, S, S]
    n = x.shape[0]
    eye = torch.eye(len(x_all), dtype=F64)
    cov = k + (sigma.square() + jitter)[:, None, None] * eye
    c11, c21, c22 = cov[:, :n, :n], cov[:, n:, :n], cov[:, n:, n:]
    chol = torch.linalg.cholesky(c11)
    alpha = torch.cholesky_solve(y[None, :, None].expand(len(w), n, 1), chol)
    log_ml = (
        -0.5 * (y[None, :, None] * alpha).sum((-2, -1))
        - chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        - 0.5 * n * math.log(2 * math.pi)
    )
    mean = (c21 @ alpha)[..., 0]
    var = c22.diagonal(dim1=-2, dim2=-1) - (c21 * torch.cholesky_solve(c21.mT, chol).mT).sum(-1)
    return mean, var, log_ml


def _exact_posterior_by_quadrature(x, y, x_test):
    """The single-layer GPN's exact posterior: a mixture over a (|w|, log sigma) grid of GP
    predictives, weighted by the exact marginal likelihood times the priors (w ~ N(0, 1),
    sigma ~ LogNormal(log 0.1, 1), lengthscale 1). The posterior is symmetric in w, so |w|
    suffices.

    Returns ``mean`` and ``var`` ``[S_test]`` of the predictive (noise included), the posterior
    means ``abs_w`` and ``log_sigma`` and the grid's normalised ``weights``."""
    w = torch.linspace(1e-3, 5.0, 250, dtype=F64)
    log_s = torch.linspace(-6.0, 0.5, 220, dtype=F64)
    ww, ll = (t.reshape(-1) for t in torch.meshgrid(w, log_s, indexing="ij"))
    mean, var, log_ml = _gp_predictive(ww, ll.exp(), x, y, x_test)
    log_prior = (
        torch.distributions.Normal(0.0, 1.0).log_prob(ww)
        + torch.distributions.Normal(math.log(0.1), 1.0).log_prob(ll)  # density of log sigma
    )
    weights = torch.softmax(log_ml + log_prior, 0)
    pred_mean = (weights[:, None] * mean).sum(0)
    pred_var = (weights[:, None] * (var + mean**2)).sum(0) - pred_mean**2
    return {
        "mean": pred_mean,
        "var": pred_var,
        "abs_w": (weights * ww).sum(),
        "log_sigma": (weights * ll).sum(),
        "weights": weights,
    }


@pytest.mark.slow
def test_single_layer_matches_the_exact_predictive():
    """NUTS on a single-layer GPN (a GP with the projected kernel) against the exact Bayesian
    posterior of the same model, integrated over its two hyperparameters ``(|w|, log sigma)`` on
    a grid (an analytic reference, not another sampler; the grid's error, from halving its
    spacing, is below 1e-8 predictive sd).

    Compared, each within 4 Monte Carlo standard errors (ArviZ's mcse from the chains' ESS, which
    must reach 1,000): the posterior means of ``|W1|`` (the posterior is symmetric in the sign)
    and ``log sigma1``; the predictive mean and variance at every test input, Rao-Blackwellised
    (each draw's exact GP predictive given its ``(w, sigma)``, so that only the hyperparameters'
    Monte Carlo error remains); and the same from the run's own ``y_test`` draws (which tests
    the conditional sampling of the test rows). The tolerance on the predictive mean is ~0.02
    predictive sd. A sampler of the model with the noise prior's median tripled is off by ~0.29
    posterior sd in ``log sigma`` and the predictive variance (measured: 14.5 and 11.5 mcse; the
    former fixed 0.2-sd / 0.8-1.25 tolerances let it pass); one with the weight prior's sd
    doubled by ~0.14 sd in ``|w|`` and the predictive mean (6.1 and 5.8 mcse); the correct model
    1.4 at most (``docs/results/nuts.md``, session of 2026-11-28 17:00)."""
    x, y, x_test = sine_data(15, 8)
    exact = _exact_posterior_by_quadrature(x, y, x_test)
    assert exact["weights"].max() < 0.05  # the grid resolves the posterior
    chains, draws = 4, 2000
    result = run_nuts(
        NonParametricGPN([1, 1]),
        x,
        y,
        x_test,
        num_samples=draws,
        warmup_steps=500,
        num_chains=chains,
        seed=0,
    )
    w, sigma = result.samples["W1"].reshape(-1).abs(), result.samples["sigma1"].reshape(-1)
    mean, var, _ = _gp_predictive(w, sigma, x, y, x_test)  # each draw's exact predictive
    checks = {
        "|W1|": (w, exact["abs_w"]),
        "log sigma1": (sigma.log(), exact["log_sigma"]),
        "predictive mean": (mean, exact["mean"]),
        # E[var_d + (mean_d - m)^2] over the posterior is the mixture's variance about its mean m
        "predictive variance": (var + (mean - exact["mean"]).square(), exact["var"]),
        "y_test mean": (result.y_test, exact["mean"]),
        "y_test variance": ((result.y_test - exact["mean"]).square(), exact["var"]),
    }
    for name, (quantity, expected) in checks.items():
        by_chain = quantity.reshape(chains, draws, *quantity.shape[1:])
        assert_mcmc_mean(by_chain, expected, n_se=4.0, min_ess=1000, name=name)


@pytest.mark.parametrize("route", ["nonparametric", "sampled-targets"])
def test_classification_runs_end_to_end(route):
    """Bernoulli likelihood through run_nuts: class probabilities, labels, ArviZ groups."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 2, generator=g, dtype=F64)
    labels = (x[:, 0] + 0.3 * x[:, 1] > 0).double()
    x_test = torch.randn(5, 2, generator=g, dtype=F64)
    if route == "nonparametric":
        model = NonParametricGPN([2, 1], likelihood="bernoulli")
    else:
        model = SampledTargetsGPN([2, 2, 1], likelihood="bernoulli", num_inducing=5)
    result = run_nuts(
        model, x, labels, x_test, num_samples=6, warmup_steps=6, num_chains=2, init_steps=20
    )
    prediction = result.predict()
    assert prediction.task == "classification" and prediction.probs.shape == (5, 2)
    torch.testing.assert_close(prediction.probs.sum(-1), torch.ones(5, dtype=F64))
    assert result.y_test.shape == (12, 5)
    assert set(result.y_test.unique().tolist()) <= {0.0, 1.0}
    idata = result.to_arviz()
    assert idata.log_likelihood["y"].shape == (2, 6, 12)
    assert idata.posterior_predictive["p_test"].shape == (2, 6, 5, 2)
    density = result.test_log_density((x_test[:, 0] > 0).double())
    assert density.shape == (12, 5) and (density <= 0).all()


def test_sampled_targets_regression_runs_end_to_end():
    x, y, x_test = sine_data(10, 4)
    model = SampledTargetsGPN([1, 2, 1], num_inducing=5)
    result = run_nuts(
        model, x, y, x_test, num_samples=5, warmup_steps=5, num_chains=1, init_steps=20
    )
    assert result.samples["z1"].shape == (5, 2, 5)
    assert result.y_test.shape == (5, 4)
    assert result.pointwise_log_likelihood().shape == (5, 10)
    assert result.test_log_density(torch.sin(x_test[:, 0])).shape == (5, 4)
    assert set(result.to_arviz().sample_stats.data_vars) >= {"energy", "tree_depth"}


class _HeldSampledTargetsGPN(SampledTargetsGPN):
    """A :class:`SampledTargetsGPN` with some of its sites held at given values
    (``poutine.condition``), so that NUTS samples only the others. (``run_nuts`` holds sites
    during its initial fits only; its chains sample every site of the model.)"""

    def __init__(self, sizes, held, **kwargs):
        super().__init__(sizes, **kwargs)
        self.held = held

    def model(self, x_train, y_train=None, x_test=None):
        return poutine.condition(super().model, data=self.held)(x_train, y_train, x_test)

    def parameter_sites(self):
        return [name for name in super().parameter_sites() if name not in self.held]


@pytest.mark.slow
def test_sampled_targets_posterior_matches_grid_integration():
    """NUTS through ``run_nuts`` on the sampled-U route against its own posterior integrated on a
    grid. The network is ``SampledTargetsGPN([1, 1, 1])`` with two inducing points on 6 rows; every
    site but the output layer's whitened targets ``z2`` (2 dimensions) is held. The grid's
    density is written out here from the closed-form likelihood -- the layers' central-limit
    moments (``clt_layer_moments``, checked against quadrature in
    ``tests/models/test_sampled_targets.py``; the hidden output's variance enters the output's
    through ``beta beta^T``, so the likelihood is not Gaussian in ``z2``) -- and the
    ``N(0, I)`` prior of ``z2``, not read from the model. Posterior mean and variance of both
    coordinates within 4 Monte Carlo standard errors (ArviZ's mcse; ESS >= 1,000). The grid's
    error (from halving its spacing) is below 1e-8. A prior of ``z`` with sd 2 instead of 1
    moves the posterior means by 0.30-0.35 posterior sd and the variances by 17-18 %."""
    lengthscale, size = 1.0, {"num_inducing": 2, "inducing_range": (-1.0, 1.0)}
    inducing = torch.tensor([-1.0, 1.0], dtype=F64)
    kern = torch.exp(-0.5 * (inducing[:, None] - inducing[None, :]).square() / lengthscale**2)
    chol = torch.linalg.cholesky(kern + 1e-6 * torch.eye(2, dtype=F64))
    targets1 = torch.tensor([[-0.8, 0.8]], dtype=F64)
    held = {
        "W1": torch.ones(1, 1, dtype=F64),
        "z1": torch.linalg.solve_triangular(chol, targets1.mT, upper=False).mT,
        "sigma1": torch.tensor([0.2], dtype=F64),
        "W2": torch.ones(1, 1, dtype=F64),
        "sigma2": torch.tensor([0.1], dtype=F64),
    }
    x = torch.linspace(-1.5, 1.5, 6, dtype=F64)[:, None]
    hidden = clt_layer_moments(  # the hidden output's mean and variance, [S, 1] each
        x, torch.zeros_like(x), held["W1"], inducing, targets1, lengthscale, 1e-6, held["sigma1"]
    )

    def output_moments(z2):  # [G, 2] whitened targets -> the outputs' [G, S] mean and variance
        targets2 = (z2 @ chol.mT)[:, None, :]
        mean, var = clt_layer_moments(
            *hidden, held["W2"], inducing, targets2, lengthscale, 1e-6, held["sigma2"]
        )
        return mean[..., 0], var[..., 0]

    g = torch.Generator().manual_seed(0)
    mean, var = output_moments(torch.tensor([[1.2, -0.4]], dtype=F64))
    y = (mean + var.sqrt() * torch.randn(mean.shape, generator=g, dtype=F64))[0]
    axis = torch.linspace(-4.0, 4.0, 161, dtype=F64)
    grid = torch.stack([t.reshape(-1) for t in torch.meshgrid(axis, axis, indexing="ij")], -1)
    mean, var = output_moments(grid)
    log_post = torch.distributions.Normal(mean, var.sqrt()).log_prob(y).sum(-1)
    log_post = log_post + torch.distributions.Normal(0.0, 1.0).log_prob(grid).sum(-1)
    weights = torch.softmax(log_post, 0)
    assert weights.max() < 0.05  # the grid resolves the posterior
    post_mean = (weights[:, None] * grid).sum(0)
    post_var = (weights[:, None] * (grid - post_mean).square()).sum(0)

    model = _HeldSampledTargetsGPN([1, 1, 1], held, lengthscale=lengthscale, **size)
    chains, draws = 4, 1000
    result = run_nuts(model, x, y, num_samples=draws, warmup_steps=300, num_chains=chains, seed=0)
    assert set(result.samples) == {"z2"}
    z2 = result.samples["z2"].reshape(chains, draws, 2)
    assert_mcmc_mean(z2, post_mean, n_se=4.0, min_ess=1000, name="posterior mean")
    variance = (z2 - post_mean).square()  # its mean over the posterior is post_var
    assert_mcmc_mean(variance, post_var, n_se=4.0, min_ess=1000, name="posterior variance")


def test_mp_context_is_deprecated_not_silently_ignored():
    x = torch.zeros(3, 1)
    with (
        pytest.warns(DeprecationWarning, match="workers"),
        pytest.raises(ValueError, match="model"),
    ):
        run_nuts(object(), x, x[:, 0], mp_context="spawn")


@pytest.mark.parametrize(
    "model",
    [
        NonParametricGPN([1, 2, 1]),
        NonParametricGPN([1, 2, 1], collapse=False),
        SampledTargetsGPN([1, 3, 1], num_inducing=6),
        SampledTargetsGPN([1, 2, 1], likelihood="bernoulli", num_inducing=5),
    ],
    ids=["nonparametric", "uncollapsed", "sampled-targets", "sampled-targets-bernoulli"],
)
def test_jit_potential_and_gradient_equal_eager_away_from_the_trace_point(model):
    """``jit_compile=True`` (run_nuts' default) traces the potential once: at points other than
    the one it was traced at, its value and gradient must equal the eager ones (a value-dependent
    branch baked into the trace would break this)."""
    from pyro.infer.mcmc.util import initialize_model
    from pyro.ops.integrator import potential_grad

    x, y, _ = sine_data(9, 2)
    if model.likelihood == "bernoulli":
        y = (y > 0).double()
    fns = [
        initialize_model(model.model, (x, y, None), jit_compile=jit, skip_jit_warnings=True)[:2]
        for jit in (True, False)
    ]
    (init, jitted), (_, eager) = fns
    potential_grad(jitted, init)  # traced here
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        point = {k: v + torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in init.items()}
        (grad_j, value_j), (grad_e, value_e) = (potential_grad(f, point) for f in (jitted, eager))
        # A constant offset of about 2e-8 remains (measured on this data, 2026-11-29): the
        # Python-float constants of torch's log-densities enter the trace in the default dtype
        # (float32 here); with a float64 default dtype the two values are equal. A constant
        # cannot move NUTS (only differences of the potential enter) and the gradients agree.
        torch.testing.assert_close(value_j, value_e, rtol=1e-7, atol=1e-8)
        assert abs(float(value_j) - float(potential_grad(eager, init)[1])) > 1e-6  # moved
        for k in grad_e:
            torch.testing.assert_close(grad_j[k], grad_e[k], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("activations", ["centred", "whitened"])
def test_dense_activations_metric_blocks_parameters_with_activations(activations):
    """metric="dense-activations": one dense block over the per-unit parameters and the
    collapsed activations (train rows; test rows too when sampled in the chain)."""
    x, y, x_test = sine_data(6, 2)
    model = NonParametricGPN([1, 2, 1], activations=activations)
    prefix = "A2" if activations == "centred" else "Za2"
    for joint in (False, True):
        result = run_nuts(
            model,
            x,
            y,
            x_test,
            num_samples=3,
            warmup_steps=3,
            num_chains=1,
            init_steps=5,
            metric="dense-activations",
            joint=joint,
        )
        want = ["W1", "W2", "sigma1", "sigma2", f"{prefix}_train"]
        want += [f"{prefix}_test"] if joint else []
        assert result.mcmc.kernel._adapter.dense_mass == [tuple(sorted(want))]
        assert set(want) <= set(result.samples)
    single = run_nuts(  # no collapsed activations: the same block as "dense-block"
        NonParametricGPN([1, 1]),
        x,
        y,
        num_samples=3,
        warmup_steps=3,
        num_chains=1,
        init_steps=5,
        metric="dense-activations",
    )
    assert single.mcmc.kernel._adapter.dense_mass == [("W1", "sigma1")]


def test_convergence_is_judged_on_the_predictions_and_the_output_noise(gp_run):
    report = gp_run.convergence()
    idata = gp_run.to_arviz()
    assert report.quantities == ("y_test", "sigma1")
    expected = max(
        max_rhat(idata, ["y_test"], group="posterior_predictive"), max_rhat(idata, ["sigma1"])
    )
    assert report.max_rhat == pytest.approx(expected, rel=1e-12)
    assert report.divergence_rate == gp_run.divergence_rate
    assert report.num_chains == 2 and report.num_draws == 100


def test_a_run_that_has_not_converged_warns_and_the_check_can_be_off():
    x, y, x_test = sine_data(6, 2)
    args = dict(num_samples=8, warmup_steps=5, num_chains=2, init_steps=20)
    with pytest.warns(ConvergenceWarning, match="bulk ESS .* < 200"):
        result = run_nuts(NonParametricGPN([1, 1]), x, y, x_test, **args)
    assert not result.convergence().converged
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        run_nuts(NonParametricGPN([1, 1]), x, y, x_test, check_convergence=False, **args)


def test_draws_are_processed_in_chunks_with_the_same_values(gp_run, monkeypatch):
    """A tiny memory budget splits the draws into chunks of 7; the per-draw quantities that
    do not sample anything (the pointwise log-likelihood, the test log densities) equal those
    of one pass over all draws; the chunk size follows the rows and widths."""
    import pyro_gpn.inference.nuts_result as nuts_result

    y_test = torch.sin(gp_run.x_test[:, 0])
    whole_ll, whole_test = gp_run.pointwise_log_likelihood(), gp_run.test_log_density(y_test)
    rows = len(gp_run.x_train) + len(gp_run.x_test)
    monkeypatch.setattr(nuts_result, "CHUNK_BYTES", 7 * 4 * 8 * rows * rows)
    assert nuts_result.draws_per_chunk(gp_run.model, rows) == 7
    assert nuts_result.draws_per_chunk(gp_run.model, 10 * rows) == 1
    torch.testing.assert_close(gp_run.pointwise_log_likelihood(), whole_ll, rtol=1e-12, atol=0)
    torch.testing.assert_close(gp_run.test_log_density(y_test), whole_test, rtol=1e-12, atol=0)
    assert whole_ll.shape == (200, len(gp_run.x_train)) and whole_test.shape == (200, 8)


def test_a_run_predicts_in_chunks_of_draws(monkeypatch):
    """run_nuts' posterior predictive, in chunks of 3 draws: every draw's class probabilities
    (a deterministic site) equal those of the model at that draw, one pass."""
    import pyro_gpn.inference.nuts_result as nuts_result

    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 2, generator=g, dtype=F64)
    y = (x[:, 0] > 0).to(F64)
    x_test = torch.randn(5, 2, generator=g, dtype=F64)
    model = SampledTargetsGPN([2, 2, 1], likelihood="bernoulli")
    monkeypatch.setattr(nuts_result, "CHUNK_BYTES", 3 * 4 * 8 * 17 * 17 * 2)
    args = dict(num_samples=5, warmup_steps=5, num_chains=2, init_steps=10)
    result = run_nuts(model, x, y, x_test, check_convergence=False, **args)
    whole = Predictive(model.model, posterior_samples=result.samples, return_sites=["p_test"])
    with torch.no_grad():
        p_test = whole(x, y, x_test)["p_test"]
    p = result.posterior_predictive["p_test"]
    torch.testing.assert_close(p, p_test.reshape(p.shape), rtol=1e-12, atol=0)
    assert p.shape[0] == 10


@pytest.mark.parametrize(
    ("shortfall", "warns"),
    [
        ({}, False),
        ({"max_rhat": 1.02}, True),
        ({"min_ess_bulk": 150.0}, True),
        ({"divergence_rate": 0.01}, True),
        ({"quantities": ()}, False),
    ],
)
def test_the_warning_follows_every_part_of_the_standard(monkeypatch, shortfall, warns):
    """run_nuts warns when its report falls short of any part of the standard -- r-hat above
    1.01, bulk ESS below 100 per chain, 1 % or more divergent transitions -- and not when all
    are met or nothing identified was checked (hand-made reports in place of the run's)."""
    from pyro_gpn.diagnostics import ConvergenceReport

    fields = dict(
        quantities=("y_test",),
        max_rhat=1.005,
        min_ess_bulk=250.0,
        divergence_rate=0.0,
        num_chains=2,
        num_draws=4,
        rhat_threshold=1.01,
        ess_threshold=200.0,
        divergence_threshold=0.01,
    )
    report = ConvergenceReport(**(fields | shortfall))
    monkeypatch.setattr(NUTSResult, "convergence", lambda self: report)
    x, y, x_test = sine_data(4, 1)
    args = dict(num_samples=4, warmup_steps=0, num_chains=1, init="uniform", jit_compile=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_nuts(NonParametricGPN([1, 1]), x, y, x_test, **args)
    assert any(issubclass(w.category, ConvergenceWarning) for w in caught) == warns


def test_laplace_metric_stays_at_each_chains_start(monkeypatch):
    """``metric="laplace"``: each chain starts from its own dense matrix and keeps it through a
    warm-up long enough for a mass-matrix window (only the step size adapts)."""
    from pyro_gpn.inference import nuts_chains

    kernels = []

    class Spy(nuts_chains.RecordingNUTS):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            kernels.append(self)

    monkeypatch.setattr(nuts_chains, "RecordingNUTS", Spy)
    x, y, x_test = sine_data(6, 2)
    args = dict(num_samples=2, warmup_steps=24, num_chains=2, init_steps=5, max_tree_depth=3)
    run_nuts(NonParametricGPN([1, 1]), x, y, x_test, metric="laplace", **args)
    assert len(kernels) == 2
    assert not torch.equal(kernels[0].inverse_mass[0], kernels[1].inverse_mass[0])
    for kernel in kernels:
        (given,) = kernel.inverse_mass
        (final,) = kernel.mass_matrix_adapter.inverse_mass_matrix.values()
        assert given.shape == (2, 2)
        torch.testing.assert_close(final, given, rtol=0, atol=0)
