"""Tests of :mod:`pyro_gpn.inference.nuts_informed` and of NUTS on
``NonParametricGPN(activations="likelihood-informed")``."""

from __future__ import annotations

import math

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS

from pyro_gpn.inference.mcmc import run_nuts
from pyro_gpn.inference.nuts_informed import (
    activation_anchor,
    informed_chain_models,
    twin,
    whitened_samples,
)
from pyro_gpn.models.gp_rows import activation_cholesky
from pyro_gpn.models.nonparametric import NonParametricGPN

F64 = torch.float64


def _data(num_train: int, num_test: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.linspace(-2, 2, num_train + num_test, dtype=F64)[:, None]
    perm = torch.randperm(num_train + num_test, generator=g)
    x = x[perm]
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(len(x), generator=g, dtype=F64)
    return x[:num_train], y[:num_train], x[num_train:]


def test_chain_starts_round_trip_and_anchor_slope():
    """Each chain's converted start maps back to its whitened start (``e = M^T z - c`` and
    ``z = M^{-T}(e + c)``), is closer to the origin (``e = M^{-1} z`` at the anchor's own fit),
    and ``kappa`` is the squared slope of the fitted output function -- checked by central finite
    differences of the GP posterior mean written out independently."""
    x, y, _ = _data(7, 0)
    model = NonParametricGPN([1, 3, 1], activations="likelihood-informed")
    g = torch.Generator().manual_seed(1)
    params = {
        "W1": torch.randn(2, 3, 1, generator=g, dtype=F64),
        "sigma1": math.log(0.1) + 0.3 * torch.randn(2, 3, generator=g, dtype=F64),
        "W2": torch.randn(2, 1, 3, generator=g, dtype=F64),
        "sigma2": torch.full((2, 1), math.log(0.1), dtype=F64),
        "Ea2_train": 2 * torch.randn(2, 7, generator=g, dtype=F64),
    }
    models, starts = informed_chain_models(model, x, y, None, params)
    assert model.activation_anchor is None and len(models) == 2
    assert not torch.equal(models[0].activation_anchor[0], models[1].activation_anchor[0])
    for c, chain_model in enumerate(models):
        values = {k: v[c] for k, v in starts.items()}
        values = {**values, "sigma1": values["sigma1"].exp(), "sigma2": values["sigma2"].exp()}
        trace = poutine.trace(poutine.condition(chain_model.model, values)).get_trace(x, y)
        z = params["Ea2_train"][c]
        torch.testing.assert_close(trace.nodes["Za2_train_whitened"]["value"], z)
        assert starts["Ea2_train"][c].norm() < z.norm()
        # the anchor is the start's activations and kappa = f'(a)^2 there
        chol = activation_cholesky(
            x, values["W1"], values["sigma1"], 1.0, values["W2"], model.jitter
        )
        a = chol @ z
        a_hat, kappa = chain_model.activation_anchor
        torch.testing.assert_close(a_hat, a)

        def mean_fn(t, a=a):
            gram = torch.exp(-0.5 * (a[:, None] - a[None, :]) ** 2)
            alpha = torch.linalg.solve(gram + (0.01 + model.jitter) * torch.eye(7, dtype=F64), y)
            return torch.exp(-0.5 * (t[:, None] - a[None, :]) ** 2) @ alpha

        h = 1e-5
        slope = (mean_fn(a + h) - mean_fn(a - h)) / (2 * h)
        torch.testing.assert_close(kappa, slope.square(), rtol=1e-6, atol=1e-8)
        assert kappa.max() > 0.1


def test_activation_anchor_of_a_line():
    """Targets exactly linear in the activations with tiny noise: the fitted slope is the
    line's (2), so ``kappa`` is 4 away from the ends."""
    a = torch.linspace(-1, 1, 15, dtype=F64)[:, None]
    model = NonParametricGPN([1, 2, 1], activations="likelihood-informed")
    a_hat, kappa = activation_anchor(model, a, 2 * a.mT, torch.tensor([1e-3], dtype=F64), 3.0)
    torch.testing.assert_close(a_hat, a)
    torch.testing.assert_close(kappa[3:-3], torch.full_like(kappa[3:-3], 4.0), rtol=1e-3, atol=0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_nuts_on_informed_coordinates_recovers_the_prior():
    """With the likelihood hidden (``poutine.block`` of ``y_train``) the posterior is the prior,
    which is analytic: ``log sigma_2 ~ N(log 0.3, 0.3^2)`` and, given the fixed first-layer
    parameters, ``A ~ N(0, C)``. NUTS over ``(sigma_2, e)`` -- an anchor far from zero and
    curvature weights for which ``log det M`` changes by several nats over the prior of
    ``sigma_2`` -- must reproduce the mean and variance of ``log sigma_2`` and ``A``'s
    covariance within 4 Monte Carlo standard errors (ArviZ's ``mcse``). Dropping the Jacobian
    ``-log det M`` (or the mean shift) moves the ``sigma_2`` marginal."""
    pyro.set_rng_seed(0)
    x = torch.tensor([[-0.5], [0.7]], dtype=F64)
    y = torch.tensor([1.0, 0.6], dtype=F64)
    fixed = {
        "W1": torch.tensor([[1.2], [-0.7]], dtype=F64),
        "sigma1": torch.tensor([0.3, 0.5], dtype=F64),
        "W2": torch.tensor([[1.5, 0.8]], dtype=F64),
    }
    prior = dist.LogNormal(torch.tensor(math.log(0.3), dtype=F64), 0.3)
    model = NonParametricGPN([1, 2, 1], activations="likelihood-informed", noise_prior=prior)
    model.set_activation_anchor(torch.tensor([0.9, -1.4], dtype=F64), 0.5)
    conditioned = poutine.block(poutine.condition(model.model, fixed), hide=["y_train"])
    kernel = NUTS(conditioned, jit_compile=True, ignore_jit_warnings=True)
    mcmc = MCMC(kernel, num_samples=1000, warmup_steps=300, disable_progbar=True)
    mcmc.run(x, y)
    draws = mcmc.get_samples()
    a = torch.stack(
        [
            poutine.trace(poutine.condition(conditioned, {"Ea2_train": e, "sigma2": s}))
            .get_trace(x, y)
            .nodes["A2"]["value"][:, 0]
            for e, s in zip(draws["Ea2_train"], draws["sigma2"], strict=True)
        ]
    )
    chol = activation_cholesky(x, fixed["W1"], fixed["sigma1"], 1.0, fixed["W2"], model.jitter)
    cov = chol @ chol.mT
    log_s = draws["sigma2"][:, 0].log()
    checks = [
        (log_s, math.log(0.3)),
        ((log_s - math.log(0.3)) ** 2, 0.09),
        (a[:, 0], 0.0),
        (a[:, 1], 0.0),
        (a[:, 0] ** 2, float(cov[0, 0])),
        (a[:, 1] ** 2, float(cov[1, 1])),
        (a[:, 0] * a[:, 1], float(cov[0, 1])),
    ]
    for stat, value in checks:
        mcse = float(np.asarray(az.mcse(stat.numpy()[None])).reshape(-1)[0])
        assert abs(float(stat.mean()) - value) < 4 * mcse, (float(stat.mean()), value, mcse)
        assert mcse < 0.1 * float(stat.std())  # an effective sample size above 100
    # the test is sensitive: log det M varies over the prior of sigma_2 by several nats
    m_lo, _ = model.informed_factor(chol, torch.tensor([0.3 * math.exp(-0.6)], dtype=F64))
    m_hi, _ = model.informed_factor(chol, torch.tensor([0.3 * math.exp(0.6)], dtype=F64))
    assert float(m_lo.diagonal().log().sum() - m_hi.diagonal().log().sum()) > 1.5


def test_run_nuts_returns_whitened_draws():
    """``run_nuts`` with a likelihood-informed model: per-chain anchors, draws returned in the
    whitened coordinates with the whitened twin as the result's model, whose predictive and
    ArviZ groups work; the user's model keeps no anchor."""
    x, y, x_test = _data(8, 3)
    model = NonParametricGPN([1, 2, 1], activations="likelihood-informed")
    result = run_nuts(
        model, x, y, x_test, num_samples=4, warmup_steps=4, num_chains=2, init_steps=5
    )
    assert model.activation_anchor is None
    assert result.model.activations == "whitened" and result.model.activation_anchor is None
    assert "Za2_train" in result.samples and not any(k.startswith("Ea") for k in result.samples)
    assert result.samples["Za2_train"].shape == (8, 8)
    assert result.y_test.shape == (8, 3) and torch.isfinite(result.y_test).all()
    assert "log_likelihood" in result.to_arviz().groups()


def test_whitened_samples_and_twin():
    """``whitened_samples`` reads ``Za{L}_train_whitened`` draw by draw; ``twin`` copies the
    priors and clears the anchor."""
    x, y, _ = _data(5, 0)
    model = NonParametricGPN([1, 2, 1], activations="likelihood-informed")
    model.set_activation_anchor(torch.zeros(5, dtype=F64), 2.0)
    g = torch.Generator().manual_seed(4)
    samples = {
        "W1": torch.randn(1, 3, 2, 1, generator=g, dtype=F64),
        "sigma1": 0.1 + torch.rand(1, 3, 2, generator=g, dtype=F64),
        "W2": torch.randn(1, 3, 1, 2, generator=g, dtype=F64),
        "sigma2": 0.1 + torch.rand(1, 3, 1, generator=g, dtype=F64),
        "Ea2_train": torch.randn(1, 3, 5, generator=g, dtype=F64),
    }
    out = whitened_samples(model, samples, (x, y, None))
    assert set(out) == {"W1", "sigma1", "W2", "sigma2", "Za2_train"}
    white = twin(model, "whitened")
    assert white.noise_priors is model.noise_priors and model.activation_anchor is not None
    for d in range(3):
        values = {k: v[0, d] for k, v in samples.items()}
        a = poutine.trace(poutine.condition(model.model, values)).get_trace(x, y).nodes["A2"]
        wvalues = {k: v[0, d] for k, v in out.items()}
        chol = activation_cholesky(
            x, wvalues["W1"], wvalues["sigma1"], 1.0, wvalues["W2"], model.jitter
        )
        torch.testing.assert_close(chol @ wvalues["Za2_train"], a["value"][:, 0])


def test_the_whitened_twin_has_no_anchor_and_the_whitened_density():
    """``twin(model, "whitened")`` of an anchored model drops the anchor: with the same draw
    its log density is a fresh whitened model's (``Za2_train`` in place of ``Ea2_train``)."""
    x, y, _ = _data(5, 0)
    model = NonParametricGPN([1, 2, 1], activations="likelihood-informed")
    model.set_activation_anchor(torch.linspace(-1, 1, 5, dtype=F64), 3.0)
    white = twin(model, "whitened")
    assert white.activations == "whitened" and white.activation_anchor is None
    assert model.activation_anchor is not None
    g = torch.Generator().manual_seed(6)
    values = {
        "W1": torch.randn(2, 1, generator=g, dtype=F64),
        "sigma1": 0.1 + torch.rand(2, generator=g, dtype=F64),
        "W2": torch.randn(1, 2, generator=g, dtype=F64),
        "sigma2": 0.1 + torch.rand(1, generator=g, dtype=F64),
        "Za2_train": torch.randn(5, generator=g, dtype=F64),
    }
    densities = [
        poutine.trace(poutine.condition(m.model, values)).get_trace(x, y).log_prob_sum()
        for m in (white, NonParametricGPN([1, 2, 1]))
    ]
    torch.testing.assert_close(densities[0], densities[1], rtol=0, atol=1e-12)
