"""Tests of the row algebra of the non-parametric GPN layers: the collapsed activations'
covariance against the linear map of the hidden outputs written as one matrix."""

from __future__ import annotations

import torch

from pyro_gpn.models.gp_rows import activation_cholesky, layer_cholesky

F64 = torch.float64


def _blocks(s: int, m: int, n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(s, m, generator=g, dtype=F64)
    w = torch.randn(n, m, generator=g, dtype=F64)
    noise = 0.1 + torch.rand(n, generator=g, dtype=F64)
    top = torch.randn(k, n, generator=g, dtype=F64)
    return x, w, noise, top


def _kernel(x, w, lengthscale):
    """k_w(x, x') = exp(-[sum_m w_m (x_m - x'_m)]^2 / (2 lambda^2)) for one unit ``w [M]``,
    written out (the projection of every pairwise difference)."""
    proj = ((x[:, None, :] - x[None, :, :]) * w).sum(-1)
    return torch.exp(-0.5 * proj.square() / lengthscale**2)


def _reference(x, w, noise, top, lengthscale, jitter):
    """Cov of vec(A), A = X top^T, X[:, n] ~ N(0, C_n) independent: with x = vec of X (units
    major) and A_{sk} = sum_n top_{kn} X_{sn}, vec(A) = M x, Cov = M blockdiag(C_n) M^T."""
    s, (k, n) = x.shape[0], top.shape
    blocks = [
        _kernel(x, w[i], lengthscale) + noise[i] ** 2 * torch.eye(s, dtype=F64) for i in range(n)
    ]
    big = torch.block_diag(*blocks)  # [n s, n s], index n_i * s + s_i
    lin = torch.zeros(s * k, n * s, dtype=F64)
    for si in range(s):
        for ki in range(k):
            for ni in range(n):
                lin[si * k + ki, ni * s + si] = top[ki, ni]
    return lin @ big @ lin.mT + jitter * torch.eye(s * k, dtype=F64)


def test_activation_covariance_matches_the_linear_map():
    x, w, noise, top = _blocks(5, 2, 3, 2)
    chol = activation_cholesky(x, w, noise, 0.7, top, 1e-6)
    torch.testing.assert_close(chol @ chol.mT, _reference(x, w, noise, top, 0.7, 1e-6))
    assert torch.equal(chol, chol.tril())


def test_activation_covariance_single_output_and_batch():
    """N_L = 1 and a batch of two independent draws (as Predictive's vectorised traces have:
    inputs, weights, noise and top weights all differ per draw): each batch element is its own
    draw's covariance."""
    draws = [_blocks(4, 1, 4, 1, seed=seed) for seed in (1, 2)]
    x, w, noise, top = (torch.stack(parts) for parts in zip(*draws))
    chol = activation_cholesky(x, w, noise, 1.0, top, 0.0)
    assert chol.shape == (2, 4, 4)
    for b, draw in enumerate(draws):
        torch.testing.assert_close(chol[b] @ chol[b].mT, _reference(*draw, 1.0, 0.0))


def test_layer_cholesky_uses_the_lengthscale():
    """L L^T = K_w(X, X) + (sigma^2 + jitter) I per unit, with lengthscales other than 1: one
    shared scalar, and one per unit (and per draw, with a batch of draws)."""
    x, w, noise, _ = _blocks(5, 2, 2, 1, seed=3)
    eye = torch.eye(5, dtype=F64)
    for lengthscale in (0.6, torch.tensor([0.6, 1.7], dtype=F64)):
        chol = layer_cholesky(x, w, noise, lengthscale, 1e-6)
        scales = torch.as_tensor(lengthscale, dtype=F64).expand(2)
        for n in range(2):
            want = _kernel(x, w[n], scales[n]) + (noise[n] ** 2 + 1e-6) * eye
            torch.testing.assert_close(chol[n] @ chol[n].mT, want)
    x2, w2, noise2, _ = _blocks(5, 2, 2, 1, seed=4)
    scales = torch.tensor([[0.6, 1.7], [0.4, 2.5]], dtype=F64)
    chol = layer_cholesky(
        torch.stack([x, x2]), torch.stack([w, w2]), torch.stack([noise, noise2]), scales, 1e-6
    )
    for b, (xb, wb, nb) in enumerate(((x, w, noise), (x2, w2, noise2))):
        for n in range(2):
            want = _kernel(xb, wb[n], scales[b, n]) + (nb[n] ** 2 + 1e-6) * eye
            torch.testing.assert_close(chol[b, n] @ chol[b, n].mT, want)


def test_activation_cholesky_failure_is_nan():
    """Zero top weights make the covariance singular (no jitter): NaN, not an exception."""
    x, w, noise, top = _blocks(3, 1, 2, 1)
    chol = activation_cholesky(x, w, noise, 1.0, torch.zeros_like(top), 0.0)
    assert torch.isnan(chol).all()


def test_a_divergent_state_gives_a_nan_factor_not_an_error():
    """The kernel's value checks raised on the overflowing weights of a divergent leapfrog
    state (validation is on in run_nuts' initialisation, Predictive and jit_compile=False)."""
    from pyro_gpn import settings
    from pyro_gpn.models.gp_rows import layer_cholesky

    x = torch.randn(5, 2, dtype=torch.float64)
    weight = torch.tensor([[1e200, 1e200], [1.0, 2.0]], dtype=torch.float64) * 1e200
    noise = torch.full((2,), 0.1, dtype=torch.float64)
    with settings.validation(True):
        assert torch.isnan(layer_cholesky(x, weight, noise, 1.0, 1e-6)).any()
        nan_inputs = torch.full((5, 2), float("nan"), dtype=torch.float64)
        assert torch.isnan(
            layer_cholesky(nan_inputs, torch.ones(2, 2, dtype=torch.float64), noise, 1.0, 0)
        ).any()
        top = torch.ones(1, 2, dtype=torch.float64)
        assert torch.isnan(activation_cholesky(x, weight, noise, 1.0, top, 1e-6)).any()
