"""One-layer moment propagation: closed form vs materialised reference vs Monte Carlo."""

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

import pyro_gpn.moments.cross as cross
import pyro_gpn.moments.propagate as propagate
from pyro_gpn.moments import (
    Moments,
    expected_cross_kernel_product,
    expected_kernel,
    expected_kernel_product,
    midpoint_expansion,
    response_moments,
    virtual_observation_weights,
)
from pyro_gpn.moments.backend import backend, numba_available
from tests.mc import assert_mc_covariance, assert_mc_mean, assert_mc_variance, random_covariance

DT = torch.float64


def _params(seed=0, N=4, R=6, shared=False, equidistant=True):
    g = torch.Generator().manual_seed(seed)
    groups = 1 if shared else N
    if equidistant:
        points = torch.linspace(-2, 2, R, dtype=DT).expand(groups, R).clone()
    else:
        points = torch.sort(torch.rand(groups, R, dtype=DT, generator=g) * 4 - 2, dim=-1).values
    ls = torch.rand(groups, dtype=DT, generator=g) * 0.5 + 0.4
    targets = torch.randn(groups, R, dtype=DT, generator=g)
    variances = torch.rand(groups, R, dtype=DT, generator=g) * 0.3 + 0.05
    noise_var = torch.rand(groups, dtype=DT, generator=g) * 0.05
    kappa, beta = virtual_observation_weights(points, targets, variances, ls)
    return points, ls, beta, kappa, noise_var, targets, variances


def _inputs(seed=0, S=3, N=4):
    g = torch.Generator().manual_seed(seed + 100)
    return torch.randn(S, N, dtype=DT, generator=g), random_covariance(S, N, generator=g)


def test_virtual_observation_weights_solve_the_gp_system():
    points, ls, beta, kappa, _, targets, variances = _params()
    diff = points.unsqueeze(-1) - points.unsqueeze(-2)
    gram = (-0.5 * diff.square() / ls[:, None, None] ** 2).exp() + torch.diag_embed(variances)
    torch.testing.assert_close(kappa, torch.linalg.inv(gram))
    torch.testing.assert_close(beta, torch.linalg.solve(gram, targets))


def test_virtual_observation_weights_cholesky_factor_reproduces_the_gram_matrix():
    points, ls, beta, kappa, _, targets, variances = _params()
    k2, b2, chol = virtual_observation_weights(points, targets, variances, ls, with_cholesky=True)
    diff = points.unsqueeze(-1) - points.unsqueeze(-2)
    gram = (-0.5 * diff.square() / ls[:, None, None] ** 2).exp() + torch.diag_embed(variances)
    torch.testing.assert_close(chol @ chol.mT, gram)
    assert torch.equal(chol, chol.tril())
    torch.testing.assert_close(b2, beta)
    torch.testing.assert_close(k2, kappa)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("equidistant", [True, False])
def test_closed_form_matches_materialised_reference(shared, equidistant):
    points, ls, beta, kappa, noise_var, *_ = _params(shared=shared, equidistant=equidistant)
    mean, cov = _inputs()
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    out = response_moments(Moments(mean, var=var), points, ls, beta, kappa, noise_var, "meanvar")
    n = mean.shape[1]
    psi = expected_kernel(mean, var, points, ls)
    ref_mean = (psi * beta.expand(n, -1)).sum(-1)
    omega = expected_kernel_product(mean, var, points, ls)
    matrix = kappa - beta.unsqueeze(-1) * beta.unsqueeze(-2)
    ref_var = 1 - (matrix * omega).sum((-1, -2)) - ref_mean.square() + noise_var
    torch.testing.assert_close(out.mean, ref_mean)
    torch.testing.assert_close(out.var, ref_var)


def test_equidistant_and_general_midpoint_expansions_agree():
    points, ls, beta, kappa, *_ = _params(R=7)
    matrix = kappa - beta.unsqueeze(-1) * beta.unsqueeze(-2)
    c_eq, w_eq = midpoint_expansion(points, matrix, ls, equidistant=True)
    c_gen, w_gen = midpoint_expansion(points, matrix, ls, equidistant=False)
    assert c_eq.shape[-1] == 2 * 7 - 1 and c_gen.shape[-1] == 7 * 8 // 2
    mean, cov = _inputs()
    width = ls.square() + 2 * torch.diagonal(cov, dim1=-2, dim2=-1)
    torch.testing.assert_close(
        propagate.gaussian_sum(mean, width, c_eq, w_eq),
        propagate.gaussian_sum(mean, width, c_gen, w_gen),
    )


@pytest.mark.parametrize("shared", [False, True])
def test_one_layer_matches_monte_carlo_in_every_mode(shared):
    """Gaussian activations through the exact conditional: the closed form is exact."""
    points, ls, beta, kappa, noise_var, *_ = _params(shared=shared, N=3, R=5)
    mean, cov = _inputs(S=2, N=3)
    n = mean.shape[1]
    g = torch.Generator().manual_seed(7)
    num = 60000
    chol = torch.linalg.cholesky(cov)
    a = mean + (chol @ torch.randn(num, *mean.shape, 1, dtype=DT, generator=g)).squeeze(-1)
    alpha = (-0.5 * ((a.unsqueeze(-1) - points.expand(n, -1)) / ls.expand(n)[:, None]) ** 2).exp()
    cond_mean = (alpha * beta.expand(n, -1)).sum(-1)
    cond_var = 1 - torch.einsum("ksnr,nrt,ksnt->ksn", alpha, kappa.expand(n, -1, -1), alpha)
    x = cond_mean + (cond_var + noise_var).sqrt() * torch.randn(
        cond_mean.shape, dtype=DT, generator=g
    )

    acts = Moments(mean, cov=cov)
    out_cov = response_moments(acts, points, ls, beta, kappa, noise_var, "cov")
    out_var = response_moments(acts.diagonal(), points, ls, beta, kappa, noise_var, "meanvar")
    out_mean = response_moments(acts.diagonal(), points, ls, beta, kappa, noise_var, "mean")
    assert out_mean.is_deterministic
    assert_mc_mean(x, out_cov.mean)
    assert_mc_variance(x, out_var.var)
    assert_mc_covariance(x, out_cov.cov)
    # the modes are consistent with each other
    torch.testing.assert_close(out_mean.mean, out_var.mean)
    torch.testing.assert_close(out_cov.mean, out_var.mean)
    torch.testing.assert_close(torch.diagonal(out_cov.cov, dim1=-2, dim2=-1), out_var.var)


def test_cov_mode_with_diagonal_input_is_diagonal():
    points, ls, beta, kappa, noise_var, *_ = _params()
    mean, cov = _inputs()
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    out = response_moments(Moments(mean, var=var), points, ls, beta, kappa, noise_var, "cov")
    off = ~torch.eye(mean.shape[1], dtype=torch.bool)
    assert bool((out.cov[:, off] == 0).all())


def test_deterministic_activations_are_exact():
    points, ls, beta, kappa, noise_var, *_ = _params()
    mean, _ = _inputs()
    out = response_moments(Moments(mean), points, ls, beta, kappa, noise_var, "meanvar")
    alpha = (-0.5 * ((mean.unsqueeze(-1) - points) / ls[:, None]) ** 2).exp()
    torch.testing.assert_close(out.mean, (alpha * beta).sum(-1))
    expected_var = 1 - torch.einsum("snr,nrt,snt->sn", alpha, kappa, alpha) + noise_var
    torch.testing.assert_close(out.var, expected_var)
    full = response_moments(
        Moments(mean, cov=torch.zeros(3, 4, 4, dtype=DT)), points, ls, beta, kappa, noise_var, "cov"
    )
    torch.testing.assert_close(full.cov, torch.diag_embed(expected_var))


def test_chunked_covariance_equals_unchunked_with_gradients(monkeypatch):
    """The ``Lambda`` path, chunked over samples (every pair sent there: no Mehler term)."""
    monkeypatch.setattr(cross, "MEHLER_MAX_TERMS", 0)
    points, ls, beta, kappa, noise_var, *_ = _params()
    mean, cov = _inputs(S=5)

    def run():
        m = mean.clone().requires_grad_()
        c = cov.clone().requires_grad_()
        b = beta.clone().requires_grad_()
        out = response_moments(Moments(m, cov=c), points, ls, b, kappa, noise_var, "cov")
        loss = (out.cov * torch.arange(16, dtype=DT).reshape(4, 4)).sum() + out.mean.sum()
        loss.backward()
        return out.cov.detach(), m.grad, c.grad, b.grad

    whole = run()
    pairs = 4 * 3 // 2
    monkeypatch.setattr(cross, "COV_CHUNK_ELEMENTS", pairs * 6 * 6 * 2)  # a dozen entries or less
    chunked = run()
    for w, c in zip(whole, chunked):
        torch.testing.assert_close(w, c)


@pytest.mark.parametrize("mode", ["mean", "meanvar", "cov"])
def test_gradcheck_response_moments(mode):
    points, ls, beta, kappa, noise_var, targets, variances = _params(N=3, R=4, equidistant=False)
    mean, cov = _inputs(S=2, N=3)

    def fn(m, c, p, l, u, s, nv):
        c = 0.5 * (c + c.mT)
        kap, bet = virtual_observation_weights(p, u, s, l)
        acts = (
            Moments(m, cov=c)
            if mode == "cov"
            else Moments(m, var=torch.diagonal(c, dim1=-2, dim2=-1))
        )
        out = response_moments(acts, p, l, bet, kap, nv, mode)
        return (
            (out.mean,) if mode == "mean" else (out.mean, out.var if mode == "meanvar" else out.cov)
        )

    args = [
        t.clone().requires_grad_() for t in (mean, cov, points, ls, targets, variances, noise_var)
    ]
    assert gradcheck(fn, args)


def test_gradcheck_equidistant_fast_path():
    points, ls, beta, kappa, noise_var, targets, variances = _params(N=3, R=5)
    mean, cov = _inputs(S=2, N=3)
    var = torch.diagonal(cov, dim1=-2, dim2=-1).clone()

    def fn(m, v, l, u, s):
        kap, bet = virtual_observation_weights(points, u, s, l)
        out = response_moments(
            Moments(m, var=v), points, l, bet, kap, noise_var, "meanvar", equidistant=True
        )
        return out.mean, out.var

    assert gradcheck(fn, [t.clone().requires_grad_() for t in (mean, var, ls, targets, variances)])


def test_bad_mode_raises():
    points, ls, beta, kappa, noise_var, *_ = _params()
    mean, _ = _inputs()
    with pytest.raises(ValueError, match="mode"):
        response_moments(Moments(mean), points, ls, beta, kappa, noise_var, "full")


@pytest.mark.parametrize("shared", [False, True])
def test_covariance_matches_materialised_lambda(shared):
    points, ls, beta, kappa, noise_var, *_ = _params(shared=shared, equidistant=False)
    mean, cov = _inputs()
    out = response_moments(Moments(mean, cov=cov), points, ls, beta, kappa, noise_var, "cov")
    n = mean.shape[1]
    lam = expected_cross_kernel_product(mean, cov, points, ls)
    b = beta.expand(n, -1)
    expected = torch.einsum("snmrt,nr,mt->snm", lam, b, b)
    expected = expected - out.mean.unsqueeze(-1) * out.mean.unsqueeze(-2)
    off = ~torch.eye(n, dtype=torch.bool)
    torch.testing.assert_close(out.cov[:, off], expected[:, off])


# ---------------------------------------------------------------------------------- bad arguments
_BACKENDS = ["reference", "auto"] + (["cpu"] if numba_available() else [])


def _three_units(seed=0):
    points, ls, beta, kappa, noise_var, *_ = _params(seed, N=3, R=5)
    mean, cov = _inputs(seed, S=4, N=3)
    acts = Moments(mean, var=torch.diagonal(cov, dim1=-2, dim2=-1).clone())
    return acts, points, ls, beta, kappa, noise_var


@pytest.mark.parametrize("name", _BACKENDS)
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        # beta wider than the inducing points: the fused kernels read past its end (garbage
        # such as 3.3e87, different on every call)
        ({"beta": torch.randn(3, 7, dtype=DT)}, r"beta must have shape \(3 \| 1, 5\)"),
        ({"beta": torch.randn(3, 4, dtype=DT)}, r"beta must have shape \(3 \| 1, 5\)"),
        ({"variance_reduction": torch.eye(4, dtype=DT).expand(3, 4, 4)}, "variance_reduction"),
        ({"variance_reduction": torch.eye(5, dtype=DT).expand(2, 5, 5)}, "variance_reduction"),
        ({"lengthscales": torch.ones(5, dtype=DT)}, "lengthscales must have shape"),
        ({"noise_var": torch.ones(5, dtype=DT)}, "noise_var must have shape"),
        ({"inducing_points": torch.linspace(-2, 2, 5, dtype=DT)}, "inducing_points"),
        ({"beta": torch.randn(3, 5)}, "beta has dtype torch.float32 but activations.mean"),
        ({"lengthscales": torch.zeros(3, dtype=DT)}, "lengthscales must be positive"),
        ({"noise_var": -torch.ones(3, dtype=DT)}, "noise_var must be non-negative"),
    ],
)
def test_response_moments_refuses_bad_parameters_naming_them(name, bad, message):
    acts, points, ls, beta, kappa, noise_var = _three_units()
    args = {
        "inducing_points": points,
        "lengthscales": ls,
        "beta": beta,
        "variance_reduction": kappa,
        "noise_var": noise_var,
    }
    with backend(name), pytest.raises(ValueError, match=message):
        response_moments(acts, **{**args, **bad})


@pytest.mark.parametrize("name", _BACKENDS)
@pytest.mark.parametrize("units", [2, 4])
@pytest.mark.parametrize("mode", ["mean", "meanvar", "cov"])
def test_response_moments_refuses_activations_of_another_width(name, units, mode):
    """4 activation units against 3-unit parameters gave NaN or 0 on the fused backend, 2 units
    a silent [S, 2] result."""
    _, points, ls, beta, kappa, noise_var = _three_units()
    g = torch.Generator().manual_seed(5)
    mean = torch.randn(4, units, dtype=DT, generator=g)
    acts = Moments(mean, var=torch.rand(4, units, dtype=DT, generator=g))
    with backend(name), pytest.raises(ValueError, match=f"the {units} units of activations"):
        response_moments(acts, points, ls, beta, kappa, noise_var, mode)


def test_response_moments_checks_shapes_always_and_values_under_validation():
    from pyro_gpn import settings

    acts, points, ls, beta, kappa, noise_var = _three_units()
    with pytest.raises(TypeError, match="activations must be Moments"):
        response_moments(acts.mean, points, ls, beta, kappa)
    with settings.validation(False):
        with pytest.raises(ValueError, match="beta must have shape"):
            response_moments(acts, points, ls, beta[:, :4], kappa)
        response_moments(acts, points, ls, beta, kappa, -noise_var)  # no value read
    # one shared activation function serves any number of units
    shared = response_moments(acts, points[:1], ls[:1], beta[:1], kappa[:1], noise_var[:1])
    alone = response_moments(
        Moments(acts.mean[:, :1], var=acts.var[:, :1]), points[:1], ls[:1], beta[:1], kappa[:1]
    )
    torch.testing.assert_close(shared.mean[:, :1], alone.mean)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"inducing_points": torch.linspace(-2, 2, 5, dtype=DT)}, "inducing_points must have"),
        ({"targets": torch.randn(3, 4, dtype=DT)}, r"targets must have shape \(3 \| 1, 5\)"),
        ({"target_variances": torch.ones(2, 5, dtype=DT)}, "rows disagree.*target_variances 2"),
        ({"lengthscales": torch.ones(5, dtype=DT)}, "rows disagree.*lengthscales 5"),
        ({"lengthscales": torch.ones(3, 1, dtype=DT)}, "lengthscales must have 1 dim"),
        ({"targets": torch.randn(3, 5)}, "targets has dtype torch.float32 but inducing_points"),
        ({"jitter": -1.0}, "jitter must be non-negative"),
        ({"jitter": float("nan")}, "jitter must be non-negative"),
        ({"jitter": torch.tensor(-1.0, dtype=DT)}, "jitter must be non-negative"),
        ({"jitter": torch.full((3, 1), 1e-6, dtype=DT)}, "jitter must be a number or a one-elem"),
        ({"target_variances": -torch.ones(3, 5, dtype=DT)}, "target_variances must be non-neg"),
        ({"lengthscales": torch.zeros(3, dtype=DT)}, "lengthscales must be positive"),
        ({"targets": torch.full((3, 5), float("nan"), dtype=DT)}, "targets contains NaN"),
    ],
)
@pytest.mark.parametrize("with_cholesky", [False, True])
def test_virtual_observation_weights_refuse_bad_arguments_naming_them(bad, message, with_cholesky):
    points, ls, _, _, _, targets, variances = _params(N=3, R=5)
    args = {
        "inducing_points": points,
        "targets": targets,
        "target_variances": variances,
        "lengthscales": ls,
    }
    with pytest.raises(ValueError, match=message):
        virtual_observation_weights(**{**args, **bad}, with_cholesky=with_cholesky)


def test_virtual_observation_weights_take_numpy_and_tensor_jitter_without_a_sync():
    """A np.float32 jitter was refused (TypeError); a tensor jitter was read back with .item()
    on every call, validation or not."""
    from pyro_gpn import settings
    from pyro_gpn.moments.weights import _check_weight_arguments
    from tests.syncs import count_syncs

    points, ls, _, _, _, targets, variances = _params(N=3, R=5)
    expected = virtual_observation_weights(points, targets, variances, ls, jitter=1e-6)
    for jitter in (np.float32(1e-6), np.float64(1e-6), torch.tensor(1e-6, dtype=DT)):
        got = virtual_observation_weights(points, targets, variances, ls, jitter=jitter)
        torch.testing.assert_close(got[1], expected[1])
    with settings.validation(False), count_syncs() as counter:
        _check_weight_arguments(points, targets, variances, ls, torch.tensor(-1.0, dtype=DT))
    assert counter["n"] == 0
    with pytest.raises(TypeError, match="jitter must be a real number"):
        virtual_observation_weights(points, targets, variances, ls, jitter=np.bool_(True))


# ------------------------------------------------------------- mutations no test caught before
@pytest.mark.parametrize("name", ["reference", "auto"])
@pytest.mark.parametrize("with_cholesky", [False, True])
def test_virtual_observation_weights_add_the_jitter_to_the_diagonal(name, with_cholesky):
    """``kappa = (K + diag(S) + jitter I)^-1`` and ``beta = kappa U`` against the Gram matrix
    built by hand in NumPy, with a jitter large enough to matter (every other test uses 0),
    on the reference path (also the ``with_cholesky`` one) and the CPU kernels."""
    points, ls, _, _, _, targets, variances = _params()
    jitter = 0.25
    with backend(name):
        kappa, beta, *chol = virtual_observation_weights(
            points, targets, variances, ls, jitter=jitter, with_cholesky=with_cholesky
        )
    p, lam = points.numpy(), ls.numpy()
    gram = np.exp(-((p[:, :, None] - p[:, None, :]) ** 2) / (2 * lam[:, None, None] ** 2))
    gram = gram + np.stack([np.diag(s) for s in variances.numpy() + jitter])
    torch.testing.assert_close(kappa, torch.from_numpy(np.linalg.inv(gram)))
    want_beta = np.linalg.solve(gram, targets.numpy()[..., None])[..., 0]
    torch.testing.assert_close(beta, torch.from_numpy(want_beta))
    if with_cholesky:
        torch.testing.assert_close(chol[0] @ chol[0].mT, torch.from_numpy(gram))


@pytest.mark.parametrize("mode", ["meanvar", "cov"])
@pytest.mark.parametrize("equidistant", [True, False])
def test_negative_conditional_variances_are_clamped_to_the_noise(mode, equidistant):
    """With ``C = 5 I`` the conditional variance ``1 - alpha^T C alpha`` is negative around the
    inducing points, and so is its expectation (checked by quadrature below) for a point
    activation (narrow regime) and a broad one (closed form): the noise-free output variance
    is clamped at 0, so the output variance is exactly the noise."""
    points = torch.tensor([[-0.5, 0.0, 0.5]], dtype=DT)
    if not equidistant:
        points = torch.tensor([[-0.5, 0.1, 0.5]], dtype=DT)
    ls = torch.tensor([0.5], dtype=DT)
    beta = torch.zeros(1, 3, dtype=DT)
    reduction = 5 * torch.eye(3, dtype=DT).unsqueeze(0)
    noise_var = torch.tensor([0.01], dtype=DT)
    mean = torch.tensor([[0.0], [0.2]], dtype=DT)
    var = torch.tensor([[0.0], [2.0]], dtype=DT)  # narrow (v = 0) and broad (v > (1.25 ls)^2)
    # E[1 - alpha^T C alpha] by the trapezoid rule: negative in both rows
    z = np.linspace(-12, 12, 4001)
    w = np.exp(-0.5 * z**2) / np.sqrt(2 * np.pi) * (z[1] - z[0])
    for mu, v in zip(mean[:, 0].tolist(), var[:, 0].tolist()):
        alpha = np.exp(-((mu + np.sqrt(v) * z[:, None] - points.numpy()[0]) ** 2) / 0.5)
        assert w @ (1 - 5 * (alpha**2).sum(-1)) < -0.1
    with backend("reference"):
        out = response_moments(
            Moments(mean, var=var), points, ls, beta, reduction, noise_var, mode, equidistant
        )
    torch.testing.assert_close(out.variance, noise_var.expand(2, 1), rtol=0, atol=1e-15)


@pytest.mark.parametrize("equidistant", [True, False])
@pytest.mark.parametrize("uncertain", [False, True])
def test_mean_mode_returns_means_only_on_the_reference_path(equidistant, uncertain):
    """``"mean"`` mode (the paper's "GPN mean") returns a point mass: no ``var``, no ``cov``,
    whatever the activations carry, on the reference path as on the fused one; the means are
    ``E[alpha(a)]^T beta`` by quadrature."""
    points, ls, beta, kappa, noise_var, *_ = _params(equidistant=equidistant)
    mean, cov = _inputs()
    acts = Moments(mean, cov=cov) if uncertain else Moments(mean)
    with backend("reference"):
        out = response_moments(acts, points, ls, beta, None, noise_var, "mean")
    assert out.var is None and out.cov is None and out.is_deterministic
    var = acts.variance.numpy()
    z = np.linspace(-12, 12, 4001)
    w = np.exp(-0.5 * z**2) / np.sqrt(2 * np.pi) * (z[1] - z[0])
    a = mean.numpy()[..., None] + np.sqrt(var)[..., None] * z  # [S, N, Q]
    p, lam = points.expand(4, -1).numpy(), ls.expand(4).numpy()
    alpha = np.exp(
        -((a[..., None] - p[None, :, None, :]) ** 2) / (2 * lam[None, :, None, None] ** 2)
    )
    want = np.einsum("snqr,nr,q->sn", alpha, beta.expand(4, -1).numpy(), w)
    torch.testing.assert_close(out.mean, torch.from_numpy(want), rtol=0, atol=1e-12)
