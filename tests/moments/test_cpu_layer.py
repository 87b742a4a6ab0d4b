"""The fused parametric layer (:mod:`pyro_gpn.moments.cpu_layer`) against the float64 reference.

One autograd node for ``virtual_observation_weights`` + ``response_moments``: compared, values
and the gradients of every input, with the reference backend in float64 over odd sizes, shared
parameters, the extreme regimes (long lengthscales with tiny target variances, activations far
outside the inducing range, tiny and zero input variances, short lengthscales), float32 inputs,
and by ``gradcheck``; and through :class:`~pyro_gpn.GPNLayer` (float64 parameters).
"""

from __future__ import annotations

import pytest
import torch

from pyro_gpn import GPNLayer, Moments
from pyro_gpn.moments.backend import backend, numba_available

from .test_cpu_kernels import assert_close_all, make, run

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba is not installed")

F64 = torch.float64


def run_layer(leaves, mode: str = "meanvar", jitter: float = 0.0):
    """As :func:`tests.moments.test_cpu_kernels.run`, through ``cpu_layer_response``."""
    from pyro_gpn.moments.cpu_layer import cpu_layer_response

    mu, v, V, U, Svar, lam, noise = leaves
    if mode == "mean":
        outs = (cpu_layer_response(mu, v, V, lam, U, Svar, None, jitter, False),)
    else:
        outs = cpu_layer_response(mu, v, V, lam, U, Svar, noise, jitter, True)
    g = torch.Generator().manual_seed(123)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=F64).to(o.dtype)).sum() for o in outs)
    wrt = [t for t in leaves if t.requires_grad]
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    return [o.detach() for o in outs], grads


@pytest.mark.parametrize("mode", ["mean", "meanvar"])
@pytest.mark.parametrize(
    "S,N,R,shared",
    [(1, 1, 2, False), (7, 3, 5, False), (13, 5, 14, False), (9, 4, 14, True), (3, 6, 3, True)],
)
def test_matches_reference(S, N, R, shared, mode):
    leaves = make(S, N, R, shared, seed=S + N + R)
    out_f, g_f = run_layer(leaves, mode)
    out_r, g_r = run(leaves, False, mode)
    assert_close_all(out_f, out_r, what="outputs")
    assert_close_all(g_f, g_r, what="grads")


@pytest.mark.parametrize("mode", ["mean", "meanvar"])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(
    "regime",
    [
        {"mu_scale": 40.0},  # activations far outside the inducing range
        {"v_scale": 0.0},  # deterministic activations (v = 0 exactly)
        {"v_scale": 1e-9},  # tiny input variances
        {"v_scale": 25.0},  # input variance much wider than the range
        {"lengthscale": 0.03},  # short lengthscale
        # long lengthscales, tiny target variances: K + S ill-conditioned (|beta|^2 up to 1e8);
        # both paths share the rounding of kappa, so the tolerance scales with it
        {"lengthscale": 1.0, "target_var": 1e-4, "tol": 1e4},
        {"lengthscale": 2.0, "target_var": 1e-3, "tol": 1e4},
        {"lengthscale": 0.4, "target_var": 1e-6, "tol": 1e4},
    ],
)
def test_extreme_regimes_match_reference(regime, shared, mode):
    regime = dict(regime)
    tol = regime.pop("tol", 1.0)
    leaves = make(23, 4, 14, shared, seed=3, **regime)
    out_f, g_f = run_layer(leaves, mode, jitter=1e-9)
    out_r, g_r = run(leaves, False, mode, jitter=1e-9)
    for t in (*out_f, *g_f):
        assert t is None or torch.isfinite(t).all()
    assert_close_all(out_f, out_r, rtol=1e-7 * tol, atol=1e-9 * tol, what="outputs")
    assert_close_all(g_f, g_r, rtol=1e-6 * tol, atol=1e-8 * tol, what="grads")


@pytest.mark.parametrize("mode", ["mean", "meanvar"])
def test_float32_inputs_match_float64_reference(mode):
    leaves64 = make(31, 6, 14, seed=5)
    leaves32 = [t.detach().float().requires_grad_(t.requires_grad) for t in leaves64]
    out_f, g_f = run_layer(leaves32, mode)
    out_r, g_r = run(leaves64, False, mode)
    assert all(o.dtype == torch.float32 for o in out_f)
    assert all(g is None or g.dtype == torch.float32 for g in g_f)
    assert_close_all(out_f, out_r, rtol=2e-5, atol=2e-6, what="outputs")
    assert_close_all(g_f, g_r, rtol=2e-4, atol=2e-5, what="grads")


@pytest.mark.parametrize("shared", [False, True])
def test_gradcheck(shared):
    from pyro_gpn.moments.cpu_layer import cpu_layer_response

    mu, v, V, U, Svar, lam, noise = make(5, 3, 6, shared, seed=9)
    torch.autograd.gradcheck(
        lambda mu, v, lam, U, Svar, noise: cpu_layer_response(
            mu, v, V, lam, U, Svar, noise, 1e-6, True
        ),
        (mu, v, lam, U, Svar, noise),
    )
    torch.autograd.gradcheck(
        lambda mu, v, lam, U, Svar: cpu_layer_response(mu, v, V, lam, U, Svar, None, 0.0, False),
        (mu, v, lam, U, Svar),
    )


def test_deterministic_activations_and_not_positive_definite():
    from pyro_gpn.moments.cpu_layer import NotPositiveDefinite, cpu_layer_response

    mu, _, V, U, Svar, lam, noise = make(6, 3, 7, seed=4)
    got = cpu_layer_response(mu, None, V, lam, U, Svar, None, 0.0, False)
    want, _ = run([mu, torch.zeros_like(mu), V, U, Svar, lam, noise], False, "mean")
    torch.testing.assert_close(got.detach(), want[0], rtol=1e-12, atol=1e-12)
    with pytest.raises(NotPositiveDefinite, match="positive definite"):
        cpu_layer_response(mu, None, V, lam, U, torch.full_like(Svar, -10.0), None, 0.0, False)


@pytest.mark.parametrize("mode", ["mean", "meanvar", "cov"])
@pytest.mark.parametrize("share", ["none", "layer"])
def test_layer_float64_parameters(mode, share, monkeypatch):
    """A float64 GPNLayer reaches the fused layer under "auto" (deterministic and diagonal input
    moments; in ``"cov"`` mode only deterministic inputs, whose activations carry no covariance)
    and agrees with the reference to 1e-11."""
    from pyro_gpn.moments import cpu_layer

    calls = []
    original = cpu_layer.cpu_layer_response
    monkeypatch.setattr(cpu_layer, "cpu_layer_response", lambda *a: calls.append(1) or original(*a))
    torch.manual_seed(1)
    layer = GPNLayer(5, 9, num_inducing=11, share=share, dtype=F64)
    x = torch.randn(6, 5, dtype=F64)
    for inputs in (x, Moments(x, var=0.2 * torch.rand(6, 5, dtype=F64))):

        def go(inputs=inputs):
            layer.zero_grad()
            out = layer.propagate(inputs, mode)
            total = out.mean.square().sum() + (0 if out.is_deterministic else out.covariance.sum())
            total.backward()
            grads = [p.grad.clone() for p in layer.parameters() if p.grad is not None]
            return [out.mean.detach(), out.covariance.detach(), *grads]

        with backend("reference"):
            expected = go()
        calls.clear()
        got = go()
        fused = mode != "cov" or not isinstance(inputs, Moments)
        assert bool(calls) == fused, "the fused layer was (not) used"
        for e, g in zip(expected, got, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-11, atol=1e-11)
