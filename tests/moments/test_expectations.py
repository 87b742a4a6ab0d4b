"""psi, Omega and Lambda against Monte Carlo and against each other."""

import pytest
import torch
from torch.autograd import gradcheck

from pyro_gpn.moments.expectations import (
    expected_cross_kernel_product,
    expected_kernel,
    expected_kernel_product,
)
from tests.mc import assert_mc_mean, random_covariance

DT = torch.float64


def _setup(seed=0, S=3, N=4, R=5, shared=False):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(S, N, dtype=DT, generator=g)
    cov = random_covariance(S, N, generator=g)
    groups = 1 if shared else N
    points = torch.sort(torch.rand(groups, R, dtype=DT, generator=g) * 4 - 2, dim=-1).values
    ls = torch.rand(groups, dtype=DT, generator=g) + 0.3
    return mean, cov, points, ls


def _kernel_samples(mean, cov, points, ls, num=40000, seed=1):
    g = torch.Generator().manual_seed(seed)
    chol = torch.linalg.cholesky(cov)
    z = torch.randn(num, *mean.shape, 1, dtype=DT, generator=g)
    a = mean + (chol @ z).squeeze(-1)  # [K, S, N]
    n = mean.shape[-1]
    pts, lsn = points.expand(n, -1), ls.expand(n)
    return (-0.5 * ((a.unsqueeze(-1) - pts) / lsn[:, None]).square()).exp()  # [K, S, N, R]


@pytest.mark.parametrize("shared", [False, True])
def test_psi_omega_lambda_match_monte_carlo(shared):
    mean, cov, points, ls = _setup(shared=shared)
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    alpha = _kernel_samples(mean, cov, points, ls)
    assert_mc_mean(alpha, expected_kernel(mean, var, points, ls))
    omega_samples = alpha.unsqueeze(-1) * alpha.unsqueeze(-2)
    assert_mc_mean(omega_samples, expected_kernel_product(mean, var, points, ls))
    lam_samples = alpha[:, :, :, None, :, None] * alpha[:, :, None, :, None, :]
    assert_mc_mean(lam_samples, expected_cross_kernel_product(mean, cov, points, ls))


def test_deterministic_activations_give_kernel_values():
    mean, _, points, ls = _setup()
    alpha = (-0.5 * ((mean.unsqueeze(-1) - points) / ls[:, None]).square()).exp()
    torch.testing.assert_close(expected_kernel(mean, None, points, ls), alpha)
    omega = expected_kernel_product(mean, None, points, ls)
    torch.testing.assert_close(omega, alpha.unsqueeze(-1) * alpha.unsqueeze(-2))


def test_lambda_diagonal_is_omega_and_independent_units_factorise():
    mean, cov, points, ls = _setup()
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    lam = expected_cross_kernel_product(mean, cov, points, ls)
    diag = torch.diagonal(lam, dim1=1, dim2=2).permute(0, 3, 1, 2)
    torch.testing.assert_close(diag, expected_kernel_product(mean, var, points, ls))
    lam_indep = expected_cross_kernel_product(mean, torch.diag_embed(var), points, ls)
    psi = expected_kernel(mean, var, points, ls)
    outer = psi[:, :, None, :, None] * psi[:, None, :, None, :]
    off = ~torch.eye(mean.shape[1], dtype=torch.bool)
    torch.testing.assert_close(lam_indep[:, off], outer[:, off])


def test_gradcheck_expectations():
    mean, cov, points, ls = _setup(S=2, N=3, R=4)
    var = torch.diagonal(cov, dim1=-2, dim2=-1).clone()
    args = [t.clone().requires_grad_() for t in (mean, var, points, ls)]
    assert gradcheck(expected_kernel, args)
    assert gradcheck(expected_kernel_product, args)
    cov_arg = cov.clone().requires_grad_()
    fn = lambda m, c, p, l: expected_cross_kernel_product(m, 0.5 * (c + c.mT), p, l)
    assert gradcheck(fn, [args[0], cov_arg, args[2], args[3]])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"var": -1.0}, "var must be non-negative"),  # psi, Omega: NaN before
        ({"lengthscales": torch.ones(5, dtype=DT)}, "lengthscales must have shape"),
        ({"lengthscales": torch.zeros(4, dtype=DT)}, "lengthscales must be positive"),
        ({"inducing_points": torch.zeros(5, 4, dtype=DT)}, "inducing_points must have shape"),
        ({"var": torch.ones(3, 4)}, "var has dtype torch.float32 but mean"),
        ({"mean": float("nan")}, "mean contains NaN"),
    ],
)
@pytest.mark.parametrize("function", [expected_kernel, expected_kernel_product])
def test_expected_kernels_refuse_bad_arguments_naming_them(function, bad, message):
    mean, cov, points, ls = _setup()
    args = {
        "mean": mean,
        "var": torch.diagonal(cov, dim1=-2, dim2=-1),
        "inducing_points": points,
        "lengthscales": ls,
    }
    for name in ("var", "mean"):  # a number scales the valid tensor (a sign or a NaN)
        if isinstance(bad.get(name), float):
            bad = {**bad, name: bad[name] * args[name]}
    with pytest.raises(ValueError, match=message):
        function(**{**args, **bad})


def test_expected_cross_kernel_product_refuses_bad_covariances():
    mean, cov, points, ls = _setup()
    with pytest.raises(ValueError, match="cov must be positive semi-definite"):
        expected_cross_kernel_product(mean, -cov, points, ls)  # NaN before
    with pytest.raises(ValueError, match=r"cov must have shape \(3, 4, 4\)"):
        expected_cross_kernel_product(mean, cov[:, :2, :2], points, ls)
    with pytest.raises(ValueError, match="cov has dtype"):
        expected_cross_kernel_product(mean, cov.float(), points, ls)


def test_shared_inducing_points_may_be_one_dimensional():
    mean, cov, points, ls = _setup(shared=True)
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    for function, second in (
        (expected_kernel, var),
        (expected_kernel_product, var),
        (expected_cross_kernel_product, cov),
    ):
        torch.testing.assert_close(
            function(mean, second, points[0], ls), function(mean, second, points, ls)
        )


def test_an_empty_batch_has_empty_expectations():
    """check_psd took amax over no entries: a RuntimeError from torch."""
    V = torch.linspace(-2, 2, 5, dtype=torch.float64).expand(3, 5)
    lam = torch.ones(3, dtype=torch.float64)
    empty = torch.zeros(0, 3, dtype=torch.float64)
    out = expected_cross_kernel_product(empty, torch.zeros(0, 3, 3, dtype=torch.float64), V, lam)
    assert out.shape == (0, 3, 3, 5, 5)
    assert expected_kernel(empty, empty, V, lam).shape == (0, 3, 5)
