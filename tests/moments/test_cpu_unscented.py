"""The fused CPU unscented cross-entropy (``pyro_gpn.moments.cpu_unscented``) against the
PyTorch path of ``pyro_gpn.losses.unscented_cross_entropy`` (``backend("reference")``, which maps
the explicit sigma points), values and gradients, in float64 and float32 and in the hard regimes
(wide spreads of the logits, tiny and huge variances, the paper's negative centre weight); the
same for its predictive twin ``unscented_log_predictive`` (the log of the averaged softmax),
with Jensen's inequality between the two and Monte Carlo."""

from __future__ import annotations

import math

import pytest
import torch

from pyro_gpn.losses import unscented_cross_entropy, unscented_log_predictive, unscented_logits
from pyro_gpn.moments import Moments
from pyro_gpn.moments.backend import backend, numba_available

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba is not installed")

F64 = torch.float64


def problem(S, N, C, seed, dtype=F64, mean_scale=1.0, var_scale=1.0, weight_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    mean = mean_scale * torch.randn(S, N, generator=g, dtype=F64)
    var = var_scale * torch.rand(S, N, generator=g, dtype=F64)
    weight = weight_scale * torch.randn(N, C, generator=g, dtype=F64)
    bias = torch.randn(C, generator=g, dtype=F64)
    target = torch.randint(0, C, (S,), generator=g)
    leaves = [t.to(dtype).requires_grad_() for t in (mean, var, weight, bias)]
    return leaves, target


def loss_and_grads(name, leaves, target, kappa=None, reduction="none", fn=unscented_cross_entropy):
    mean, var, weight, bias = leaves
    with backend(name):
        loss = fn(Moments(mean, var=var), target, weight, bias, kappa=kappa, reduction=reduction)
    g = torch.Generator().manual_seed(5)
    probe = torch.randn(loss.shape, generator=g, dtype=F64).to(loss.dtype)
    grads = torch.autograd.grad((loss * probe).sum(), leaves)
    return loss.detach(), grads


def assert_same(leaves, target, rtol, kappa=None, fn=unscented_cross_entropy):
    got, got_grads = loss_and_grads("cpu", leaves, target, kappa, fn=fn)
    want, want_grads = loss_and_grads("reference", leaves, target, kappa, fn=fn)
    # values near 0 (log probabilities of near-certain labels) carry ~eps absolute rounding
    scale = max(want.abs().max().item(), 1.0)
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * scale)
    for name, a, b in zip(("mean", "var", "weight", "bias"), got_grads, want_grads):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(
            a, b, rtol=rtol, atol=rtol * b.abs().max().item(), msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.parametrize("S,N,C", [(1, 1, 2), (7, 3, 5), (64, 15, 26), (5, 40, 3)])
@pytest.mark.parametrize("kappa", [None, 1.0])
def test_matches_reference_float64(S, N, C, kappa):
    leaves, target = problem(S, N, C, seed=S + N + C)
    assert_same(leaves, target, 1e-12, kappa)


def test_paper_kappa_negative_centre_weight():
    # kappa = 3 - N (the paper): the centre weight is negative; the kernel must weight it alike
    leaves, target = problem(9, 6, 4, seed=3)
    assert_same(leaves, target, 1e-12, kappa=3 - 6)


@pytest.mark.parametrize(
    "regime, rtol",
    [
        ({"mean_scale": 30.0}, 1e-10),  # logits spread over hundreds of nats
        ({"var_scale": 400.0, "weight_scale": 3.0}, 1e-10),  # sigma points far apart
        # nearly deterministic features: d/d var = d/d sd / (2 sd) amplifies the rounding of the
        # near-cancelling + and - points' terms by 1 / sd ~ 1e6 in both implementations
        ({"var_scale": 1e-12}, 1e-6),
    ],
)
def test_hard_regimes_match_reference(regime, rtol):
    leaves, target = problem(11, 7, 6, seed=4, **regime)
    assert_same(leaves, target, rtol)


def assert_float32_matches_float64_reference(leaves, target, fn=unscented_cross_entropy):
    """The fused kernel on float32 leaves against the PyTorch path on their float64 copies;
    returns the reference values."""
    got, got_grads = loss_and_grads("cpu", leaves, target, fn=fn)
    assert got.dtype == torch.float32 and all(g.dtype == torch.float32 for g in got_grads)
    ref_leaves = [t.detach().to(F64).requires_grad_() for t in leaves]
    want, want_grads = loss_and_grads("reference", ref_leaves, target, fn=fn)
    torch.testing.assert_close(got.to(F64), want, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a.to(F64), b, rtol=1e-4, atol=1e-4 * b.abs().max().item())
    return want


def test_float32_matches_float64_reference():
    leaves, target = problem(32, 15, 26, seed=6, dtype=torch.float32)
    assert_float32_matches_float64_reference(leaves, target)


def test_reductions_and_monte_carlo():
    # the value is the unscented approximation of E[CE]: close to Monte Carlo for small variances
    # (0.05 here: its own error about 2 standard errors of 200,000 draws, the variance's effect
    # on E[CE] 30-100, so that an error of half the effect fails)
    leaves, target = problem(6, 5, 4, seed=8, var_scale=0.05)
    mean, var, weight, bias = (t.detach() for t in leaves)
    features = Moments(mean, var=var)
    with backend("cpu"):
        per = unscented_cross_entropy(features, target, weight, bias, reduction="none")
        total = unscented_cross_entropy(features, target, weight, bias, reduction="sum")
        halved = Moments(mean, var=var / 2)
        half = unscented_cross_entropy(halved, target, weight, bias, reduction="none")
    torch.testing.assert_close(total, per.sum())
    g = torch.Generator().manual_seed(9)
    x = mean + var.sqrt() * torch.randn(200_000, *mean.shape, generator=g, dtype=F64)
    mc = torch.nn.functional.cross_entropy(
        (x @ weight + bias).reshape(-1, 4), target.repeat(200_000), reduction="none"
    ).reshape(200_000, -1)
    se = mc.std(0) / math.sqrt(200_000)
    assert ((per - mc.mean(0)).abs() < 5 * se).all()
    # the comparison resolves the variance: half of it is rejected
    assert ((half - mc.mean(0)).abs() > 5 * se).sum() >= 4


def test_gradcheck():
    leaves, target = problem(3, 4, 5, seed=10)
    mean, var, weight, bias = leaves
    var = (var.detach() + 0.1).requires_grad_()

    def f(m, v, w, b):
        with backend("cpu"):
            return unscented_cross_entropy(Moments(m, var=v), target, w, b, reduction="none")

    assert torch.autograd.gradcheck(f, (mean, var, weight, bias))


def test_default_backend_takes_the_kernel(monkeypatch):
    # "auto" on float CPU tensors runs the kernel; "reference" never does
    from pyro_gpn.moments import cpu_unscented

    calls = []
    original = cpu_unscented.cpu_unscented_cross_entropy
    monkeypatch.setattr(
        cpu_unscented,
        "cpu_unscented_cross_entropy",
        lambda *a, **k: calls.append(1) or original(*a, **k),
    )
    leaves, target = problem(4, 3, 5, seed=11)
    loss_and_grads("auto", leaves, target)
    assert calls == [1]
    loss_and_grads("reference", leaves, target)
    assert calls == [1]


# ---------------------------------------------- the predictive (log of the averaged softmax)
def predictive_at(temperature):
    def fn(features, target, weight, bias, kappa=None, reduction="none"):
        return unscented_log_predictive(
            features,
            target,
            weight,
            bias,
            kappa=kappa,
            temperature=temperature,
            reduction=reduction,
        )

    return fn


@pytest.mark.parametrize("S,N,C", [(1, 1, 2), (7, 3, 5), (64, 15, 26), (5, 40, 3)])
@pytest.mark.parametrize("kappa", [None, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_predictive_matches_reference_float64(S, N, C, kappa, temperature):
    leaves, target = problem(S, N, C, seed=S + N + C)
    assert_same(leaves, target, 1e-12, kappa, fn=predictive_at(temperature))


@pytest.mark.parametrize(
    "regime, rtol",
    [
        ({"mean_scale": 30.0}, 1e-10),  # log probabilities of hundreds of nats
        ({"var_scale": 400.0, "weight_scale": 3.0}, 1e-10),  # one point dominates the average
        ({"var_scale": 1e-12}, 1e-6),  # as for the cross-entropy (1 / sd amplification)
    ],
)
def test_predictive_hard_regimes_match_reference(regime, rtol):
    leaves, target = problem(11, 7, 6, seed=4, **regime)
    assert_same(leaves, target, rtol, fn=predictive_at(1.0))
    got, _ = loss_and_grads("cpu", leaves, target, fn=predictive_at(1.0))
    assert torch.isfinite(got).all()


def test_predictive_float32_matches_float64_reference():
    leaves, target = problem(32, 15, 26, seed=6, dtype=torch.float32, mean_scale=10.0)
    want = assert_float32_matches_float64_reference(leaves, target, fn=predictive_at(1.0))
    assert float(want.min()) < -50  # probabilities far below float32's smallest number


def test_predictive_is_jensen_above_the_expected_and_near_monte_carlo():
    leaves, target = problem(6, 5, 4, seed=8, var_scale=0.01)
    mean, var, weight, bias = (t.detach() for t in leaves)
    features = Moments(mean, var=var)
    with backend("cpu"):
        log_pred = unscented_log_predictive(features, target, weight, bias)
        expected = unscented_cross_entropy(features, target, weight, bias, reduction="none")
        total = unscented_log_predictive(features, target, weight, bias, reduction="sum")
    torch.testing.assert_close(total, log_pred.sum())
    assert (log_pred >= -expected - 1e-14).all() and ((log_pred + expected) > 1e-8).all()
    g = torch.Generator().manual_seed(9)
    x = mean + var.sqrt() * torch.randn(200_000, *mean.shape, generator=g, dtype=F64)
    p = (x @ weight + bias).softmax(-1).gather(-1, target.view(1, -1, 1).expand(200_000, -1, 1))
    p = p.squeeze(-1)
    se = p.std(0) / math.sqrt(200_000) / p.mean(0)  # of the log, by the delta method
    assert ((log_pred - p.mean(0).log()).abs() < 5 * se + 2e-3).all()


def test_predictive_gradcheck():
    leaves, target = problem(3, 4, 5, seed=10)
    mean, var, weight, bias = leaves
    var = (var.detach() + 0.1).requires_grad_()
    temperature = torch.tensor([0.7], dtype=F64, requires_grad=True)

    def f(m, v, w, b, t):
        with backend("cpu"):
            return unscented_log_predictive(Moments(m, var=v), target, w, b, temperature=t)

    assert torch.autograd.gradcheck(f, (mean, var, weight, bias, temperature))


def test_predictive_kernel_only_for_non_negative_weights(monkeypatch):
    from pyro_gpn.moments import cpu_unscented

    calls = []
    original = cpu_unscented.cpu_unscented_cross_entropy
    monkeypatch.setattr(
        cpu_unscented,
        "cpu_unscented_cross_entropy",
        lambda *a, **k: calls.append(k) or original(*a, **k),
    )
    leaves, target = problem(4, 3, 5, seed=11)
    loss_and_grads("auto", leaves, target, fn=predictive_at(1.0))
    assert calls == [{"predictive": True}]
    got, _ = loss_and_grads("auto", leaves, target, kappa=-2.0, fn=predictive_at(1.0))
    assert len(calls) == 1  # kappa < 0: the reference path's sum of probabilities
    want, _ = loss_and_grads("reference", leaves, target, kappa=-2.0, fn=predictive_at(1.0))
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)


def test_predictive_kernel_skips_a_zero_centre_weight():
    """kappa = 0: the centre point has weight 0 and may be the only point that the label's
    log probability would underflow at -- its term must be skipped, not taken as log(0)
    (one feature, logits (1000, 0, -1000) x, label 1: at x = +-1 the label is 1000 nats
    below the top class)."""
    mean = torch.zeros(1, 1, dtype=F64)
    var = torch.ones(1, 1, dtype=F64)
    weight = torch.tensor([[1000.0, 0.0, -1000.0]], dtype=F64)
    for name in ("cpu", "reference"):
        with backend(name):
            got = unscented_log_predictive(Moments(mean, var=var), torch.tensor([1]), weight)
        torch.testing.assert_close(got, torch.tensor([-1000.0], dtype=F64), rtol=1e-12, atol=0)


def test_predictive_reference_path_log_space_with_full_covariance():
    """The PyTorch path (CUDA, full covariances) is a log-sum-exp too: labels ruled out by
    hundreds of nats keep their log probability in float32."""
    g = torch.Generator().manual_seed(12)
    a = torch.randn(4, 3, 3, generator=g, dtype=F64)
    cov = a @ a.mT * 0.01
    mean = torch.randn(4, 3, generator=g, dtype=F64)
    weight = 80.0 * torch.randn(3, 5, generator=g, dtype=F64)
    labels = torch.tensor([0, 1, 2, 3])
    ref = unscented_log_predictive(Moments(mean, cov=cov), labels, weight)
    assert float(ref.min()) < -100
    probs = unscented_logits(Moments(mean, cov=cov), weight)[0].softmax(-1)  # [S, P, C]
    label_probs = probs.gather(-1, labels.view(-1, 1, 1).expand(-1, probs.shape[1], 1))
    direct = label_probs.squeeze(-1)[:, 1:].mean(-1).log()  # kappa 0: the centre weighs 0
    finite = direct > -700  # where the float64 sum of probabilities still holds
    assert bool(finite.any())
    torch.testing.assert_close(ref[finite], direct[finite], rtol=1e-10, atol=0)
    with backend("reference"):
        got = unscented_log_predictive(
            Moments(mean.float(), cov=cov.float()), labels, weight.float()
        )
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=0)


def test_kernel_refuses_negative_weights_for_the_predictive():
    from pyro_gpn.moments.cpu_unscented import cpu_unscented_cross_entropy

    leaves, target = problem(3, 2, 4, seed=13)
    mean, var, weight, bias = (t.detach() for t in leaves)
    with pytest.raises(ValueError, match="non-negative point weights"):
        cpu_unscented_cross_entropy(mean @ weight, var.sqrt(), weight, target, 1.0, -0.5, 0.4, True)
