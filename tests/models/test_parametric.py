"""Tests of the sampled parametric GPN (pyro_gpn.models.parametric)."""

import math
import time
import warnings

import pyro
import pyro.optim
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Trace_ELBO

from pyro_gpn import GPNNet
from pyro_gpn.heads import GaussianHead
from pyro_gpn.inference.svi import fit_svi
from pyro_gpn.losses import gaussian_predictive_log_likelihood, target_variance_penalty
from pyro_gpn.models.parametric import ParametricGPN
from tests.mc import assert_mc_mean, assert_mc_variance

DTYPE = torch.float64


@pytest.fixture(autouse=True)
def _validation():
    pyro.clear_param_store()
    pyro.enable_validation(True)
    yield
    pyro.clear_param_store()


def _regression_data(num=12, in_features=2, out_features=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(num, in_features, generator=g, dtype=DTYPE) * 2 - 1
    y = torch.randn(num, out_features, generator=g, dtype=DTYPE)
    return x, y


def _reference_loss(gpn, x, y):
    """eq:gpn_parametrized_loss (+ S * eq:gpn_ls), one draw, written out independently.

    Draws each layer's outputs ``mu + sqrt(var) * randn`` in the same order as the model and
    evaluates the Gaussian / categorical negative log-likelihood by hand.
    """
    layers = gpn.network.layers
    h = x
    for layer in layers[:-1]:
        mean, var = layer.conditional(h @ layer.weight)
        h = mean + var.sqrt() * torch.randn(mean.shape, dtype=mean.dtype)
    mean, var = layers[-1].conditional(h @ layers[-1].weight)  # noise iff the layer has some
    if isinstance(gpn.head, GaussianHead):
        f = mean + var.sqrt() * torch.randn(mean.shape, dtype=mean.dtype)
        s2 = gpn.network.noise_std.square()
        nll = (0.5 * (math.log(2 * math.pi) + s2.log() + (y - f).square() / s2)).sum()
    else:
        out = mean + var.sqrt() * torch.randn(mean.shape, dtype=mean.dtype)
        logits = out @ gpn.head.weight + gpn.head.bias
        nll = -logits.log_softmax(-1).gather(-1, y[:, None]).sum()
    if gpn.penalty:
        nll = nll + x.shape[0] * target_variance_penalty([la.target_variances for la in layers])
    return nll


class TestModel:
    @pytest.mark.parametrize("head", ["gaussian", "softmax"])
    def test_sites_and_shapes(self, head):
        torch.manual_seed(0)
        sizes = [2, 3, 2] if head == "gaussian" else [2, 3, 4, 3]
        gpn = ParametricGPN(sizes, head=head, dtype=DTYPE)
        x, y = _regression_data()
        if head == "softmax":
            y = torch.randint(0, 3, (12,))
        trace = poutine.trace(gpn.model).get_trace(x, y)
        trace.compute_log_prob()
        sample_sites = {n for n, s in trace.nodes.items() if s["type"] == "sample"}
        latent = {
            n
            for n, s in trace.nodes.items()
            if s["type"] == "sample"
            and not s["is_observed"]
            and type(s["fn"]).__name__ != "_Subsample"
        }
        assert latent == set()  # no latent sites: the empty guide is exact
        assert trace.nodes["y"]["is_observed"]
        assert trace.nodes["y"]["log_prob"].shape == (12,)
        assert trace.nodes["X1"]["value"].shape == (12, 3)
        if head == "gaussian":
            assert {"X1", "F2", "y", "target_variance_penalty"} <= sample_sites
            assert trace.nodes["F2"]["value"].shape == (12, 2)
        else:
            assert {"X1", "X2", "logits", "y"} <= sample_sites
            assert trace.nodes["logits"]["value"].shape == (12, 3)

    @pytest.mark.parametrize("head", ["gaussian", "softmax"])
    def test_svi_step_without_warnings(self, head):
        torch.manual_seed(1)
        sizes = [2, 3, 2] if head == "gaussian" else [2, 3, 2]
        gpn = ParametricGPN(sizes, head=head, dtype=DTYPE)
        x, y = _regression_data()
        if head == "softmax":
            y = torch.randint(0, 2, (12,))
        before = [p.detach().clone() for p in gpn.parameters()]
        svi = SVI(gpn.model, gpn.guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loss = svi.step(x[:5], y[:5], num_data=12)
            svi.step(x, y)
        assert math.isfinite(loss)
        # every parameter that enters the model moved (the inducing points are buffers)
        after = list(gpn.parameters())
        assert len(after) == len(before) > 0
        assert all(not torch.equal(b, a) for b, a in zip(before, after, strict=True))

    def test_subsample_scale(self):
        gpn = ParametricGPN([2, 2], head="gaussian", dtype=DTYPE)
        x, y = _regression_data()
        trace = poutine.trace(gpn.model).get_trace(x[:4], y[:4], num_data=12)
        assert trace.nodes["y"]["value"].shape == (4, 2)
        assert trace.nodes["y"]["scale"] == pytest.approx(12 / 4)
        assert trace.nodes["target_variance_penalty"]["scale"] == 1.0

    def test_returns_samples_and_is_forward(self):
        torch.manual_seed(2)
        gpn = ParametricGPN([2, 3], head="gaussian", dtype=DTYPE)
        x, _ = _regression_data()
        pyro.set_rng_seed(3)
        a = gpn.model(x)
        assert a.shape == (12, 3)
        moments = gpn(x)  # forward: the network's closed-form predictive
        torch.testing.assert_close(moments.mean, gpn.network(x).mean)

    def test_argument_errors(self):
        with pytest.raises(ValueError, match="likelihood"):
            ParametricGPN([1, 1], head="gaussian", likelihood="exact")
        with pytest.raises(ValueError, match="penalty_beta"):
            ParametricGPN([1, 1], head="gaussian", penalty_beta=0.0)
        with pytest.raises(TypeError, match="GPNNet"):
            ParametricGPN.from_network(torch.nn.Linear(1, 1))
        gpn = ParametricGPN([2, 3, 2], head="softmax", dtype=DTYPE)
        x, _ = _regression_data()
        with pytest.raises(ValueError, match="x"):
            gpn.model(x[:, :1])
        with pytest.raises(ValueError, match="y"):
            gpn.model(x, torch.zeros(12))  # float labels
        with pytest.raises(ValueError, match="y"):
            gpn.model(x, torch.zeros(11, dtype=torch.long))
        with pytest.raises(ValueError, match="num_samples"):
            gpn.predict(x, num_samples=0)
        reg = ParametricGPN([2, 2], head="gaussian", dtype=DTYPE)
        with pytest.raises(ValueError, match="y"):
            reg.model(x, torch.zeros(12, 3, dtype=DTYPE))


class TestObjective:
    @pytest.mark.parametrize("head", ["gaussian", "softmax"])
    def test_svi_loss_is_the_direct_estimate(self, head):
        """Same seed: Pyro's Trace_ELBO equals eq:gpn_parametrized_loss evaluated by hand."""
        torch.manual_seed(4)
        sizes = [2, 3, 3, 2] if head == "gaussian" else [2, 3, 3, 4]
        gpn = ParametricGPN(sizes, head=head, dtype=DTYPE)
        x, y = _regression_data()
        if head == "softmax":
            y = torch.randint(0, 4, (12,))
        elbo = Trace_ELBO()
        for seed in range(3):
            pyro.set_rng_seed(seed)
            pyro_loss = elbo.loss(gpn.model, gpn.guide, x, y)
            torch.manual_seed(seed)
            with torch.no_grad():
                direct = _reference_loss(gpn, x, y).item()
            assert pyro_loss == pytest.approx(direct, rel=1e-10, abs=1e-10)

    def test_one_layer_loss_matches_closed_form(self):
        """One layer with observed inputs: E[per-draw loss] = S * net.loss exactly.

        ``K`` independent draws in one pass: the model on ``K`` stacked copies of the data
        (samples are independent given the parameters), the per-copy sums of ``-log p(y)``.
        """
        torch.manual_seed(5)
        gpn = ParametricGPN(
            [2, 2], head="gaussian", dtype=DTYPE, target_variance_init=0.05, penalty=False
        )
        x, y = _regression_data(num=8)
        closed = 8 * gpn.network.loss(x, y).item()
        num_draws = 4000
        pyro.set_rng_seed(0)
        with torch.no_grad():
            trace = poutine.trace(gpn.model).get_trace(
                x.repeat(num_draws, 1), y.repeat(num_draws, 1)
            )
            trace.compute_log_prob()
        losses = -trace.nodes["y"]["log_prob"].reshape(num_draws, 8).sum(-1)
        assert_mc_mean(losses[:, None], torch.tensor([closed], dtype=losses.dtype), n_se=4)
        # the estimator is not degenerate (the draws vary) and the test can resolve an error
        # of 1% of the loss
        se = losses.std() / num_draws**0.5
        assert 1e-4 * abs(closed) < se < 0.0025 * abs(closed)

    def test_marginal_likelihood_one_layer_is_exact(self):
        torch.manual_seed(6)
        gpn = ParametricGPN(
            [2, 2], head="gaussian", likelihood="marginal", penalty=False, dtype=DTYPE
        )
        x, y = _regression_data(num=8)
        expected = -gaussian_predictive_log_likelihood(gpn.network(x), y, reduction="sum")
        loss = Trace_ELBO().loss(gpn.model, gpn.guide, x, y)
        assert loss == pytest.approx(expected.item(), rel=1e-10)
        # and it lies below the expected (paper) objective, by Jensen's inequality
        assert loss < 8 * gpn.network.loss(x, y).item()

    def test_penalty_factor(self):
        torch.manual_seed(7)
        with_penalty = ParametricGPN([2, 3, 2], head="gaussian", dtype=DTYPE)
        without = ParametricGPN.from_network(with_penalty.network, penalty=False)
        x, y = _regression_data()
        elbo = Trace_ELBO()
        pyro.set_rng_seed(0)
        a = elbo.loss(with_penalty.model, with_penalty.guide, x, y)
        pyro.set_rng_seed(0)
        b = elbo.loss(without.model, without.guide, x, y)
        penalty = with_penalty.target_variance_penalty().item()
        assert penalty == pytest.approx(with_penalty.network.penalty().item())
        assert a - b == pytest.approx(12 * penalty, rel=1e-8)


class TestSharedParameters:
    def test_from_network_shares(self):
        net = GPNNet([2, 3, 2], head="gaussian")
        gpn = ParametricGPN.from_network(net)
        assert gpn.network is net
        assert {id(p) for p in gpn.parameters()} == {id(p) for p in net.parameters()}
        x, y = _regression_data()
        x, y = x.float(), y.float()
        before = net(x).mean.detach().clone()
        fit_svi(gpn.model, gpn.guide, x, y, num_steps=3, lr=0.05, progress=False, seed=0)
        assert not torch.allclose(net(x).mean, before)

    def test_one_layer_output_moments_match_closed_form(self):
        """Predictive draws of one layer agree with GPNNet's exact meanvar moments."""
        torch.manual_seed(8)
        gpn = ParametricGPN([2, 3], head="gaussian", dtype=DTYPE, target_variance_init=0.05)
        x, _ = _regression_data(num=5)
        pyro.set_rng_seed(0)
        samples = gpn.sample_predictive(x, num_samples=2000)
        closed = gpn.network(x)  # X^L = F^L + noise, exact for observed inputs
        assert samples["y"].shape == (2000, 5, 3)
        assert_mc_mean(samples["y"], closed.mean, n_se=4.5)
        assert_mc_variance(samples["y"], closed.var, n_se=4.5)
        response = gpn.network.hidden(x)  # F^L, noise-free
        assert_mc_mean(samples["F1"], response.mean, n_se=4.5)
        assert_mc_variance(samples["F1"], response.var, n_se=4.5)
        # chunked vectorised passes and the sequential Predictive route draw the same way
        chunked = gpn.sample_predictive(x, num_samples=203, max_rows=50)  # 10 copies per pass
        assert chunked["y"].shape == (203, 5, 3) and chunked["F1"].shape == (203, 5, 3)
        assert_mc_mean(chunked["y"], closed.mean, n_se=4.5)
        assert not torch.equal(chunked["y"][0], chunked["y"][10])
        sequential = gpn.sample_predictive(x, num_samples=200, parallel=False)
        assert sequential["y"].shape == (200, 5, 3)
        assert_mc_mean(sequential["y"], closed.mean, n_se=4.5)

    def test_softmax_hidden_and_logit_moments(self):
        """Softmax head: the drawn X^1 and logits of one GPN layer match the closed form."""
        torch.manual_seed(9)
        gpn = ParametricGPN([2, 3, 4], head="softmax", dtype=DTYPE, target_variance_init=0.05)
        x, _ = _regression_data(num=5)
        pyro.set_rng_seed(1)
        samples = gpn.sample_predictive(x, num_samples=2000)
        hidden = gpn.network.hidden(x)
        assert_mc_mean(samples["X1"], hidden.mean, n_se=4.5)
        assert_mc_variance(samples["X1"], hidden.var, n_se=4.5)
        logits = gpn.network(x)
        assert_mc_mean(samples["logits"], logits.mean, n_se=4.5)
        var = torch.diagonal(logits.cov, dim1=-2, dim2=-1)
        assert_mc_variance(samples["logits"], var, n_se=4.5)
        assert samples["probs"].shape == (2000, 5, 4)
        assert torch.allclose(samples["probs"].sum(-1), torch.ones(2000, 5, dtype=DTYPE))
        assert samples["y"].shape == (2000, 5)


class TestTraining:
    def test_recovers_sine(self):
        """A [1, 1]-GPN learns y = sin(2x) from noisy data by SVI on the sampled objective."""
        torch.manual_seed(0)
        x = torch.linspace(-1.5, 1.5, 100).unsqueeze(-1)
        truth = torch.sin(2 * x)
        y = truth + 0.1 * torch.randn_like(x)
        gpn = ParametricGPN([1, 1], head="gaussian")
        rmse_before = (gpn.network(x).mean - truth).square().mean().sqrt().item()
        start = time.perf_counter()
        result = fit_svi(gpn.model, gpn.guide, x, y, num_steps=150, lr=0.05, seed=0, progress=False)
        seconds = time.perf_counter() - start
        with torch.no_grad():
            rmse = (gpn.network(x).mean - truth).square().mean().sqrt().item()
            pred = gpn.sample_predictive(x, num_samples=100)["y"].mean(0)
            rmse_mc = (pred - truth).square().mean().sqrt().item()
        print(f"sine [1,1]: 150 steps, {seconds:.2f}s, rmse {rmse_before:.3f} -> {rmse:.3f}")
        assert rmse_before > 0.3
        assert rmse < 0.08
        assert rmse_mc < 0.1
        assert result.final_loss < result.losses[0]

    @pytest.mark.slow
    def test_recovers_sine_two_layers(self):
        torch.manual_seed(0)
        x = torch.linspace(-1.5, 1.5, 200).unsqueeze(-1)
        truth = torch.sin(2 * x)
        y = truth + 0.1 * torch.randn_like(x)
        gpn = ParametricGPN([1, 4, 1], head="gaussian")
        fit_svi(gpn.model, gpn.guide, x, y, num_steps=400, lr=0.02, seed=0, progress=False)
        with torch.no_grad():
            rmse = (gpn.network(x).mean - truth).square().mean().sqrt().item()
        print(f"sine [1,4,1]: 400 steps, rmse {rmse:.3f}")
        assert rmse < 0.1

    def test_classification_reduces_loss(self):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        x = torch.rand(80, 2, generator=g) * 2 - 1
        y = (x[:, 0] + x[:, 1] > 0).long()
        gpn = ParametricGPN([2, 3, 2], head="softmax")
        result = fit_svi(
            gpn.model,
            gpn.guide,
            x,
            y,
            num_steps=150,
            lr=0.05,
            batch_size=40,
            seed=0,
            progress=False,
        )
        first = sum(result.losses[:10]) / 10
        assert result.final_loss < 0.6 * first
        probs = gpn.sample_predictive(x, num_samples=30)["probs"].mean(0)
        accuracy = (probs.argmax(-1) == y).float().mean().item()
        assert accuracy > 0.9


def test_penalty_factor_of_a_minibatch_is_scaled_by_num_data():
    # a batch of 4 of num_data = 12: the factor is -12 L_S, with
    # L_S = sum_l alpha mean(sigmoid(beta / S_l)) (eq:gpn_ls, alpha 0.2, beta 0.01) by hand
    torch.manual_seed(7)
    gpn = ParametricGPN(
        [2, 3, 2], head="gaussian", dtype=DTYPE, penalty_alpha=0.2, penalty_beta=1e-2
    )
    x, y = _regression_data()
    trace = poutine.trace(gpn.model).get_trace(x[:4], y[:4], num_data=12)
    trace.compute_log_prob()
    by_hand = sum(
        0.2 * (1 / (1 + torch.exp(-1e-2 / layer.target_variances.detach()))).mean()
        for layer in gpn.network.layers
    )
    factor = trace.nodes["target_variance_penalty"]["log_prob"]
    assert float(factor.detach()) == pytest.approx(-12 * float(by_hand), rel=1e-10)


def test_penalty_factor_only_when_the_targets_are_observed():
    # a training term: the model that generates y has no penalty factor
    gpn = ParametricGPN([2, 3, 2], head="gaussian", dtype=DTYPE)
    x, y = _regression_data()
    assert "target_variance_penalty" not in poutine.trace(gpn.model).get_trace(x).nodes
    assert "target_variance_penalty" in poutine.trace(gpn.model).get_trace(x, y).nodes
