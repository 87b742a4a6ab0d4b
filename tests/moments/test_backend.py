"""Dispatch between the reference path and the fused kernels (:mod:`pyro_gpn.moments.backend`).

``"auto"`` picks by device, dtype, package and layer and never raises; the forcing backends
(``"fused"``, ``"cpu"``, ``"triton"``) raise with the reason when they cannot run, instead of
falling back silently; a whole layer gives the same values and gradients on every backend.
"""

from __future__ import annotations

import pytest
import torch

from pyro_gpn import GPNLayer, Moments
from pyro_gpn.moments import backend as backend_mod
from pyro_gpn.moments.backend import (
    BACKENDS,
    backend,
    cpu_parameter_kernels,
    numba_available,
    select_backend,
)

needs_numba = pytest.mark.skipif(not numba_available(), reason="numba is not installed")
V = torch.linspace(-2, 2, 6, dtype=torch.float64).expand(3, -1).clone()
IRREGULAR = torch.tensor([[-2.0, -1.0, 0.5, 2.0]], dtype=torch.float64)


def test_backend_names():
    assert BACKENDS == ("auto", "reference", "fused", "cpu", "triton")


@needs_numba
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_auto_picks_cpu_kernels_for_fixed_equidistant_points(dtype):
    x = torch.zeros(2, 3, dtype=dtype)
    assert select_backend(x, inducing_points=V.to(dtype)) == "cpu"
    assert select_backend(x, inducing_points=V.to(dtype), equidistant=True) == "cpu"
    assert cpu_parameter_kernels(V, x)


@needs_numba
def test_auto_falls_back_to_reference_where_the_kernels_cannot_run():
    x = torch.zeros(2, 3, dtype=torch.float64)
    assert select_backend(x, inducing_points=V.clone().requires_grad_()) == "reference"
    assert select_backend(x, inducing_points=IRREGULAR) == "reference"
    assert select_backend(x, inducing_points=V, equidistant=False) == "reference"
    assert select_backend(x.half(), inducing_points=V.half()) == "reference"
    assert not cpu_parameter_kernels(V.clone().requires_grad_(), x)
    with backend("reference"):
        assert select_backend(x, inducing_points=V) == "reference"
        assert not cpu_parameter_kernels(V, x)


def test_auto_without_numba(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(backend_mod, "numba_available", lambda: False)
    x = torch.zeros(2, 3, dtype=torch.float64)
    assert select_backend(x, inducing_points=V) == "reference"
    assert not cpu_parameter_kernels(V, x)
    for name in ("fused", "cpu"):
        with backend(name), pytest.raises(RuntimeError, match="numba is not installed"):
            select_backend(x, inducing_points=V)


@needs_numba
@pytest.mark.parametrize("name", ["fused", "cpu"])
def test_forced_cpu_backend_raises_with_the_reason(name):
    x = torch.zeros(2, 3, dtype=torch.float64)
    with backend(name):
        assert select_backend(x, inducing_points=V) == "cpu"
        with pytest.raises(RuntimeError, match="fixed inducing points"):
            select_backend(x, inducing_points=V.clone().requires_grad_())
        with pytest.raises(RuntimeError, match="equidistant"):
            select_backend(x, inducing_points=IRREGULAR)
        with pytest.raises(RuntimeError, match="float32 or float64"):
            select_backend(x.half(), inducing_points=V.half())


def test_forced_triton_on_cpu_without_interpreter_raises(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.zeros(2, 3)
    with backend("triton"), pytest.raises(RuntimeError, match="cannot run"):
        select_backend(x, inducing_points=V.float())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_auto_never_raises_and_picks_no_triton_on_cpu(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter is for tests, never auto
    x = torch.zeros(2, 3)
    assert select_backend(x, inducing_points=IRREGULAR.float()) == "reference"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_picks_triton_on_cuda():
    x = torch.zeros(2, 3, device="cuda")
    expected = "triton" if backend_mod.triton_available() else "reference"
    assert select_backend(x, inducing_points=V.float().cuda()) == expected
    assert select_backend(x.double(), inducing_points=V.cuda()) == "reference"
    dtypes = backend_mod.TRITON_MEANVAR_DTYPES
    assert select_backend(x.double(), inducing_points=V.cuda(), triton_dtypes=dtypes) == expected
    with backend("fused"), pytest.raises(RuntimeError, match="float32"):
        select_backend(x.double(), inducing_points=V.cuda())


class _CudaLike:
    """Stands for a CUDA tensor in the backend's decisions (this machine has no GPU)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype, self.is_cuda, self.device = dtype, True, torch.device("cuda")


def test_auto_on_cuda_by_dtype_and_expression(monkeypatch: pytest.MonkeyPatch):
    """On CUDA, "auto" takes the Triton kernels in every dtype they compute in (float64 for the
    mean and mean/variance kernels, the layers' default), never for a mix of dtypes."""
    monkeypatch.setattr(backend_mod, "triton_available", lambda: True)
    f32, f64 = _CudaLike(torch.float32), _CudaLike(torch.float64)
    meanvar = backend_mod.TRITON_MEANVAR_DTYPES
    assert select_backend(f32, f32) == "triton"
    assert select_backend(f64, f64) == "reference"  # default: float32 kernels only
    assert select_backend(f64, f64, triton_dtypes=meanvar) == "triton"
    assert select_backend(f32, f64, triton_dtypes=meanvar) == "reference"
    with backend("triton"), pytest.raises(RuntimeError, match="one dtype"):
        select_backend(f32, f64, triton_dtypes=meanvar)
    with backend("fused"), pytest.raises(RuntimeError, match="compute in float32, got"):
        select_backend(f64, f64)


@pytest.mark.parametrize(
    "mode, full", [("mean", False), ("meanvar", False), ("cov", False), ("cov", True)]
)
def test_response_moments_offers_the_triton_kernels(mode, full, monkeypatch):
    """response_moments lets "auto" take the Triton kernels in every mode, float32 and float64:
    their result is the reference's (the narrow regime applied on top, and a full activation
    covariance's off-diagonal by Mehler's series)."""
    from pyro_gpn.moments import propagate

    seen = {}

    def spy(*tensors, **kwargs):
        seen.update(kwargs)
        return "reference"

    monkeypatch.setattr(propagate, "select_backend", spy)
    mean = torch.zeros(2, 3, dtype=torch.float64)
    cov = 0.1 * torch.eye(3, dtype=torch.float64).expand(2, 3, 3)
    acts = Moments(mean, cov=cov) if full else Moments(mean)
    beta, C = torch.zeros(3, 6, dtype=torch.float64), torch.zeros(3, 6, 6, dtype=torch.float64)
    lam = torch.ones(3, dtype=torch.float64)
    propagate.response_moments(acts, V, lam, beta, C, mode=mode)
    assert tuple(seen["triton_dtypes"]) == (torch.float32, torch.float64)


@needs_numba
@pytest.mark.parametrize("mode", ["mean", "meanvar", "cov"])
@pytest.mark.parametrize("share", ["none", "layer"])
@pytest.mark.parametrize("compute_dtype", [torch.float64, None])
def test_layer_same_on_every_cpu_backend(mode, share, compute_dtype, monkeypatch):
    """A GPN layer: the CPU kernels are reached under "auto" and give the reference's values
    and gradients (float64 algebra: to 1e-10; float32: to float32 rounding)."""
    from pyro_gpn.moments import cpu_kernels, cpu_layer

    calls = []
    for module, name in (
        # the unchecked kernels that response_moments calls, and the layers' fused path
        (cpu_kernels, "_cpu_response_mean"),
        (cpu_kernels, "_cpu_response_meanvar"),
        (cpu_layer, "layer_response"),
    ):
        original = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k)
        )
    torch.manual_seed(0)
    layer = GPNLayer(4, 7, num_inducing=9, share=share, compute_dtype=compute_dtype)
    mean = torch.randn(5, 4)
    a = torch.randn(5, 4, 4) / 4
    cov = 0.1 * a @ a.mT + 0.01 * torch.eye(4)

    def run():
        layer.zero_grad()
        out = layer.propagate(Moments(mean, cov=cov), mode)
        total = out.mean.sum() + (0 if out.is_deterministic else out.covariance.sum())
        total.backward()
        grads = [p.grad.clone() for p in layer.parameters() if p.grad is not None]
        return [out.mean.detach(), out.covariance.detach(), *grads]

    with backend("reference"):
        expected = run()
    got = run()
    if mode != "mean" and compute_dtype is None:
        # ("cov": the kernels give the mean and the diagonal, Mehler's series the off-diagonal)
        # float32 algebra: the layer hands its Cholesky factors to the reference path
        assert calls == [] or not {"_cpu_response_meanvar", "layer_response"} & set(calls)
        with backend("cpu"), pytest.raises(RuntimeError, match="variance_cholesky"):
            run()
    else:
        assert calls, "the CPU kernels were not called under backend('auto')"
    # float64 algebra: to 1e-10, or to two float32 roundings of the float32 results (the fused
    # layer sums a parameter's gradient in float64 before rounding it once, the reference path
    # rounds each use's share to float32 first)
    tol = {"rtol": 1e-10, "atol": 1e-10} if compute_dtype else {"rtol": 2e-4, "atol": 2e-5}
    for e, g in zip(expected, got, strict=True):
        f32 = {"rtol": 2.5e-7, "atol": 2.5e-7 * max(1.0, float(e.abs().max()))}
        use_f32 = compute_dtype is not None and e.dtype == torch.float32
        torch.testing.assert_close(g, e, **(f32 if use_f32 else tol))


@needs_numba
def test_learnable_inducing_points_keep_the_reference_path(monkeypatch):
    from pyro_gpn.moments import cpu_kernels

    monkeypatch.setattr(cpu_kernels, "cpu_response_meanvar", None)  # would fail if called
    layer = GPNLayer(3, 4, learn_inducing=True)
    out = layer.propagate(Moments(torch.randn(2, 3), var=torch.rand(2, 3)), "meanvar")
    out.var.sum().backward()
    assert layer.inducing_points.grad is not None
    with backend("fused"), pytest.raises(RuntimeError, match="fixed inducing points"):
        layer.propagate(Moments(torch.randn(2, 3), var=torch.rand(2, 3)), "meanvar")


@needs_numba
def test_cpu_kernels_evaluate_follows_the_backend(monkeypatch):
    """Expressions that only the CPU kernels fuse: on them under "auto", "cpu" and "fused" (CPU
    tensors), on their PyTorch path under "reference" and "triton" (which has no kernel for
    them, in any dtype); a forced "cpu" that cannot run raises, naming why."""
    from pyro_gpn.moments.backend import cpu_kernels_evaluate

    x = torch.zeros(2, 3, dtype=torch.float64)
    for name, expected in (
        ("auto", True),
        ("cpu", True),
        ("fused", True),
        ("reference", False),
        ("triton", False),
    ):
        with backend(name):
            assert cpu_kernels_evaluate(x, x.float()) is expected, name
    with backend("cpu"), pytest.raises(RuntimeError, match="float32 or float64"):
        cpu_kernels_evaluate(x.half())
    with backend("auto"):
        assert cpu_kernels_evaluate(x.half()) is False
    monkeypatch.setattr(backend_mod, "numba_available", lambda: False)
    with backend("auto"):
        assert cpu_kernels_evaluate(x) is False
    with backend("fused"), pytest.raises(RuntimeError, match="numba is not installed"):
        cpu_kernels_evaluate(x)
    # on CUDA "fused" means the Triton kernels, which have none for these expressions: their
    # PyTorch path, in any dtype (not "the Triton kernels compute in float32")
    monkeypatch.setattr(backend_mod, "triton_available", lambda: True)
    for dtype in (torch.float32, torch.float64):
        with backend("fused"):
            assert cpu_kernels_evaluate(_CudaLike(dtype)) is False
        with backend("auto"):
            assert cpu_kernels_evaluate(_CudaLike(dtype)) is False
        with backend("cpu"), pytest.raises(RuntimeError, match="cannot run here"):
            cpu_kernels_evaluate(_CudaLike(dtype))
