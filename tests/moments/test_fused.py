"""Fused Triton kernels (:mod:`pyro_gpn.moments.fused`) against plain-PyTorch references.

Values and gradients of every input are compared with

* a small reference written here straight from the formulas (materialising ``Omega`` and
  ``Lambda``, in float64), and
* :func:`pyro_gpn.moments.propagate.response_moments` on the reference backend.

Without a GPU the kernels run in Triton's interpreter on CPU tensors: the ``interpret``
fixture sets ``TRITON_INTERPRET=1`` for these tests only (the kernels read it when first
launched). Shapes in the fast subset are tiny because the interpreter is slow; the broader sweep
is marked ``slow``.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
import threading

import pytest
import torch

from pyro_gpn.moments import backend as backend_mod
from pyro_gpn.moments.backend import backend, get_backend, triton_available, use_fused

HAS_CUDA = torch.cuda.is_available()
needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """CUDA if present, else the CPU under Triton's interpreter (for this test only).

    Triton fixes its mode when first imported; :mod:`pyro_gpn.moments.fused` imports it on the
    first launch, after this fixture has set ``TRITON_INTERPRET=1``. If some earlier test of the
    session imported Triton in compiled mode (``torch.compile`` does), the interpreter cannot be
    switched on any more and the test is skipped: run this module in its own process.
    """
    if HAS_CUDA:
        return torch.device("cuda")
    triton_mod = sys.modules.get("triton")
    if triton_mod is not None and os.environ.get("TRITON_INTERPRET") != "1":
        language = sys.modules.get("triton.language")
        if language is not None and type(language.sum).__name__ != "InterpretedFunction":
            pytest.skip("triton was imported in compiled mode before TRITON_INTERPRET was set")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# reference: the formulas, materialised, in float64
# ---------------------------------------------------------------------------------------------
def reference_moments(mu, second, V, lam, beta, C, noise_var, full: bool):
    """``(mean, var)`` or ``(mean, cov)`` from ``eq:gpn_normal_E_alpha`` ... ``_lambda``."""
    N = mu.shape[1]
    V, lam, beta, C = V.expand(N, -1), lam.expand(N), beta.expand(N, -1), C.expand(N, -1, -1)
    Sig = second if full else None
    v = torch.diagonal(second, dim1=-2, dim2=-1) if full else second
    lam2 = lam**2
    # psi [S, N, R], eq:gpn_normal_E_alpha
    c1 = (lam2 + v)[..., None]
    psi = (lam2[:, None] / c1).sqrt() * torch.exp(-((mu[..., None] - V) ** 2) / (2 * c1))
    mean = (psi * beta).sum(-1)
    # Omega [S, N, R, R], eq:gpn_normal_omega
    c2 = (lam2 + 2 * v)[..., None, None]
    mid = (V[:, :, None] + V[:, None, :]) / 2
    sep = (V[:, :, None] - V[:, None, :]) ** 2 / (4 * lam2[:, None, None])
    omega = (lam2[:, None, None] / c2).sqrt() * torch.exp(
        -((mu[..., None, None] - mid) ** 2) / c2 - sep
    )
    Q = C - beta[:, :, None] * beta[:, None, :]
    var = (1 - (Q * omega).sum((-2, -1)) - mean**2).clamp_min(0)
    if noise_var is not None:
        var = var + noise_var
    if not full:
        return mean, var
    # Lambda [S, N, N, R, R], corrected eq:gpn_normal_lambda
    d = V - mu[..., None]  # [S, N, R]
    c = lam2 + v  # [S, N]
    D = c[:, :, None] * c[:, None, :] - Sig**2
    dn, dm = d[:, :, None, :, None], d[:, None, :, None, :]
    cn, cm = c[:, :, None, None, None], c[:, None, :, None, None]
    expo = -(dn**2 * cm + dm**2 * cn - 2 * dn * dm * Sig[..., None, None]) / (
        2 * D[..., None, None]
    )
    Lam = (lam[:, None] * lam[None, :] / D.sqrt())[..., None, None] * expo.exp()
    cross = torch.einsum("snmrt,nr,mt->snm", Lam, beta, beta) - mean[:, :, None] * mean[:, None, :]
    eye = torch.eye(N, dtype=torch.bool, device=mu.device)
    return mean, torch.where(eye, torch.diag_embed(var), cross)


# ---------------------------------------------------------------------------------------------
# random problems
# ---------------------------------------------------------------------------------------------
def make_problem(
    S: int,
    N: int,
    R: int,
    *,
    shared: bool = False,
    full: bool = False,
    zero_var: bool = False,
    noise: bool = True,
    clamp: bool = False,
    seed: int = 0,
):
    """Random inputs in float64 (CPU): ``(mu, v | Sig, V, lam, beta, C, noise_var)``."""
    g = torch.Generator().manual_seed(seed)
    P = 1 if shared else N
    mu = 1.5 * torch.randn(S, N, generator=g, dtype=torch.float64)
    V = torch.linspace(-2, 2, R, dtype=torch.float64).repeat(P, 1)
    V = V + 0.2 * torch.randn(P, R, generator=g, dtype=torch.float64)
    lam = 0.4 + 0.6 * torch.rand(P, generator=g, dtype=torch.float64)
    beta = torch.randn(P, R, generator=g, dtype=torch.float64)
    A = torch.randn(P, R, R, generator=g, dtype=torch.float64) / R
    C = A @ A.mT + 0.05 * torch.randn(P, R, R, generator=g, dtype=torch.float64)  # not symmetric
    if clamp:
        C = C + 4.0 * torch.eye(R, dtype=torch.float64)  # 1 - tr[..] < 0: the variance clamps
    noise_var = 0.1 + torch.rand(P, generator=g, dtype=torch.float64) if noise else None
    if full:
        M = max(1, N - 2)  # rank deficient when M < N, as for W^T diag(var) W
        W = torch.randn(S, M, N, generator=g, dtype=torch.float64) / M**0.5
        L = torch.randn(S, N, N, generator=g, dtype=torch.float64) / N
        second = 0.5 * W.mT @ W + L @ L.mT
        if zero_var:
            second = torch.zeros_like(second)
    else:
        second = torch.rand(S, N, generator=g, dtype=torch.float64)
        if zero_var:
            second = torch.zeros_like(second)
    return mu, second, V, lam, beta, C, noise_var


def _leaves(tensors, dtype, device):
    return [
        None if t is None else t.detach().to(device=device, dtype=dtype).requires_grad_(True)
        for t in tensors
    ]


def _grads(outputs, upstream, inputs):
    loss = sum((o * u).sum() for o, u in zip(outputs, upstream, strict=True))
    present = [t for t in inputs if t is not None]
    grads = iter(torch.autograd.grad(loss, present))
    return [None if t is None else next(grads) for t in inputs]


def assert_close(actual, expected, name: str, rtol: float = 2e-4, atol: float = 2e-5) -> None:
    """Float32 kernel result vs float64 reference, relative to the reference's magnitude."""
    expected = expected.detach().to(device="cpu", dtype=torch.float64)
    actual = actual.detach().to(device="cpu", dtype=torch.float64)
    scale = max(1.0, expected.abs().max().item())
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol * scale, msg=name)


NAMES = ("mu", "v/Sig", "V", "lam", "beta", "C", "noise_var")


def check_against_reference(problem, device: torch.device, seed: int = 1) -> None:
    from pyro_gpn.moments.fused import fused_response_meanvar

    ref_in = _leaves(problem, torch.float64, "cpu")
    fus_in = _leaves(problem, torch.float32, device)
    out = fused_response_meanvar(*fus_in)
    ref = reference_moments(*ref_in, full=False)
    g = torch.Generator().manual_seed(seed)
    upstream = [torch.randn(r.shape, generator=g, dtype=torch.float64) for r in ref]
    assert out[0].shape == ref[0].shape and out[1].shape == ref[1].shape
    assert out[0].dtype == torch.float32 and out[1].dtype == torch.float32
    assert_close(out[0], ref[0], "mean")
    assert_close(out[1], ref[1], "var")

    ref_g = _grads(ref, upstream, ref_in)
    fus_g = _grads(out, [u.to(device=device, dtype=torch.float32) for u in upstream], fus_in)
    for name, a, e, t in zip(NAMES, fus_g, ref_g, fus_in, strict=True):
        if t is None:
            continue
        assert a.shape == t.shape, name
        assert torch.isfinite(a).all(), name
        assert_close(a, e, f"d/d {name}", rtol=5e-4, atol=5e-5)


# ---------------------------------------------------------------------------------------------
# backend switch (no triton needed)
# ---------------------------------------------------------------------------------------------
def test_backend_context_nests_and_restores():
    assert get_backend() == "auto"
    with backend("reference") as name:
        assert name == "reference" and get_backend() == "reference"
        with backend("fused"):
            assert get_backend() == "fused"
        assert get_backend() == "reference"
    assert get_backend() == "auto"


def test_backend_restores_on_error():
    with pytest.raises(KeyError), backend("reference"):
        raise KeyError
    assert get_backend() == "auto"


def test_backend_rejects_unknown_name():
    with pytest.raises(ValueError, match="backend must be one of"), backend("cuda"):
        pass


def test_backend_is_thread_local():
    seen = []
    with backend("reference"):
        worker = threading.Thread(target=lambda: seen.append(get_backend()))
        worker.start()
        worker.join()
    assert seen == ["auto"]


def test_use_fused_reference_and_auto_on_cpu():
    x = torch.zeros(2, 3)
    with backend("reference"):
        assert not use_fused(x)
    assert not use_fused(x)  # auto: CPU tensors take the reference path
    assert not use_fused(x.double())


def test_use_fused_without_triton(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(backend_mod, "triton_available", lambda: False)
    x = torch.zeros(2, 3)
    assert not use_fused(x)
    for name in ("fused", "triton"):
        with backend(name), pytest.raises(RuntimeError, match="Triton is not installed"):
            use_fused(x)


@needs_triton
def test_use_fused_forced(monkeypatch: pytest.MonkeyPatch):
    x = torch.zeros(2, 3)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with backend("triton"):
        assert use_fused(x, None, x)
        with pytest.raises(RuntimeError, match="float32"):  # no silent fallback
            use_fused(x.double(), x)
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with backend("triton"), pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            use_fused(x)


def test_package_imports_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None; sys.modules['triton.language'] = None\n"
        "from pyro_gpn.moments import backend as b, fused as f\n"
        "import torch\n"
        "assert not b.triton_available()\n"
        "x = torch.zeros(2, 3)\n"
        "assert not b.use_fused(x)\n"
        "try:\n"
        "    f.fused_response_mean(x, None, torch.zeros(1, 4), torch.ones(1), torch.zeros(1, 4))\n"
        "except RuntimeError as err:\n"
        "    assert 'Triton' in str(err)\n"
        "else:\n"
        "    raise AssertionError('expected RuntimeError')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------
# fused kernels: fast subset
# ---------------------------------------------------------------------------------------------
@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize(
    "S, N, R, shared, zero_var",
    [(5, 3, 5, False, False), (37, 2, 14, True, False), (1, 3, 17, False, True)],
)
def test_meanvar_matches_reference(device, S, N, R, shared, zero_var):
    problem = make_problem(S, N, R, shared=shared, zero_var=zero_var, seed=S + N + R)
    check_against_reference(problem, device=device)


@pytest.mark.triton
@needs_triton
def test_meanvar_clamped_variance_and_no_noise(device):
    problem = make_problem(6, 3, 4, clamp=True, seed=3)
    check_against_reference(problem, device=device)
    problem = make_problem(6, 3, 4, noise=False, seed=4)
    check_against_reference(problem, device=device)


@pytest.mark.triton
@needs_triton
def test_mean_matches_reference(device):
    from pyro_gpn.moments.fused import fused_response_mean

    mu, v, V, lam, beta, C, _ = make_problem(7, 3, 6, seed=5)
    for var in (v, None):
        ref_in = _leaves((mu, var, V, lam, beta), torch.float64, "cpu")
        fus_in = _leaves((mu, var, V, lam, beta), torch.float32, device)
        ref_v = torch.zeros_like(ref_in[0]) if var is None else ref_in[1]
        ref = reference_moments(ref_in[0], ref_v, *ref_in[2:], C, None, full=False)[0]
        out = fused_response_mean(*fus_in)
        assert_close(out, ref, "mean")
        up = torch.randn(ref.shape, dtype=torch.float64)
        ref_g = _grads([ref], [up], ref_in)
        fus_g = _grads([out], [up.to(device=device, dtype=torch.float32)], fus_in)
        for name, a, e in zip(("mu", "v", "V", "lam", "beta"), fus_g, ref_g, strict=True):
            if e is not None:
                assert_close(a, e, f"d/d {name}", rtol=5e-4, atol=5e-5)


@pytest.mark.triton
@needs_triton
def test_fused_rejects_bad_input(device):
    from pyro_gpn.moments.fused import fused_response_meanvar

    mu, v, V, lam, beta, C, noise = (t.to(device) for t in make_problem(2, 3, 4, seed=7))
    fused_response_meanvar(mu, v, V, lam, beta, C, noise)  # float64 is a kernel dtype
    with pytest.raises(TypeError, match="C must be torch.float64 like mu"):
        fused_response_meanvar(mu, v, V, lam, beta, C.float(), noise)
    with pytest.raises(TypeError, match="float32 or float64"):
        fused_response_meanvar(mu.half(), v, V, lam, beta, C, noise)
    mu, v, V, lam, beta, C, noise = (t.float() for t in (mu, v, V, lam, beta, C, noise))
    with pytest.raises(ValueError, match="beta"):
        fused_response_meanvar(mu, v, V, lam, beta[:, :3], C, noise)
    with pytest.raises(ValueError, match="v must have shape"):
        fused_response_meanvar(mu, v[:1], V, lam, beta, C, noise)


@pytest.mark.triton
@needs_triton
def test_matches_response_moments(device):
    """Same values and gradients as the library's reference path (response_moments)."""
    propagate = pytest.importorskip("pyro_gpn.moments.propagate")
    if not hasattr(propagate, "response_moments"):
        pytest.skip("response_moments not available")
    from pyro_gpn.moments.fused import fused_response_meanvar
    from pyro_gpn.moments.gaussian import Moments

    problem = make_problem(3, 4, 6, seed=8)
    ref_in = _leaves(problem, torch.float64, "cpu")
    fus_in = _leaves(problem, torch.float32, device)
    mu, second, V, lam, beta, C, noise = ref_in
    C_sym = 0.5 * (C + C.mT)  # response_moments expects a symmetric C
    acts = Moments(mu, var=second)
    with backend("reference"):
        out_ref = propagate.response_moments(acts, V, lam, beta, C_sym, noise, mode="meanvar")
    ref = (out_ref.mean, out_ref.var)
    out = fused_response_meanvar(*fus_in)
    assert_close(out[0], ref[0], "mean")
    assert_close(out[1], ref[1], "var")
    g = torch.Generator().manual_seed(9)
    upstream = [torch.randn(r.shape, generator=g, dtype=torch.float64) for r in ref]
    ref_g = _grads(ref, upstream, ref_in)
    fus_g = _grads(out, [u.to(device=device, dtype=torch.float32) for u in upstream], fus_in)
    for name, a, e in zip(NAMES, fus_g, ref_g, strict=True):
        assert_close(a, e, f"d/d {name}", rtol=5e-4, atol=5e-5)


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("programs", [1, 1000])
def test_backward_partial_sums(device, monkeypatch: pytest.MonkeyPatch, programs):
    """One program looping over all sample blocks, or one partial sum per block: same grads."""
    from pyro_gpn.moments import fused

    monkeypatch.setattr(fused, "_target_programs", lambda _device: programs)
    check_against_reference(make_problem(40, 2, 14, seed=12), device=device)


@pytest.mark.triton
@needs_triton
def test_empty_batch(device):
    from pyro_gpn.moments.fused import fused_response_meanvar

    mu, v, V, lam, beta, C, noise = _leaves(make_problem(0, 3, 4), torch.float32, device)
    mean, var = fused_response_meanvar(mu, v, V, lam, beta, C, noise)
    assert mean.shape == var.shape == (0, 3)
    (mean.sum() + var.sum()).backward()
    assert V.grad.abs().sum() == 0 and noise.grad.abs().sum() == 0


def _compile_all_for_sm90() -> None:
    """Compile every kernel for sm_90 with Triton's real compiler (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pyro_gpn.moments import fused

    tl = fused.tl if fused.tl is not None else importlib.import_module("triton.language")
    cases = []
    for fp, acc in (("fp32", tl.float32), ("fp64", tl.float64)):  # mean/variance: both dtypes
        cases += [
            ("_meanvar_fwd_kernel", fp, {"WITH_VAR": True, "HAS_NOISE": True, "BLOCK_S": 16}),
            ("_meanvar_fwd_kernel", fp, {"WITH_VAR": False, "HAS_NOISE": False, "BLOCK_S": 128}),
            ("_meanvar_bwd_kernel", fp, {"WITH_VAR": True, "BLOCK_S": 8, "ACC": acc}),
            ("_meanvar_bwd_kernel", fp, {"WITH_VAR": False, "BLOCK_S": 128, "ACC": acc}),
        ]
    for name, fp, consts in cases:
        kernel = fused._jit(name)
        consts = {**consts, "BLOCK_R": 16}
        signature = {
            arg: "constexpr" if arg in consts else f"*{fp}" if arg.endswith("_ptr") else "i32"
            for arg in kernel.arg_names
        }
        source = ASTSource(kernel, signature, constexprs=consts)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
        assert compiled.asm.get("cubin"), (name, fp)


@pytest.mark.slow
@pytest.mark.triton
@needs_triton
def test_kernels_compile_for_gpu():
    """The interpreter accepts more than the compiler: compile each kernel for an H100."""
    spec = importlib.util.find_spec("triton")  # not imported here: see `device`
    if not (pathlib.Path(spec.origin).parent / "backends" / "nvidia").is_dir():
        pytest.skip("triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "from tests.moments.test_fused import _compile_all_for_sm90 as f; f()"
    root = pathlib.Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root
    )
    assert result.returncode == 0, result.stderr[-4000:]


# ---------------------------------------------------------------------------------------------
# fused kernels: broader sweep
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("R", [1, 5, 8, 14, 17])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("S, N", [(1, 1), (1, 5), (19, 3), (70, 7)])
def test_meanvar_sweep(device, S, N, R, shared):
    for zero_var in (False, True):
        problem = make_problem(S, N, R, shared=shared, zero_var=zero_var, seed=S * N + R)
        check_against_reference(problem, device=device)


@needs_triton
@pytest.mark.triton
@pytest.mark.parametrize("compute_dtype", [None, torch.float64])
@pytest.mark.parametrize("mode", ["mean", "meanvar", "cov"])
def test_response_moments_dispatches_to_the_kernels(device, mode, compute_dtype, monkeypatch):
    """``backend("triton")`` routes a whole GPN layer through the kernels, with equal results,
    in float32 and in the layers' default float64 algebra (which, in ``"cov"`` mode, a forced
    ``"triton"`` used to refuse)."""
    import pyro_gpn.moments.fused as fused_mod
    from pyro_gpn import GPNLayer, Moments

    calls = []
    for name in ("fused_response_mean", "fused_response_meanvar"):
        original = getattr(fused_mod, name)
        monkeypatch.setattr(
            fused_mod, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a)
        )
    torch.manual_seed(0)
    layer = GPNLayer(3, 5, num_inducing=6, compute_dtype=compute_dtype).to(device)
    mean = torch.rand(4, 3, device=device)
    a = torch.randn(4, 3, 3, device=device) / 3
    cov = 0.05 * a @ a.mT + 0.01 * torch.eye(3, device=device)

    def run():
        layer.zero_grad()
        out = layer.propagate(Moments(mean, cov=cov), mode)
        total = out.mean.sum() + (0 if out.is_deterministic else out.covariance.sum())
        total.backward()
        return out.mean.detach(), out.covariance.detach(), layer.targets.grad.clone()

    with backend("reference"):
        expected = run()
    with backend("triton"):
        got = run()
    assert calls, "the fused kernels were not called"
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=2e-4, atol=2e-5)


# ---------------------------------------------------------------------------------------------
# float64 kernels and the narrow regime (the Triton path of response_moments)
# ---------------------------------------------------------------------------------------------
@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("S, N, R, shared", [(19, 3, 14, False), (5, 4, 6, True)])
def test_float64_kernels_match_the_formulas(device, S, N, R, shared):
    """The mean and mean/variance kernels in float64: values and gradients to ~1e-12."""
    from pyro_gpn.moments.fused import fused_response_mean, fused_response_meanvar

    problem = make_problem(S, N, R, shared=shared, seed=S + R)
    ref_in = _leaves(problem, torch.float64, "cpu")
    fus_in = _leaves(problem, torch.float64, device)
    out = fused_response_meanvar(*fus_in)
    ref = reference_moments(*ref_in, full=False)
    assert out[0].dtype == out[1].dtype == torch.float64
    close = {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(out[0].cpu(), ref[0].detach(), **close)
    torch.testing.assert_close(out[1].cpu(), ref[1].detach(), **close)
    g = torch.Generator().manual_seed(2)
    upstream = [torch.randn(r.shape, generator=g, dtype=torch.float64) for r in ref]
    ref_g = _grads(ref, upstream, ref_in)
    fus_g = _grads(out, [u.to(device) for u in upstream], fus_in)
    for name, a, e in zip(NAMES, fus_g, ref_g, strict=True):
        torch.testing.assert_close(a.cpu(), e, **close, msg=name)
    mean = fused_response_mean(*fus_in[:5])
    torch.testing.assert_close(mean.cpu(), ref[0].detach(), **close)


def _ill_conditioned_layer(dtype: torch.dtype, device):
    """A unit in the regime where the closed-form variance loses its digits: lengthscale 2
    against an inducing spacing of 0.31 (ratio 6.5), target variances 1e-6, smooth targets;
    narrow activations (std 0.01-0.05) inside and outside the grid, and broad ones."""
    from pyro_gpn.moments.weights import virtual_observation_weights

    R = 14
    V = torch.linspace(-2, 2, R, dtype=torch.float64).reshape(1, R)
    lam = torch.tensor([2.0], dtype=torch.float64)
    U = torch.sin(V)
    kappa, beta = virtual_observation_weights(V, U, torch.full_like(V, 1e-6), lam)
    mean = torch.linspace(-3, 3, 13, dtype=torch.float64).reshape(-1, 1)
    std = torch.tensor([0.01, 0.05, 5.0], dtype=torch.float64)  # 5.0: broad (> 1.25 lambda)
    mean, var = (mean * torch.ones(1, 3)).reshape(-1, 1), (std**2).repeat(13).reshape(-1, 1)
    put = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    return put(mean), put(var), put(V), put(lam), put(beta), put(0.5 * (kappa + kappa.mT))


@pytest.mark.triton
@needs_triton
def test_triton_path_applies_the_narrow_regime(device):
    """``backend("triton")`` in meanvar gives the reference path's stable variance (float64) in
    the regime where the kernels' closed form alone is wrong, with the same gradients."""
    from pyro_gpn.moments.fused import fused_response_meanvar
    from pyro_gpn.moments.gaussian import Moments
    from pyro_gpn.moments.propagate import response_moments

    mean, var, V, lam, beta, C = _ill_conditioned_layer(torch.float64, device)
    noise = None  # the noise-free variance: ~1e-6 near the targets, where the digits are lost
    results = {}
    for name in ("reference", "triton"):
        m = mean.clone().requires_grad_()
        b = beta.clone().requires_grad_()
        with backend(name):
            out = response_moments(Moments(m, var=var), V, lam, b, C, noise, mode="meanvar")
        (out.mean.sum() + out.var.sum()).backward()
        results[name] = (out.mean.detach(), out.var.detach(), m.grad, b.grad)
    ref_mean, ref_var, ref_dm, ref_db = results["reference"]
    tri_mean, tri_var, tri_dm, tri_db = results["triton"]
    torch.testing.assert_close(tri_mean, ref_mean, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(tri_var, ref_var, rtol=1e-7, atol=1e-12)
    torch.testing.assert_close(tri_dm, ref_dm, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(tri_db, ref_db, rtol=1e-6, atol=1e-9 * ref_db.abs().max())
    # the kernels' closed form alone is far off here: the rule is what makes them agree
    _, closed = fused_response_meanvar(mean, var, V, lam, beta, C, noise)
    narrow = var.squeeze(-1) < 1.0
    rel = ((closed - ref_var).abs() / ref_var).squeeze(-1)
    assert rel[narrow].max() > 1e-4
    assert rel[~narrow].max() < 1e-6  # broad rows: the closed form is accurate and is kept


# ---------------------------------------------------------------------------------------------
# "cov" mode on the Triton path: the kernels' mean and variance, Mehler's series off the diagonal
# ---------------------------------------------------------------------------------------------
#: (lengthscales, activation means, correlation, activation variances, target variance,
#: ill-conditioned): issue 13's NaN cases of the old closed-form covariance (means far outside
#: the inducing range, correlations near +-1), a broad pair correlated at 0.999 (the series'
#: hard case: many terms, pairs left to ``Lambda``), and ill-conditioned units (lengthscale 2
#: against a spacing of 0.31, target variances 1e-6, smooth targets) with narrow activations,
#: whose variance the narrow regime's Gauss-Hermite rows give
COV_CASES = [
    ((0.05, 0.2), (-6.0, 6.0), -0.99, (0.01, 1.0, 9.0), 0.01, False),
    ((0.4, 0.4), (-6.0, -6.0), 0.99, (0.01, 1.0, 9.0), 0.01, False),
    ((0.4, 0.6), (0.3, -0.5), 0.999, (0.01, 1.0, 9.0), 0.01, False),
    ((2.0, 2.0), (0.3, -0.5), 0.5, (1e-4, 2.5e-3, 25.0), 1e-6, True),
]


def _correlated_pair(lengthscales, means, rho, variances, target_var, ill, dtype, device):
    """Two units on 14 equidistant points in ``[-2, 2]`` (random targets, or ``sin`` where
    ``ill``) and three samples of activations with ``variances`` and correlation ``rho``."""
    from pyro_gpn.moments.weights import virtual_observation_weights

    g = torch.Generator().manual_seed(21)
    V = torch.linspace(-2, 2, 14, dtype=torch.float64).expand(2, 14)
    U = torch.sin(V) if ill else torch.randn(2, 14, generator=g, dtype=torch.float64)
    lam = torch.tensor(lengthscales, dtype=torch.float64)
    kappa, beta = virtual_observation_weights(V, U, torch.full_like(V, target_var), lam)
    var = torch.tensor(variances, dtype=torch.float64)
    corr = torch.tensor([[1.0, rho], [rho, 1.0]], dtype=torch.float64)
    Sig = var[:, None, None] * corr
    mean = torch.tensor(means, dtype=torch.float64).expand(3, 2)
    noise = torch.zeros(2) if ill else torch.tensor([1e-3, 2e-3])  # ill: the noise-free variance
    put = lambda t: t.to(device=device, dtype=dtype).contiguous()  # noqa: E731
    return [put(t) for t in (mean, Sig, V, lam, beta, 0.5 * (kappa + kappa.mT), noise)]


def _cov_and_grads(name, mean, Sig, V, lam, beta, C, noise):
    from pyro_gpn.moments.gaussian import Moments
    from pyro_gpn.moments.propagate import response_moments

    leaves = [t.clone().requires_grad_() for t in (mean, Sig, lam, beta, C, noise)]
    m, S, lm, b, c, nz = leaves
    with backend(name):
        out = response_moments(Moments(m, cov=S), V, lm, b, c, nz, mode="cov")
    g = torch.Generator().manual_seed(3)
    weights = torch.randn(out.cov.shape, generator=g, dtype=torch.float64).to(out.cov)
    ((out.cov * weights).sum() + out.mean.sum()).backward()
    grads = [t.grad for t in leaves]
    grads[1] = 0.5 * (grads[1] + grads[1].mT)  # a function of a symmetric Sig
    return out.mean.detach(), out.cov.detach(), grads


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", COV_CASES)
def test_triton_cov_is_the_reference_path(device, case):
    """``backend("triton")`` in ``"cov"`` mode: the kernels' mean and variance, the narrow
    regime's rows and Mehler's series, with the reference path's values and gradients in
    float64 (to 1e-9), finite in float32 as well; the float64 covariance of the well-conditioned
    cases also against the paper's ``Lambda`` contraction written out here
    (:func:`reference_moments`, materialised in float64), to 1e-8 of ``sd f_n sd f_m``. Before,
    a forced ``"triton"`` refused float64 here and ran a float32 closed form of ``Lambda``
    without the narrow regime."""
    import pyro_gpn.moments.fused as fused_mod
    from pyro_gpn.moments import propagate

    calls, node_rows = [], []
    kernel, rows = fused_mod.fused_response_meanvar, propagate.node_variance_rows
    ill = case[-1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fused_mod, "fused_response_meanvar", lambda *a: calls.append(1) or kernel(*a))
        patch.setattr(
            propagate,
            "node_variance_rows",
            lambda *a: node_rows.append(int(a[1].sum())) or rows(*a),
        )
        problem = _correlated_pair(*case, torch.float64, device)
        ref = _cov_and_grads("reference", *problem)
        assert not calls
        got = _cov_and_grads("triton", *problem)
        assert calls, "the Triton kernels were not called"
        # the ill-conditioned units' narrow rows go through Gauss-Hermite on both paths
        assert (len(node_rows) == 2 and node_rows[0] == node_rows[1] > 0) if ill else not node_rows
        calls.clear()
        got32 = _cov_and_grads("triton", *_correlated_pair(*case, torch.float32, device))
        assert calls, "the Triton kernels were not called in float32"
    if not ill:  # the written-out Lambda loses the digits of ill-conditioned units itself
        mean, Sig, V, lam, beta, C, noise = problem
        written_out = reference_moments(mean, Sig, V, lam, beta, C, noise, full=True)[1]
        sd = torch.diagonal(ref[1], dim1=-2, dim2=-1).sqrt()
        scale = (sd.unsqueeze(-1) * sd.unsqueeze(-2)).cpu()
        assert ((ref[1].cpu() - written_out.cpu()).abs() <= 1e-8 * scale).all()
    flat = lambda r: [r[0], r[1], *r[2]]  # noqa: E731
    for expected, actual, actual32 in zip(flat(ref), flat(got), flat(got32), strict=True):
        assert torch.isfinite(actual).all() and torch.isfinite(actual32).all()
        size = float(expected.abs().max())
        torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-12 * size)
    # float32: the closed-form variance of broad rows keeps only a few digits there (the
    # |beta|^2-sized terms cancel, on every path alike; of ill-conditioned units, none to speak
    # of: why the layers compute in float64, docs/results/accuracy.md)
    if not ill:
        torch.testing.assert_close(
            got32[1].double(), ref[1], rtol=0.05, atol=0.05 * float(ref[1].abs().max())
        )
