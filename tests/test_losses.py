"""Tests of pyro_gpn.losses against Monte Carlo, closed forms and autograd."""

import math

import pytest
import torch
import torch.nn.functional as F

from pyro_gpn.losses import (
    gaussian_expected_nll,
    gaussian_predictive_log_likelihood,
    log_mean_softmax,
    target_variance_penalty,
    unscented_cross_entropy,
    unscented_log_predictive,
    unscented_logits,
    unscented_points,
)
from pyro_gpn.moments.gaussian import Moments

DTYPE = torch.float64


def _random_cov(generator, s, n, scale):
    a = scale * torch.randn(s, n, n, generator=generator, dtype=DTYPE)
    return a @ a.mT + 1e-3 * scale**2 * torch.eye(n, dtype=DTYPE)


def _mc_cross_entropy(mean, cov, target, weight, bias, num_draws, generator):
    """Monte Carlo mean and standard error of the softmax cross-entropy, per sample."""
    chol = torch.linalg.cholesky(cov)
    eps = torch.randn(mean.shape[0], num_draws, mean.shape[1], 1, generator=generator, dtype=DTYPE)
    x = mean.unsqueeze(1) + (chol.unsqueeze(1) @ eps).squeeze(-1)
    logits = x @ weight + bias
    index = target.view(-1, 1, 1).expand(-1, num_draws, 1)
    ce = torch.logsumexp(logits, -1) - logits.gather(-1, index).squeeze(-1)
    return ce.mean(1), ce.std(1) / math.sqrt(num_draws)


# ---------------------------------------------------------------------------------- regression
class TestGaussianExpectedNLL:
    def test_matches_monte_carlo(self):
        g = torch.Generator().manual_seed(0)
        s, n, draws = 5, 3, 200_000
        mean = torch.randn(s, n, generator=g, dtype=DTYPE)
        var = 0.5 * torch.rand(s, n, generator=g, dtype=DTYPE) + 0.1
        target = torch.randn(s, n, generator=g, dtype=DTYPE)
        noise_std = torch.tensor([0.3, 0.7, 1.2], dtype=DTYPE)

        exact = gaussian_expected_nll(Moments(mean, var=var), target, noise_std, reduction="none")

        f = mean + var.sqrt() * torch.randn(draws, s, n, generator=g, dtype=DTYPE)
        nll = -torch.distributions.Normal(f, noise_std).log_prob(target).sum(-1)  # [draws, S]
        mc, se = nll.mean(0), nll.std(0) / math.sqrt(draws)
        assert torch.all((exact - mc).abs() < 4 * se)
        # the variance matters: the plug-in of the mean alone is far off
        plug_in = gaussian_expected_nll(Moments(mean), target, noise_std, reduction="none")
        assert torch.all((plug_in - mc).abs() > 20 * se)

    def test_deterministic_equals_normal_log_prob(self):
        g = torch.Generator().manual_seed(1)
        mean = torch.randn(4, 2, generator=g, dtype=DTYPE)
        target = torch.randn(4, 2, generator=g, dtype=DTYPE)
        expected = -torch.distributions.Normal(mean, 0.5).log_prob(target).sum(-1)
        got = gaussian_expected_nll(Moments(mean), target, 0.5, reduction="none")
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(
            gaussian_expected_nll(Moments(mean), target, torch.tensor([0.5], dtype=DTYPE)),
            expected.mean(),
        )
        torch.testing.assert_close(
            gaussian_expected_nll(Moments(mean), target, 0.5, reduction="sum"), expected.sum()
        )

    def test_full_cov_uses_diagonal(self):
        g = torch.Generator().manual_seed(2)
        mean = torch.randn(3, 4, generator=g, dtype=DTYPE)
        cov = _random_cov(g, 3, 4, 0.5)
        target = torch.randn(3, 4, generator=g, dtype=DTYPE)
        full = gaussian_expected_nll(Moments(mean, cov=cov), target, 0.8)
        diag = gaussian_expected_nll(Moments(mean, var=torch.diagonal(cov, 0, -2, -1)), target, 0.8)
        torch.testing.assert_close(full, diag)

    def test_gradcheck(self):
        g = torch.Generator().manual_seed(3)
        mean = torch.randn(3, 2, generator=g, dtype=DTYPE, requires_grad=True)
        var = (torch.rand(3, 2, generator=g, dtype=DTYPE) + 0.1).requires_grad_()
        noise = (torch.rand(2, generator=g, dtype=DTYPE) + 0.2).requires_grad_()
        target = torch.randn(3, 2, generator=g, dtype=DTYPE)
        fn = lambda m, v, s: gaussian_expected_nll(Moments(m, var=v), target, s, reduction="none")
        assert torch.autograd.gradcheck(fn, (mean, var, noise))

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"target": torch.zeros(3, 3)}, "target"),
            ({"target": torch.full((3, 2), float("nan"))}, "target"),
            ({"noise_std": torch.tensor([1.0, -1.0])}, "noise_std"),
            ({"noise_std": torch.ones(3)}, "noise_std"),
            ({"noise_std": 0.0}, "noise_std"),
            ({"reduction": "avg"}, "reduction"),
            ({"response": Moments(torch.full((3, 2), float("nan")), validate=False)}, "response"),
        ],
    )
    def test_bad_input(self, kwargs, match):
        args = {
            "response": Moments(torch.zeros(3, 2)),
            "target": torch.zeros(3, 2),
            "noise_std": 1.0,
        }
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            gaussian_expected_nll(**args)


class TestPredictiveLogLikelihood:
    def test_diag_and_full_match_torch(self):
        g = torch.Generator().manual_seed(4)
        mean = torch.randn(5, 3, generator=g, dtype=DTYPE)
        cov = _random_cov(g, 5, 3, 0.7)
        target = torch.randn(5, 3, generator=g, dtype=DTYPE)
        full = gaussian_predictive_log_likelihood(Moments(mean, cov=cov), target, reduction="none")
        mvn = torch.distributions.MultivariateNormal(mean, covariance_matrix=cov)
        torch.testing.assert_close(full, mvn.log_prob(target))
        var = torch.diagonal(cov, 0, -2, -1)
        diag = gaussian_predictive_log_likelihood(Moments(mean, var=var), target)
        expected = torch.distributions.Normal(mean, var.sqrt()).log_prob(target).sum(-1).mean()
        torch.testing.assert_close(diag, expected)

    def test_point_mass_and_zero_variance_raise(self):
        with pytest.raises(ValueError, match="predictive"):
            gaussian_predictive_log_likelihood(Moments(torch.zeros(2, 2)), torch.zeros(2, 2))
        zero_var = Moments(torch.zeros(2, 2), var=torch.zeros(2, 2))
        with pytest.raises(ValueError, match="predictive.var"):
            gaussian_predictive_log_likelihood(zero_var, torch.zeros(2, 2))


# ---------------------------------------------------------------------------------- classification


def _unscented_args() -> dict:
    """Valid arguments of the unscented losses' bad-input tests, to be overridden one at a time."""
    return {
        "features": Moments(torch.zeros(2, 3), var=torch.ones(2, 3)),
        "target": torch.tensor([0, 4]),
        "weight": torch.zeros(3, 5),
    }


class TestUnscentedCrossEntropy:
    S, N, C = 6, 4, 5

    def _problem(self, seed):
        g = torch.Generator().manual_seed(seed)
        mean = torch.randn(self.S, self.N, generator=g, dtype=DTYPE)
        weight = torch.randn(self.N, self.C, generator=g, dtype=DTYPE)
        bias = torch.randn(self.C, generator=g, dtype=DTYPE)
        target = torch.randint(0, self.C, (self.S,), generator=g)
        return g, mean, weight, bias, target

    def test_small_variance_matches_monte_carlo(self):
        # The transform is exact up to third order; the remaining error is O(sd^4 * d^4 CE),
        # here well below the Monte Carlo standard error (sd of the features ~ 0.2).
        g, mean, weight, bias, target = self._problem(0)
        cov = _random_cov(g, self.S, self.N, 0.1)
        ut = unscented_cross_entropy(Moments(mean, cov=cov), target, weight, bias, reduction="none")
        mc, se = _mc_cross_entropy(mean, cov, target, weight, bias, 200_000, g)
        assert torch.all((ut - mc).abs() < 4 * se + 1e-3)

    def test_moderate_variance_beats_plug_in(self):
        # With features sd ~ 0.6 neither approximation is exact, but the second-order
        # correction removes most of the plug-in (mean-only) bias (measured for this seed: mean
        # |error| 0.007 nats for the transform, 0.32 for the plug-in).
        g, mean, weight, bias, target = self._problem(1)
        cov = _random_cov(g, self.S, self.N, 0.3)
        ut = unscented_cross_entropy(Moments(mean, cov=cov), target, weight, bias, reduction="none")
        plug_in = F.cross_entropy(mean @ weight + bias, target, reduction="none")
        mc, se = _mc_cross_entropy(mean, cov, target, weight, bias, 100_000, g)
        assert (ut - mc).abs().mean() < 0.1 * (plug_in - mc).abs().mean()
        # Jensen: the cross-entropy is convex in the logits, so the plug-in never overestimates
        assert torch.all(plug_in < mc + 4 * se)

    def test_diagonal_cov_equals_var(self):
        g, mean, weight, bias, target = self._problem(2)
        var = torch.rand(self.S, self.N, generator=g, dtype=DTYPE)
        by_var = unscented_cross_entropy(Moments(mean, var=var), target, weight, bias)
        by_cov = unscented_cross_entropy(
            Moments(mean, cov=torch.diag_embed(var)), target, weight, bias
        )
        torch.testing.assert_close(by_var, by_cov)

    def test_deterministic_is_cross_entropy(self):
        _, mean, weight, bias, target = self._problem(3)
        got = unscented_cross_entropy(Moments(mean), target, weight, bias, reduction="sum")
        torch.testing.assert_close(
            got, F.cross_entropy(mean @ weight + bias, target, reduction="sum")
        )
        zero_var = Moments(mean, var=torch.zeros_like(mean))
        torch.testing.assert_close(
            unscented_cross_entropy(zero_var, target, weight, bias),
            F.cross_entropy(mean @ weight + bias, target),
        )

    def test_singular_cov_and_identity_head(self):
        # rank-one covariance: Cholesky needs the jitter fallback; the result must be finite and
        # equal (to jitter accuracy) to the transform with the exact rank-one square root
        g, mean, _, _, target = self._problem(4)
        target = target % self.N
        v = torch.randn(self.S, self.N, 1, generator=g, dtype=DTYPE)
        moments = Moments(mean, cov=v @ v.mT)
        got = unscented_cross_entropy(moments, target, reduction="none")
        # one nonzero column L = v: the 2N points reduce to mu +- sqrt(N) v (weight 1/2 each)
        # plus 2(N-1) points at mu (total weight (N-1)/N)
        ce = lambda x: F.cross_entropy(x, target, reduction="none")
        root = math.sqrt(self.N) * v.squeeze(-1)
        expected = (ce(mean + root) + ce(mean - root)) / (2 * self.N)
        expected = expected + (self.N - 1) / self.N * ce(mean)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)

    def test_jitter_perturbs_only_the_singular_matrices_of_a_batch(self):
        """A batch of a positive-definite and a rank-one covariance: the jitter that lets the
        rank-one factorise must leave the other's sigma points those of its exact Cholesky
        factor (the jitter, 1e-8 of the diagonal, would show at 1e-12)."""
        g = torch.Generator().manual_seed(9)
        n = self.N
        good = _random_cov(g, 1, n, 1.0)[0]
        v = torch.randn(n, 1, generator=g, dtype=DTYPE)
        mean = torch.randn(2, n, generator=g, dtype=DTYPE)
        points, _ = unscented_points(Moments(mean, cov=torch.stack([good, v @ v.mT])))
        chol = torch.linalg.cholesky(good)
        expected = torch.cat(
            [mean[:1], mean[:1] + math.sqrt(n) * chol.mT, mean[:1] - math.sqrt(n) * chol.mT]
        )
        torch.testing.assert_close(points[0], expected, rtol=0, atol=1e-12)
        spread = points[1, 1:] - mean[1]  # the singular one: its points still carry v v^T
        torch.testing.assert_close(spread.mT @ spread / (2 * n), v @ v.mT, rtol=0, atol=1e-6)

    def test_kappa(self):
        g, mean, weight, bias, target = self._problem(5)
        var = torch.rand(self.S, self.N, generator=g, dtype=DTYPE)
        moments = Moments(mean, var=var)
        default = unscented_cross_entropy(moments, target, weight, bias)
        torch.testing.assert_close(
            default, unscented_cross_entropy(moments, target, weight, bias, kappa=0.0)
        )
        paper = unscented_cross_entropy(moments, target, weight, bias, kappa=3 - self.N)
        assert not torch.isclose(default, paper)
        with pytest.raises(ValueError, match="kappa"):
            unscented_cross_entropy(moments, target, weight, bias, kappa=-self.N)

    @staticmethod
    def _julier_uhlmann_cross_entropy(mean, cov, target, weight, bias, kappa):
        """The unscented cross-entropy written out (Julier and Uhlmann): the ``2N + 1`` sigma
        points ``mu``, ``mu +- sqrt((N + kappa) Sigma)`` columns by Cholesky, weighted
        ``kappa / (N + kappa)`` (centre) and ``1 / (2 (N + kappa))`` (the others)."""
        n = mean.shape[1]
        root = torch.linalg.cholesky((n + kappa) * cov)  # [S, N, N], L L^T = (N + kappa) Sigma
        columns = root.mT  # [S, N (column), N (feature)]
        points = torch.cat(
            [mean.unsqueeze(1), mean.unsqueeze(1) + columns, mean.unsqueeze(1) - columns], 1
        )  # [S, 2N + 1, N]
        weights = torch.full((2 * n + 1,), 1 / (2 * (n + kappa)), dtype=mean.dtype)
        weights[0] = kappa / (n + kappa)
        logits = points @ weight + bias  # [S, 2N + 1, C]
        labels = target.view(-1, 1).expand(-1, 2 * n + 1)
        ce = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none"
        )
        return ce.view(-1, 2 * n + 1) @ weights  # [S]

    @pytest.mark.parametrize("kappa", [1.5, 3 - N])
    @pytest.mark.parametrize("diagonal", [True, False])
    def test_kappa_matches_explicit_sigma_points(self, kappa, diagonal):
        """At a non-zero kappa (positive, and the paper's negative ``3 - N``) the value is the
        hand-written transform's, for diagonal moments (the fused CPU kernel where it runs)
        and for a full covariance (the Cholesky path)."""
        g, mean, weight, bias, target = self._problem(7)
        if diagonal:
            var = 0.2 + torch.rand(self.S, self.N, generator=g, dtype=DTYPE)
            moments, cov = Moments(mean, var=var), torch.diag_embed(var)
        else:
            cov = _random_cov(g, self.S, self.N, 0.5)
            moments = Moments(mean, cov=cov)
        got = unscented_cross_entropy(moments, target, weight, bias, kappa=kappa, reduction="none")
        expected = self._julier_uhlmann_cross_entropy(mean, cov, target, weight, bias, kappa)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)

    def test_gradcheck(self):
        g, mean, weight, bias, target = self._problem(6)
        a = 0.5 * torch.randn(self.S, self.N, self.N, generator=g, dtype=DTYPE)
        var = torch.rand(self.S, self.N, generator=g, dtype=DTYPE) + 0.1
        for t in (mean, weight, bias, a, var):
            t.requires_grad_()
        eye = torch.eye(self.N, dtype=DTYPE)

        def full(m, w, b, a):
            moments = Moments(m, cov=a @ a.mT + 0.1 * eye)
            return unscented_cross_entropy(moments, target, w, b, reduction="none")

        def diag(m, w, b, v):
            return unscented_cross_entropy(Moments(m, var=v), target, w, b, kappa=1.0)

        assert torch.autograd.gradcheck(full, (mean, weight, bias, a))
        assert torch.autograd.gradcheck(diag, (mean, weight, bias, var))

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"target": torch.tensor([0, 5])}, "target"),
            ({"target": torch.tensor([0, -1])}, "target"),
            ({"target": torch.tensor([0.0, 1.0])}, "target"),
            ({"target": torch.tensor([0, 1, 2])}, "target"),
            ({"weight": torch.zeros(2, 5)}, "weight"),
            ({"weight": torch.full((3, 5), float("nan"))}, "weight"),
            ({"bias": torch.zeros(4)}, "bias"),
            (
                {"features": Moments(torch.zeros(2, 3), var=-torch.ones(2, 3), validate=False)},
                "features.var",
            ),
            ({"features": Moments(torch.full((2, 3), float("nan")), validate=False)}, "features"),
            ({"reduction": "batchmean"}, "reduction"),
        ],
    )
    def test_bad_input(self, kwargs, match):
        args = {**_unscented_args(), **kwargs}
        with pytest.raises(ValueError, match=match):
            unscented_cross_entropy(**args)


# ---------------------------------------------------------------------------------- penalty
class TestUnscentedLogits:
    """``unscented_logits`` must give the logits of the mapped ``unscented_points`` without
    forming them (the fast path the softmax head takes for wide last layers)."""

    @pytest.mark.parametrize("kind", ["var", "cov", "zero-var", "point"])
    @pytest.mark.parametrize("kappa", [None, 1.5, -2.0])
    @pytest.mark.parametrize("with_weight", [True, False])
    def test_equals_mapped_points(self, kind, kappa, with_weight):
        g = torch.Generator().manual_seed(7)
        s, n, c = 5, 6, 4
        mean = torch.randn(s, n, generator=g, dtype=DTYPE)
        var = torch.rand(s, n, generator=g, dtype=DTYPE) + 0.05
        moments = {
            "var": Moments(mean, var=var),
            "cov": Moments(mean, cov=_random_cov(g, s, n, 0.4)),
            "zero-var": Moments(mean, var=torch.zeros_like(mean)),
            "point": Moments(mean),
        }[kind]
        weight = torch.randn(n, c, generator=g, dtype=DTYPE) if with_weight else None
        bias = torch.randn(c if with_weight else n, generator=g, dtype=DTYPE)
        points, point_weights = unscented_points(moments, kappa)
        expected = (points if weight is None else points @ weight) + bias
        logits, weights = unscented_logits(moments, weight, bias, kappa)
        assert logits.shape == (s, 2 * n + 1, c if with_weight else n)
        torch.testing.assert_close(logits, expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(weights, point_weights)

    def test_wide_features_float32_gradients(self):
        # a flattened feature map (N = 784, C = 10): same values and gradients as the points
        g = torch.Generator().manual_seed(8)
        mean = torch.randn(3, 784, generator=g)
        var = torch.rand(3, 784, generator=g)
        weight = (0.05 * torch.randn(784, 10, generator=g)).requires_grad_()
        sd = var.clone().requires_grad_()
        logits, _ = unscented_logits(Moments(mean, var=sd), weight)
        points, _ = unscented_points(Moments(mean, var=sd))
        expected = points @ weight
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
        grads = torch.autograd.grad(logits.square().sum(), (weight, sd))
        ref = torch.autograd.grad(expected.square().sum(), (weight, sd))
        for got, want in zip(grads, ref):  # float32 sums over 1,569 points: rounding ~1e-4
            torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3 * want.abs().max().item())

    @pytest.mark.parametrize("name", ["reference", "auto"])
    def test_very_wide_features_stay_linear_in_n(self, name):
        # N = 20,000 features: the explicit points would need S N^2 = 1.6e9 floats (6.4 GB);
        # the logits path needs S (2N + 1) C
        from pyro_gpn.moments.backend import backend

        g = torch.Generator().manual_seed(10)
        mean, var = torch.randn(4, 20_000, generator=g), torch.rand(4, 20_000, generator=g)
        weight = (1e-2 * torch.randn(20_000, 3, generator=g)).requires_grad_()
        target = torch.tensor([0, 1, 2, 0])
        with backend(name):
            loss = unscented_cross_entropy(Moments(mean, var=var), target, weight)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(weight.grad).all()

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"weight": torch.zeros(2, 5)}, "weight"),
            ({"weight": torch.full((3, 5), float("nan"))}, "weight"),
            ({"bias": torch.zeros(4)}, "bias"),
            ({"kappa": -3.0}, "kappa"),
            ({"features": Moments(torch.full((2, 3), float("nan")), validate=False)}, "features"),
        ],
    )
    def test_bad_input(self, kwargs, match):
        args = {
            "features": Moments(torch.zeros(2, 3), var=torch.ones(2, 3)),
            "weight": torch.zeros(3, 5),
            "bias": torch.zeros(5),
        }
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            unscented_logits(**args)

    def test_gradcheck(self):
        g = torch.Generator().manual_seed(9)
        mean = torch.randn(2, 3, generator=g, dtype=DTYPE, requires_grad=True)
        var = (torch.rand(2, 3, generator=g, dtype=DTYPE) + 0.1).requires_grad_()
        weight = torch.randn(3, 4, generator=g, dtype=DTYPE, requires_grad=True)
        bias = torch.randn(4, generator=g, dtype=DTYPE, requires_grad=True)
        assert torch.autograd.gradcheck(
            lambda m, v, w, b: unscented_logits(Moments(m, var=v), w, b, 0.5)[0],
            (mean, var, weight, bias),
        )


class TestUnscentedLogPredictive:
    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"temperature": 0.0}, "temperature"),
            ({"temperature": -1.0}, "temperature"),
            ({"temperature": float("nan")}, "temperature"),
            ({"temperature": torch.ones(2)}, "temperature"),
            ({"temperature": torch.tensor([-2.0])}, "temperature"),
            ({"temperature": "1"}, "temperature"),
            ({"reduction": "avg"}, "reduction"),
            ({"target": torch.tensor([0, 5])}, "label|target"),
            ({"kappa": -3.0}, "kappa"),
            ({"weight": torch.zeros(2, 5)}, "weight"),
        ],
    )
    def test_bad_input(self, kwargs, match):
        args = {**_unscented_args(), **kwargs}
        with pytest.raises(ValueError, match=match):
            unscented_log_predictive(**args)

    def test_point_mass_is_the_log_softmax_at_the_temperature(self):
        g = torch.Generator().manual_seed(3)
        mean = torch.randn(4, 3, generator=g, dtype=DTYPE)
        weight = torch.randn(3, 5, generator=g, dtype=DTYPE)
        target = torch.tensor([0, 1, 2, 4])
        got = unscented_log_predictive(Moments(mean), target, weight, temperature=0.5)
        want = ((mean @ weight) / 0.5).log_softmax(-1)[torch.arange(4), target]
        torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
        total = unscented_log_predictive(Moments(mean), target, weight, reduction="sum")
        torch.testing.assert_close(
            total, unscented_log_predictive(Moments(mean), target, weight).sum()
        )

    def test_log_mean_softmax_signed_and_unsigned_weights(self):
        g = torch.Generator().manual_seed(4)
        logits = torch.randn(3, 5, 4, generator=g, dtype=DTYPE)
        labels = torch.tensor([0, 3, 1])
        probs = logits.softmax(-1)[torch.arange(3), :, labels]  # [S, P]
        for w in (torch.full((5,), 0.2, dtype=DTYPE), torch.tensor([-0.6, 0.4, 0.4, 0.4, 0.4])):
            want = (probs @ w.to(DTYPE)).log()
            for nonnegative in (None, bool((w >= 0).all())):
                got = log_mean_softmax(logits, w.to(DTYPE), labels, nonnegative)
                torch.testing.assert_close(got, want, rtol=1e-13, atol=0)


class TestTargetVariancePenalty:
    def test_value(self):
        s1 = torch.tensor([[0.01, 0.1], [1.0, 2.0]])
        s2 = torch.tensor([[1e-3, 1e-4, 1.0]])
        expected = 0.1 * torch.sigmoid(1e-3 / s1).mean() + 0.1 * torch.sigmoid(1e-3 / s2).mean()
        torch.testing.assert_close(target_variance_penalty([s1, s2]), expected)
        torch.testing.assert_close(
            target_variance_penalty(iter([s1]), alpha=2.0, beta=0.5),
            2.0 * torch.sigmoid(0.5 / s1).mean(),
        )
        assert float(target_variance_penalty([])) == 0.0

    def test_penalises_small_variances(self):
        small = target_variance_penalty([torch.full((3, 4), 1e-5)])
        large = target_variance_penalty([torch.full((3, 4), 1.0)])
        assert float(small) == pytest.approx(0.1, abs=1e-6)
        assert float(large) == pytest.approx(0.1 * torch.sigmoid(torch.tensor(1e-3)).item())
        assert float(large) < float(small)
        s = torch.full((2, 3), 1e-3, requires_grad=True)
        target_variance_penalty([s]).backward()
        assert torch.all(s.grad < 0)

    def test_shared_layer_equals_repeated_units(self):
        shared = torch.rand(1, 14) + 1e-3
        torch.testing.assert_close(
            target_variance_penalty([shared]), target_variance_penalty([shared.expand(5, 14)])
        )

    def test_bad_input(self):
        with pytest.raises(ValueError, match="alpha"):
            target_variance_penalty([torch.ones(2)], alpha=-1.0)
        with pytest.raises(ValueError, match="beta"):
            target_variance_penalty([torch.ones(2)], beta=0.0)
        with pytest.raises(ValueError, match=r"target_variances\[1\]"):
            target_variance_penalty([torch.ones(2), torch.tensor([float("nan")])])


def test_gaussian_predictive_log_likelihood_refuses_a_mean_over_no_rows():
    empty = Moments(
        torch.zeros(0, 2, dtype=torch.float64), var=torch.ones(0, 2, dtype=torch.float64)
    )
    target = torch.zeros(0, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="target has 0 samples"):
        gaussian_predictive_log_likelihood(empty, target)
    assert gaussian_predictive_log_likelihood(empty, target, reduction="sum") == 0
    assert gaussian_predictive_log_likelihood(empty, target, reduction="none").shape == (0,)
