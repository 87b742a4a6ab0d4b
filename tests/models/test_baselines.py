"""Tests of the fixed-activation baselines (pyro_gpn.models.baselines)."""

import math

import pytest
import torch

from pyro_gpn.models.baselines import FixedActivationNet
from pyro_gpn.moments.gaussian import Moments

DTYPE = torch.float64


def _manual_forward(net, x):
    h = x
    for w, b in net.maps[:-1]:
        h = torch.tanh(h @ w + b)
    return h, h @ net.maps[-1][0] + net.maps[-1][1]


def _blobs(generator, n_per_class=40):
    centres = torch.tensor([[0.0, 2.0], [2.0, -1.0], [-2.0, -1.0]])
    x = torch.cat([c + 0.6 * torch.randn(n_per_class, 2, generator=generator) for c in centres])
    y = torch.arange(3).repeat_interleave(n_per_class)
    return x, y


class TestInterface:
    def test_softmax_shapes(self):
        torch.manual_seed(0)
        net = FixedActivationNet([16, 30, 15, 26]).eval()
        x = torch.rand(8, 16)
        logits = net(x)
        assert isinstance(logits, Moments) and logits.mean.shape == (8, 26)
        assert logits.is_deterministic
        assert net.hidden(x).mean.shape == (8, 15)
        loss = net.loss(x, torch.randint(0, 26, (8,)))
        assert loss.shape == () and torch.isfinite(loss)
        assert float(net.penalty()) == 0.0
        assert [tuple(w.shape) for w, _ in net.maps] == [(16, 30), (30, 15), (15, 26)]

    def test_gaussian_head(self):
        torch.manual_seed(0)
        net = FixedActivationNet([3, 10, 2], head="gaussian", noise_std_init=0.5).eval()
        x = torch.rand(5, 3)
        pred = net(x)
        torch.testing.assert_close(pred.mean, net.hidden(x).mean)
        torch.testing.assert_close(pred.variance, torch.full((5, 2), 0.25))
        y = torch.randn(5, 2)
        expected = -torch.distributions.Normal(pred.mean, 0.5).log_prob(y).sum(-1).mean()
        torch.testing.assert_close(net.loss(x, y), expected)

    def test_glorot_uniform_init(self):
        torch.manual_seed(0)
        net = FixedActivationNet([200, 300, 10])
        for w, _ in net.maps:
            r = math.sqrt(6.0 / sum(w.shape))
            assert float(w.detach().abs().max()) <= r
            # U(-r, r) has variance r^2 / 3; the sample variance has relative s.e. sqrt(0.8 / n)
            rel = float(w.detach().var()) / (r * r / 3) - 1
            assert abs(rel) < 5 * math.sqrt(0.8 / w.numel())
        assert all(float(b.detach().abs().max()) == 0.0 for _, b in net.maps)

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"sizes": [5]}, "sizes"),
            ({"sizes": [5, 0, 2]}, "sizes"),
            ({"sizes": [5, True, 2]}, "sizes"),
            ({"sizes": [5, 2.5, 2]}, "sizes"),
            ({"activation": "relu"}, "activation"),
            ({"head": "poisson"}, "head"),
            ({"dropout": 1.0}, "dropout"),
            ({"input_dropout": -0.1}, "input_dropout"),
            ({"quadrature_points": 1}, "quadrature_points"),
            ({"noise_std_init": 0.0}, "noise_std_init"),
        ],
    )
    def test_bad_constructor_arguments(self, kwargs, match):
        args = {"sizes": [4, 3, 2]}
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            FixedActivationNet(**args)

    def test_bad_inputs(self):
        net = FixedActivationNet([4, 3, 2])
        with pytest.raises(ValueError, match="x"):
            net(torch.zeros(5, 3))
        with pytest.raises(ValueError, match="x"):
            net(torch.full((5, 4), float("nan")))
        with pytest.raises(ValueError, match="target"):
            net.loss(torch.zeros(5, 4), torch.full((5,), 2))
        with pytest.raises(ValueError, match="x must be a floating-point tensor"):
            net(torch.zeros(5, 4, dtype=torch.long))

    def test_inputs_follow_the_dtype_rule(self):
        """float64 and NumPy inputs (and float64 targets) are cast to the parameters' dtype,
        as GPNNet's are, not refused with advice to cast the weight."""
        torch.manual_seed(0)
        net = FixedActivationNet([4, 3, 2]).eval()
        x, y = torch.rand(5, 4), torch.tensor([0, 1, 0, 1, 1])
        want = net.predict(x).probs
        for given in (x.double(), x.numpy()):
            torch.testing.assert_close(net.predict(given).probs, want)
            torch.testing.assert_close(net.loss(given, y), net.loss(x, y))
        regression = FixedActivationNet([4, 3, 1], head="gaussian").eval()
        targets = torch.randn(5, 1)
        torch.testing.assert_close(
            regression.loss(x.double(), targets.double()), regression.loss(x, targets)
        )

    def test_empty_batch_has_no_mean_loss(self):
        """As GPNNet.loss: the mean over no samples would be NaN."""
        net = FixedActivationNet([2, 3, 3])
        assert net.predict(torch.rand(0, 2)).probs.shape == (0, 3)
        with pytest.raises(ValueError, match="x has 0 samples"):
            net.loss(torch.rand(0, 2), torch.zeros(0, dtype=torch.long))


class TestDropout:
    def test_eval_mode_is_deterministic_network(self):
        torch.manual_seed(1)
        x = torch.rand(6, 4)
        for fast in (False, True):
            net = FixedActivationNet([4, 7, 5, 3], dropout=0.5, fast_dropout=fast).eval()
            out = net(x)
            assert out.is_deterministic
            torch.testing.assert_close(out.mean, _manual_forward(net, x)[1])

    def test_standard_dropout_is_random_and_unbiased_in_train_mode(self):
        torch.manual_seed(2)
        net = FixedActivationNet([6, 3], dropout=0.5).train()
        x = torch.rand(4, 6)
        first, second = net(x).mean, net(x).mean
        assert not torch.equal(first, second)
        # inverted dropout: the mask average of a linear map is the undropped map
        draws = torch.stack([net(x).mean for _ in range(4000)])
        se = draws.std(0) / math.sqrt(draws.shape[0])
        exact = x @ net.maps[0][0] + net.maps[0][1]
        assert torch.all((draws.mean(0) - exact).abs() < 4 * se)

    def test_fast_dropout_linear_moments_exact(self):
        # One linear map: the logits' mean and covariance over dropout masks are exact.
        g = torch.Generator().manual_seed(3)
        net = FixedActivationNet([5, 3], dropout=0.3, fast_dropout=True).to(DTYPE).train()
        x = torch.randn(4, 5, generator=g, dtype=DTYPE)
        logits = net(x)
        assert logits.cov is not None

        keep, draws = 0.7, 200_000
        mask = (torch.rand(draws, 4, 5, generator=g, dtype=DTYPE) < keep).to(DTYPE)
        samples = (mask * x / keep) @ net.maps[0][0] + net.maps[0][1]  # [draws, S, C]
        centred = samples - samples.mean(0)
        mc_cov = torch.einsum("dsi,dsj->sij", centred, centred) / (draws - 1)
        mean_se = samples.std(0) / math.sqrt(draws)
        assert torch.all((samples.mean(0) - logits.mean).abs() < 4 * mean_se)
        # s.e. of a sample covariance is at most sqrt(E[c_i^2 c_j^2] / n)
        cov_se = torch.einsum("dsi,dsj->sij", centred.square(), centred.square()) / draws
        cov_se = (cov_se / draws).sqrt()
        assert torch.all((mc_cov - logits.cov).abs() < 5 * cov_se + 1e-12)

    def test_activation_quadrature_matches_monte_carlo(self):
        # Given Gaussian pre-activations the tanh moments are near-exact (quadrature error < 1e-5
        # for sd <= 1), so they must agree with Monte Carlo within its standard error.
        g = torch.Generator().manual_seed(4)
        net = FixedActivationNet([2, 2], fast_dropout=True, dropout=0.5).to(DTYPE)
        mean = 2 * torch.randn(3, 4, generator=g, dtype=DTYPE)
        var = torch.rand(3, 4, generator=g, dtype=DTYPE)
        out = net._activate(Moments(mean, var=var))
        draws = 400_000
        a = mean + var.sqrt() * torch.randn(draws, 3, 4, generator=g, dtype=DTYPE)
        t = torch.tanh(a)
        n = float(draws)
        assert torch.all((t.mean(0) - out.mean).abs() < 4 * t.std(0) / math.sqrt(n))
        centred_sq = (t - t.mean(0)).square()
        assert torch.all((centred_sq.mean(0) - out.var).abs() < 4 * centred_sq.std(0) / n**0.5)

    def test_fast_dropout_hidden_layer_against_masks(self):
        # Through a tanh layer the Gaussian (central-limit) approximation of the pre-activation
        # is the only error; with 100 inputs it is small (measured: 0.005 on the mean, 2% on the
        # variance, both at the level of the Monte Carlo error: s.e. 0.0034 on the mean, ~1.5%
        # on the variance). Tolerances: 0.015 absolute on the mean, 6% on the variance; a
        # variance formula without the 1/p factor would be off by 20%.
        g = torch.Generator().manual_seed(5)
        m, h, keep = 100, 6, 0.8
        net = FixedActivationNet([m, h, 2], dropout=1 - keep, fast_dropout=True).to(DTYPE)
        net.train()
        x = torch.rand(3, m, generator=g, dtype=DTYPE)
        features = net.hidden(x)

        draws = 40_000
        w, b = net.maps[0]
        z1 = (torch.rand(draws, 3, m, generator=g, dtype=DTYPE) < keep).to(DTYPE)
        z2 = (torch.rand(draws, 3, h, generator=g, dtype=DTYPE) < keep).to(DTYPE)
        samples = z2 * torch.tanh((z1 * x / keep) @ w + b) / keep
        torch.testing.assert_close(features.mean, samples.mean(0), atol=0.015, rtol=0)
        torch.testing.assert_close(features.var, samples.var(0), atol=0, rtol=0.06)

    @pytest.mark.parametrize("fast", [False, True])
    def test_hidden_only_dropout_leaves_the_inputs(self, fast):
        # input_dropout=0: the first layer sees the data as they are, the hidden units are
        # dropped at `dropout`. Checked exactly (fast: the pre-activations are deterministic, so
        # the head input has mean tanh(a) and variance (1 - p) / p tanh(a)^2) and against masks.
        g = torch.Generator().manual_seed(6)
        keep = 0.7
        net = FixedActivationNet(
            [5, 4, 3], dropout=1 - keep, input_dropout=0.0, fast_dropout=fast
        ).to(DTYPE)
        net.train()
        x = torch.rand(3, 5, generator=g, dtype=DTYPE)
        units = torch.tanh(x @ net.maps[0][0] + net.maps[0][1])
        if fast:
            features = net.hidden(x)
            torch.testing.assert_close(features.mean, units)
            torch.testing.assert_close(features.var, (1 - keep) / keep * units.square())
        else:
            draws = torch.stack([net.hidden(x).mean for _ in range(2000)])
            # every draw is a masked copy of the undropped units: 0 or tanh(a) / keep
            kept = draws != 0
            torch.testing.assert_close(
                draws[kept], (units / keep).expand_as(draws)[kept], rtol=1e-12, atol=1e-12
            )
            assert (
                abs(kept.double().mean().item() - keep)
                < 4 * (keep * (1 - keep) / kept.numel()) ** 0.5
            )

    def test_input_dropout_defaults_to_dropout(self):
        net = FixedActivationNet([5, 4, 3], dropout=0.3)
        assert net.input_dropout == 0.3
        assert "input_dropout=0.1" in repr(
            FixedActivationNet([5, 3], dropout=0.3, input_dropout=0.1)
        )


class TestTraining:
    @pytest.mark.parametrize("dropout, fast", [(0.0, False), (0.2, False), (0.2, True)])
    def test_training_reduces_classification_loss(self, dropout, fast):
        g = torch.Generator().manual_seed(6)
        torch.manual_seed(6)
        x, y = _blobs(g)
        net = FixedActivationNet([2, 16, 3], dropout=dropout, fast_dropout=fast)
        before = float(net.eval().loss(x, y).detach())
        opt = torch.optim.Adam(net.parameters(), lr=0.02)
        net.train()
        for _ in range(150):
            opt.zero_grad()
            net.loss(x, y).backward()
            opt.step()
        net.eval()
        after = float(net.loss(x, y).detach())
        assert after < 0.3 * before
        error = (net(x).mean.argmax(-1) != y).float().mean()
        assert error < 0.05

    def test_training_fits_regression(self):
        g = torch.Generator().manual_seed(7)
        torch.manual_seed(7)
        x = torch.rand(100, 1, generator=g) * 4 - 2
        y = torch.sin(2 * x) + 0.1 * torch.randn(100, 1, generator=g)
        net = FixedActivationNet([1, 20, 1], head="gaussian")
        opt = torch.optim.Adam(net.parameters(), lr=0.02)
        for _ in range(400):
            opt.zero_grad()
            net.loss(x, y).backward()
            opt.step()
        net.eval()
        rmse = (net(x).mean - y).square().mean().sqrt()
        assert rmse < 0.2
        assert 0.05 < float(net.noise_std.detach()) < 0.4
