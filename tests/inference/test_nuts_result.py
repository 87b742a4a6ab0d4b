"""Tests of :class:`pyro_gpn.inference.nuts_result.NUTSResult` on hand-made chains: the
divergence count and rate, and the convergence check on the identified quantities, against
counts and ArviZ diagnostics computed here on the same draws."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pytest
import torch
from pyro.infer import MCMC, NUTS

from pyro_gpn.inference.nuts_chains import merge_chains
from pyro_gpn.inference.nuts_result import NUTSResult
from pyro_gpn.models.nonparametric import NonParametricGPN

F64 = torch.float64
DRAWS = 50
DIVERGENT = {0: [4], 1: [1, 7, 30]}


def _result() -> tuple[NUTSResult, dict[str, np.ndarray]]:
    """Two chains of a ``[1, 2, 1]`` network: the output noise ``sigma2`` of chain 1 sits
    elsewhere (r-hat far above 1), the hidden noise ``sigma1`` and ``y_test`` mix."""
    rng = np.random.default_rng(0)
    model = NonParametricGPN([1, 2, 1])
    draws = {
        "W1": rng.standard_normal((2, DRAWS, 2, 1)),
        "sigma1": np.exp(rng.standard_normal((2, DRAWS, 2))),
        "W2": rng.standard_normal((2, DRAWS, 1, 2)),
        "sigma2": 0.1 + 0.01 * rng.random((2, DRAWS, 1)) + np.array([0.0, 0.5])[:, None, None],
        "y_test": rng.standard_normal((2, DRAWS, 1, 3)),
    }
    chains = [
        {
            "samples": {
                k: torch.tensor(v[c : c + 1], dtype=F64) for k, v in draws.items() if k != "y_test"
            },
            "diagnostics": {"divergences": DIVERGENT[c], "acceptance rate": 0.8},
        }
        for c in range(2)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        template = MCMC(NUTS(model.model), num_samples=DRAWS, warmup_steps=0, num_chains=2)
    mcmc = merge_chains(chains, template)
    x = torch.linspace(-1, 1, 5, dtype=F64)[:, None]
    y_test = torch.tensor(draws["y_test"].reshape(2 * DRAWS, 1, 3), dtype=F64)
    result = NUTSResult(
        mcmc=mcmc,
        samples=mcmc.get_samples(),
        posterior_predictive={"y_test": y_test},
        model=model,
        x_train=x,
        y_train=torch.sin(x[:, 0]),
        x_test=x[:3],
        joint=False,
        wall_time_s=0.0,
    )
    return result, draws


def test_divergences_are_counted_over_every_chain():
    result, _ = _result()
    total = sum(len(v) for v in DIVERGENT.values())
    assert result.num_divergences == total == 4
    assert result.divergence_rate == pytest.approx(total / (2 * DRAWS), rel=1e-15)
    assert result.convergence().divergence_rate == pytest.approx(0.04, rel=1e-15)


def test_convergence_checks_the_output_layers_noise_and_the_predictions():
    """A ``[1, 2, 1]`` network: the output noise is ``sigma2`` (the hidden ``sigma1`` is not an
    identified quantity); max r-hat and min bulk ESS are ArviZ's over ``y_test``'s components
    and ``sigma2``."""
    result, draws = _result()
    report = result.convergence()
    assert report.quantities == ("y_test", "sigma2")
    rhats = [float(az.rhat(draws["y_test"][:, :, 0, j])) for j in range(3)]
    rhats.append(float(az.rhat(draws["sigma2"][:, :, 0])))
    ess = [float(az.ess(draws["y_test"][:, :, 0, j], method="bulk")) for j in range(3)]
    ess.append(float(az.ess(draws["sigma2"][:, :, 0], method="bulk")))
    assert report.max_rhat == pytest.approx(max(rhats), rel=1e-12)
    assert report.max_rhat > 1.5
    assert report.min_ess_bulk == pytest.approx(min(ess), rel=1e-12)
    assert not report.converged


def test_test_log_density_is_each_rows_gp_predictive():
    """Regression: ``log N(y_j; m_j, v_j)`` per draw and test row, with ``m`` and ``v`` the GP
    predictive of a one-layer network given the draw's weight and noise, written out with
    NumPy (``C = K_w + (sigma^2 + jitter) I`` over train and test rows, ``m = C_21 C_11^{-1}
    y``, ``v = diag(C_22 - C_21 C_11^{-1} C_12)``) and scipy's normal density."""
    import scipy.stats

    model = NonParametricGPN([2, 1])
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 2, generator=g, dtype=F64)
    y = torch.randn(6, generator=g, dtype=F64)
    x_test = torch.randn(3, 2, generator=g, dtype=F64)
    y_test = torch.randn(3, generator=g, dtype=F64)
    samples = {
        "W1": torch.tensor([[[0.8, -0.3]], [[1.5, 0.6]]], dtype=F64),
        "sigma1": torch.tensor([[0.3], [0.05]], dtype=F64),
    }
    result = NUTSResult(
        mcmc=None,
        samples=samples,
        posterior_predictive={},
        model=model,
        x_train=x,
        y_train=y,
        x_test=x_test,
        joint=False,
        wall_time_s=0.0,
    )
    got = result.test_log_density(y_test)
    assert got.shape == (2, 3)
    rows = np.concatenate([x.numpy(), x_test.numpy()])
    for d in range(2):
        w, s = samples["W1"][d, 0].numpy(), float(samples["sigma1"][d, 0])
        proj = (rows[:, None, :] - rows[None, :, :]) @ w
        cov = np.exp(-0.5 * proj**2) + (s**2 + model.jitter) * np.eye(9)
        c11, c21, c22 = cov[:6, :6], cov[6:, :6], cov[6:, 6:]
        mean = c21 @ np.linalg.solve(c11, y.numpy())
        var = np.diag(c22 - c21 @ np.linalg.solve(c11, c21.T))
        want = scipy.stats.norm(mean, np.sqrt(var)).logpdf(y_test.numpy())
        np.testing.assert_allclose(got[d].numpy(), want, rtol=1e-9, atol=1e-10)


def test_draws_per_chunk_follows_the_widest_layer():
    """Four ``[width, rows, rows]`` float64 matrices per draw, ``width`` the widest layer's
    (here the hidden one, not the output), in ``CHUNK_BYTES``; at least one draw."""
    from pyro_gpn.inference.nuts_result import CHUNK_BYTES, draws_per_chunk

    model = NonParametricGPN([1, 5, 2])
    assert draws_per_chunk(model, 30) == CHUNK_BYTES // (4 * 8 * 30 * 30 * 5)
    assert draws_per_chunk(model, 30) < CHUNK_BYTES // (4 * 8 * 30 * 30 * 2)
    assert draws_per_chunk(model, 10**5) == 1


def test_classification_predict_is_the_mean_and_spread_of_the_draws():
    """Classification: ``predict()`` gives the draws' mean class probabilities and their
    standard deviation over the draws (NumPy, ``ddof=1`` as torch), not a standard error."""
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((40, 4, 3))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    result = NUTSResult(
        mcmc=None,
        samples={},
        posterior_predictive={"p_test": torch.tensor(probs, dtype=F64)},
        model=NonParametricGPN([2, 3], likelihood="categorical"),
        x_train=torch.zeros(5, 2, dtype=F64),
        y_train=torch.zeros(5, dtype=torch.long),
        x_test=torch.zeros(4, 2, dtype=F64),
        joint=False,
        wall_time_s=0.0,
    )
    prediction = result.predict()
    assert prediction.task == "classification"
    np.testing.assert_allclose(prediction.mean.numpy(), probs.mean(0), rtol=1e-12)
    np.testing.assert_allclose(prediction.std.numpy(), probs.std(0, ddof=1), rtol=1e-12)
