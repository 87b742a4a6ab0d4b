"""GPNLayerBase numerics: the GP algebra in ``compute_dtype`` for float32 layers.

A nearly noise-free layer (small target variances ``S``, or a nearly exact ``q(U)``) has
``|beta|`` and ``|C|`` in the hundreds, and the output variance
``1 - tr[(C - beta beta^T) Omega] - mu^2`` is a small difference of large numbers. The layers
therefore evaluate it in float64 by default, whatever the parameters' dtype; these tests pin
that a float32 layer then agrees with the same layer in float64.
"""

import copy

import numpy as np
import pytest
import torch
from torch import Tensor

from pyro_gpn import GPNLayer, Moments
from pyro_gpn.layers import VariationalGPNLayer
from tests.mc import assert_mc_covariance, assert_mc_mean


def _nearly_noise_free_gpn_layer() -> GPNLayer:
    torch.manual_seed(0)
    layer = GPNLayer(2, 4, lengthscale_init=0.4, dtype=torch.float32)
    with torch.no_grad():
        layer.target_variances = torch.full((4, 14), 1e-3)
    return layer


def _nearly_exact_variational_layer(whiten: bool) -> VariationalGPNLayer:
    torch.manual_seed(1)
    # point weights: these tests are about the response's variance algebra (q(W) adds the
    # weights' variance to the activations', tests/layers/test_variational.py)
    layer = VariationalGPNLayer(2, 4, whiten=whiten, dtype=torch.float32, weights="point")
    with torch.no_grad():
        layer.targets_scale_tril = 1e-3 * layer.targets_scale_tril
    return layer


def _inputs(dtype: torch.dtype) -> tuple[Tensor, Moments]:
    gen = torch.Generator().manual_seed(2)
    x = 2 * torch.rand(16, 2, generator=gen, dtype=torch.float64) - 1
    var = 0.05 * torch.rand(16, 2, generator=gen, dtype=torch.float64)
    return x.to(dtype), Moments(x.to(dtype), var=var.to(dtype))


LAYERS = {
    "parametric": _nearly_noise_free_gpn_layer,
    "variational": lambda: _nearly_exact_variational_layer(whiten=False),
    "variational-whitened": lambda: _nearly_exact_variational_layer(whiten=True),
}


@pytest.mark.parametrize("make_layer", LAYERS.values(), ids=LAYERS.keys())
@pytest.mark.parametrize("uncertain", [False, True], ids=["deterministic", "gaussian"])
def test_float32_layer_matches_float64_layer(make_layer, uncertain):
    layer32 = make_layer()
    layer64 = copy.deepcopy(layer32).double()
    x32, moments32 = _inputs(torch.float32)
    x64, moments64 = _inputs(torch.float64)
    out32 = layer32.propagate(moments32 if uncertain else x32, "meanvar", noise=False)
    out64 = layer64.propagate(moments64 if uncertain else x64, "meanvar", noise=False)
    assert out32.mean.dtype == out32.variance.dtype == torch.float32
    assert out64.variance.min() < 0.05  # the regime of the cancellation
    torch.testing.assert_close(out32.mean.double(), out64.mean, rtol=0, atol=2e-6)
    torch.testing.assert_close(out32.variance.double(), out64.variance, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("make_layer", LAYERS.values(), ids=LAYERS.keys())
def test_closed_form_variance_equals_the_conditional_for_observed_inputs(make_layer):
    """Deterministic activations: the propagated variance is ``1 - alpha^T C alpha`` exactly,
    also for a float32 layer converted with ``.double()`` (fixed inducing points are
    regenerated equally spaced, so the midpoint expansion stays exact)."""
    for layer in (make_layer(), make_layer().double()):
        x, _ = _inputs(layer.weight.dtype)
        out = layer.propagate(x, "meanvar", noise=False)
        beta, reduction = layer.response_weights()
        if isinstance(layer, GPNLayer):
            mean, var = layer.conditional(x @ layer.weight, noise=False)
        else:
            alpha = torch.exp(
                -0.5
                * ((x @ layer.weight).double().unsqueeze(-1) - layer.compute_inducing_points())
                .div(layer.lengthscales.double().unsqueeze(-1))
                .square()
            )
            mean = (alpha * beta).sum(-1)
            var = 1 - torch.einsum("snr,nrt,snt->sn", alpha, reduction, alpha)
        tol = 1e-6 if layer.weight.dtype == torch.float32 else 1e-10
        torch.testing.assert_close(out.mean.double(), mean.double(), rtol=0, atol=tol)
        torch.testing.assert_close(out.variance.double(), var.double(), rtol=0, atol=tol)


def test_gradients_reach_float32_parameters_in_float32():
    layer = _nearly_noise_free_gpn_layer()
    _, moments = _inputs(torch.float32)
    out = layer.propagate(moments, "meanvar")
    (out.mean.sum() + out.variance.sum()).backward()
    for name, param in layer.named_parameters():
        assert param.grad is not None, name
        assert param.grad.dtype == torch.float32, name
        assert torch.isfinite(param.grad).all(), name


def test_compute_dtype_none_computes_in_the_parameters_dtype():
    layer = GPNLayer(2, 3, compute_dtype=None, dtype=torch.float32)
    beta, reduction = layer.response_weights()
    assert beta.dtype == reduction.dtype == torch.float32
    assert GPNLayer(2, 3, dtype=torch.float32).response_weights()[0].dtype == torch.float64


@pytest.mark.parametrize("bad", ["float64", torch.int64, 64, torch.float16, torch.bfloat16])
def test_bad_compute_dtype_raises(bad):
    with pytest.raises(ValueError, match="compute_dtype"):
        GPNLayer(2, 3, compute_dtype=bad)
    with pytest.raises(ValueError, match="compute_dtype"):
        VariationalGPNLayer(2, 3, compute_dtype=bad)


def test_float32_layer_variance_uses_the_cholesky_factor():
    """A float32 layer computing in float32 (``compute_dtype=None``), a nearly noise-free unit
    (S = 1e-3, rough targets): its variance matches 50-digit quadrature to 1e-4 relative (plus a
    few float32 roundings) only because it hands the response's Cholesky factor to
    ``response_moments`` (with the explicit ``kappa`` the conditional variance loses
    ``eps * cond(K + S)``)."""
    from benchmarks.accuracy_grid import Unit, reference_meanvar

    f32 = torch.float32
    unit = Unit.make(0.4, 1e-3, "rough", f32)
    layer = GPNLayer(1, 1, output_noise=False, jitter=0.0, compute_dtype=None)
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.lengthscales = torch.tensor([unit.lengthscale], dtype=f32)
        layer.targets.copy_(torch.tensor([unit.targets], dtype=f32))
        layer.target_variances = torch.tensor([unit.variances], dtype=f32)
    for mu, v in [(-1.1, 1e-8), (0.3, 1e-4)]:
        mu, v = float(torch.tensor(mu, dtype=f32)), float(torch.tensor(v, dtype=f32))
        ref_mean, ref_var = reference_meanvar(unit, mu, v)
        x = Moments(torch.tensor([[mu]], dtype=f32), var=torch.tensor([[v]], dtype=f32))
        out = layer.propagate(x, mode="meanvar")
        assert abs(out.var.item() - ref_var) < 1e-4 * ref_var + 4 * torch.finfo(f32).eps


def test_every_layer_defaults_to_the_policy_dtype():
    """Every GPN layer computes its GP algebra in the policy's dtype
    (:data:`pyro_gpn.moments.DEFAULT_COMPUTE_DTYPE`, ``docs/results/accuracy.md``) unless told
    otherwise: fails if a layer class sets a default of its own."""
    from pyro_gpn.layers import (
        GPNConv2d,
        GPNRecurrent,
        VariationalGPNConv2d,
        VariationalGPNRecurrent,
    )
    from pyro_gpn.moments import DEFAULT_COMPUTE_DTYPE

    layers = [
        GPNLayer(2, 3),
        VariationalGPNLayer(2, 3),
        GPNConv2d(1, 2, 3, (4, 4)),
        VariationalGPNConv2d(1, 2, 3, (4, 4)),
        GPNRecurrent(2, 3),
        VariationalGPNRecurrent(2, 3),
    ]
    for layer in layers:
        assert layer.compute_dtype == DEFAULT_COMPUTE_DTYPE, type(layer).__name__


@pytest.mark.parametrize(
    ("args", "name"), [((True, 3), "in_features"), ((3, True), "out_features")]
)
def test_bool_sizes_are_refused(args, name):
    """``True`` is an ``int`` to ``isinstance``: refused by name, not a TypeError from torch."""
    with pytest.raises(ValueError, match=f"{name} must be a positive integer, got True"):
        GPNLayer(*args)
    with pytest.raises(ValueError, match="num_inducing"):
        GPNLayer(3, 2, num_inducing=True)


def test_cov_mode_keeps_the_correlations_the_projection_gives_independent_inputs():
    """``"cov"`` mode with independent inputs (``var``, not ``cov``): the activations
    ``A = X W`` of the units are correlated through the shared inputs
    (``Cov[A] = W^T diag(v) W``), and so are the outputs. Against Monte Carlo draws of
    ``x ~ N(mu, diag(v))`` pushed through the layer's exact conditional, within 5 standard
    errors per entry; the off-diagonal covariances are many standard errors from zero."""
    dt = torch.float64
    torch.manual_seed(0)
    layer = GPNLayer(2, 3, targets_init="identity", lengthscale_init=0.8, dtype=dt)
    g = torch.Generator().manual_seed(5)
    mean = torch.tensor([[0.2, -0.3], [0.5, 0.4]], dtype=dt)
    var = torch.tensor([[0.3, 0.2], [0.25, 0.35]], dtype=dt)
    with torch.no_grad():
        out = layer.propagate(Moments(mean, var=var), "cov")
        x = mean + var.sqrt() * torch.randn(40000, 2, 2, dtype=dt, generator=g)
        cond_mean, cond_var = layer.conditional((x @ layer.weight).reshape(-1, 3))
        cond_mean, cond_var = cond_mean.reshape(40000, 2, 3), cond_var.reshape(40000, 2, 3)
        y = cond_mean + cond_var.sqrt() * torch.randn(cond_mean.shape, dtype=dt, generator=g)
    assert_mc_mean(y, out.mean)
    assert_mc_covariance(y, out.cov)
    centred = y - y.mean(0)
    products = centred.unsqueeze(-1) * centred.unsqueeze(-2)
    z = products.mean(0) / (products.std(0) / 40000**0.5)
    off = ~torch.eye(3, dtype=torch.bool)
    assert bool((z[:, off].abs() > 10).any())  # a dropped correlation would be caught


def _gp_mean_by_hand(a: np.ndarray, layer: GPNLayer, points: np.ndarray) -> np.ndarray:
    """``m_n(a) = k(a, V_n) (K(V_n, V_n) + diag(S_n) + jitter I)^-1 U_n`` in numpy, for
    deterministic activations ``a [B, N]`` (the layer's mean output at zero input variance)."""
    lengthscales = layer.lengthscales.detach().numpy()
    targets = layer.targets.detach().numpy()
    variances = layer.target_variances.detach().numpy()
    out = np.empty_like(a)
    for n in range(a.shape[1]):
        v, ls = points[n], lengthscales[n]
        gram = np.exp(-0.5 * (v[:, None] - v[None, :]) ** 2 / ls**2)
        gram += np.diag(variances[n]) + layer.response.jitter * np.eye(len(v))
        cross = np.exp(-0.5 * (a[:, n, None] - v[None, :]) ** 2 / ls**2)
        out[:, n] = cross @ np.linalg.solve(gram, targets[n])
    return out


@pytest.mark.parametrize("how", ["load_state_dict", "in-place copy"])
def test_uneven_fixed_points_written_after_construction_are_used(how):
    """A default layer (even fixed grid) that receives uneven fixed points afterwards, from
    the state dict of a layer trained with ``learn_inducing=True`` or by an in-place write,
    must use those points: before 2026-11-29 it decided once, in ``__init__``, that its grid
    was even, regenerated an even grid from the end points and answered with it (a mean
    error of 0.94 on this layer; found by an outside audit)."""
    dtype = torch.float64
    torch.manual_seed(0)
    layer = GPNLayer(2, 3, num_inducing=5, dtype=dtype)
    uneven = torch.tensor([-2.0, -1.5, 0.0, 0.3, 2.0], dtype=dtype).expand(3, 5).clone()
    if how == "load_state_dict":
        state = layer.state_dict()
        state["inducing_points"] = uneven
        layer.load_state_dict(state)
    else:
        with torch.no_grad():
            layer.inducing_points.copy_(uneven)
    torch.testing.assert_close(layer.compute_inducing_points(), uneven, rtol=0, atol=0)
    x = torch.randn(4, 2, dtype=dtype)
    out = layer.propagate(x, "meanvar")
    activations = (x @ layer.weight).detach().numpy()
    want = _gp_mean_by_hand(activations, layer, uneven.numpy())
    np.testing.assert_allclose(out.mean.detach().numpy(), want, rtol=1e-7, atol=1e-9)
    # and back to an even grid: the fast path again, with the same answers as a fresh layer
    even = torch.linspace(-2.0, 2.0, 5, dtype=dtype).expand(3, 5).clone()
    with torch.no_grad():
        layer.inducing_points.copy_(even)
    assert layer._equidistant
    want = _gp_mean_by_hand(activations, layer, even.numpy())
    out = layer.propagate(x, "meanvar")
    np.testing.assert_allclose(out.mean.detach().numpy(), want, rtol=1e-7, atol=1e-9)
