"""Fused CPU kernels (:mod:`pyro_gpn.moments.cpu_kernels`) against the float64 reference path.

Every kernel is compared, values and gradients of every input, with
:func:`pyro_gpn.moments.propagate.response_moments` / ``virtual_observation_weights`` on the
reference backend in float64, over odd sizes, shared (layer-wide) parameters and the extreme
regimes (activations far outside the inducing range, tiny and zero input variances, tiny target
variances, short and long lengthscales), by ``gradcheck`` in float64, and the layer means and
variances against Gauss-Hermite quadrature of the conditional moments (independent of the
closed form).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from pyro_gpn import settings
from pyro_gpn.moments.backend import backend, numba_available
from pyro_gpn.moments.gaussian import Moments
from pyro_gpn.moments.propagate import response_moments, virtual_observation_weights
from tests.gradients import variance_slope_at_zero

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba is not installed")

if numba_available():
    from pyro_gpn.moments.cpu_kernels import (
        cpu_response_mean,
        cpu_response_meanvar,
        cpu_virtual_observation_weights,
    )

F64 = torch.float64


def make(
    S: int,
    N: int,
    R: int,
    shared: bool = False,
    seed: int = 0,
    lengthscale: float = 0.4,
    target_var: float = 0.05,
    mu_scale: float = 1.5,
    v_scale: float = 0.3,
    dtype: torch.dtype = F64,
):
    """Leaf tensors ``mu, v, V, U, Svar, lam, noise`` of one layer (params ``[1, ...]`` if
    ``shared``)."""
    g = torch.Generator().manual_seed(seed)
    G = 1 if shared else N
    V = torch.linspace(-2, 2, R, dtype=F64).expand(G, -1).clone()
    mu = mu_scale * torch.randn(S, N, generator=g, dtype=F64)
    v = v_scale * torch.rand(S, N, generator=g, dtype=F64)
    U = torch.randn(G, R, generator=g, dtype=F64)
    Svar = target_var * (0.5 + torch.rand(G, R, generator=g, dtype=F64))
    lam = lengthscale * (0.8 + 0.4 * torch.rand(G, generator=g, dtype=F64))
    noise = 0.01 + 0.01 * torch.rand(G, generator=g, dtype=F64)
    out = [mu, v, V, U, Svar, lam, noise]
    return [t.to(dtype).requires_grad_(i != 2) for i, t in enumerate(out)]


def run(leaves, fast: bool, mode: str = "meanvar", jitter: float = 0.0):
    """Outputs and the gradients of a fixed random projection of them w.r.t. the leaves."""
    mu, v, V, U, Svar, lam, noise = leaves
    if fast:
        kappa, beta = cpu_virtual_observation_weights(V, U, Svar, lam, jitter)
        if mode == "mean":
            outs = (cpu_response_mean(mu, v, V, lam, beta),)
        else:
            outs = cpu_response_meanvar(mu, v, V, lam, beta, kappa, noise)
    else:
        with backend("reference"):
            kappa, beta = virtual_observation_weights(V, U, Svar, lam, jitter)
            acts = Moments(mu, var=v, validate=False)
            o = response_moments(acts, V, lam, beta, kappa, noise, mode, equidistant=True)
        outs = (o.mean,) if mode == "mean" else (o.mean, o.var)
    return projected_grads(outs, leaves)


def projected_grads(outs, leaves):
    """The outputs (detached) and the gradients of a fixed random projection of them w.r.t.
    the leaves that require gradients (``None`` where a leaf is unused)."""
    g = torch.Generator().manual_seed(123)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=F64).to(o.dtype)).sum() for o in outs)
    wrt = [t for t in leaves if t.requires_grad]
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    return [o.detach() for o in outs], grads


def assert_close_all(got, want, rtol=1e-9, atol=1e-11, what=""):
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        if e is None:
            assert a is None or torch.count_nonzero(a) == 0, f"{what}[{i}]"
            continue
        scale = e.abs().max().item()
        torch.testing.assert_close(
            a.to(F64),
            e,
            rtol=rtol,
            atol=atol * max(scale, 1.0),
            msg=lambda m, i=i: f"{what}[{i}] {m}",
        )


@pytest.mark.parametrize("mode", ["mean", "meanvar"])
@pytest.mark.parametrize(
    "S,N,R,shared", [(1, 1, 2, False), (7, 3, 5, False), (13, 5, 14, False), (9, 4, 14, True)]
)
def test_matches_reference(S, N, R, shared, mode):
    leaves = make(S, N, R, shared, seed=S + N + R)
    out_f, g_f = run(leaves, True, mode)
    out_r, g_r = run(leaves, False, mode)
    assert_close_all(out_f, out_r, what="outputs")
    assert_close_all(g_f, g_r, what="grads")


@pytest.mark.parametrize(
    "regime",
    [
        {"mu_scale": 40.0},  # activations far outside the inducing range
        {"v_scale": 0.0},  # deterministic activations (v = 0 exactly)
        {"v_scale": 1e-9},  # tiny input variances
        {"v_scale": 25.0},  # input variance much wider than the range
        {"lengthscale": 0.03},  # short lengthscale: narrow, well separated Gaussians
        # long lengthscale, small target variance: K + S ill-conditioned, |beta|^2 ~ 1e4..1e8
        # amplifies rounding in both implementations alike (the cancellation of issue 13)
        {"lengthscale": 1.0, "target_var": 1e-4, "tol": 1e4},
        {"lengthscale": 0.4, "target_var": 1e-6, "tol": 1e4},
    ],
)
def test_extreme_regimes_match_reference(regime):
    regime = dict(regime)
    tol = regime.pop("tol", 1.0)
    leaves = make(23, 4, 14, seed=3, **regime)
    out_f, g_f = run(leaves, True, "meanvar", jitter=1e-9)
    out_r, g_r = run(leaves, False, "meanvar", jitter=1e-9)
    for t in (*out_f, *g_f):
        assert torch.isfinite(t).all()
    # tolerances relative to the largest term of the cancelling sum (|beta|^2 scale)
    assert_close_all(out_f, out_r, rtol=1e-7 * tol, atol=1e-9 * tol, what="outputs")
    assert_close_all(g_f, g_r, rtol=1e-6 * tol, atol=1e-8 * tol, what="grads")


def test_float32_inputs_match_float64_reference():
    leaves64 = make(31, 6, 14, seed=5)
    leaves32 = [t.detach().float().requires_grad_(t.requires_grad) for t in leaves64]
    out_f, g_f = run(leaves32, True)
    out_r, g_r = run(leaves64, False)
    assert all(o.dtype == torch.float32 for o in out_f)
    assert all(g.dtype == torch.float32 for g in g_f)
    assert_close_all(out_f, out_r, rtol=2e-5, atol=2e-6, what="outputs")
    assert_close_all(g_f, g_r, rtol=2e-4, atol=2e-5, what="grads")


def test_gradcheck_meanvar_and_weights():
    mu, v, V, U, Svar, lam, noise = make(5, 3, 6, seed=9)
    C = torch.randn(3, 6, 6, dtype=F64)
    C = (0.1 * (C + C.mT)).requires_grad_()
    beta = torch.randn(3, 6, dtype=F64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda *a: cpu_response_meanvar(*a[:2], V, *a[2:]), (mu, v, lam, beta, C, noise)
    )
    torch.autograd.gradcheck(
        lambda *a: cpu_response_mean(a[0], a[1], V, a[2], a[3]), (mu, v, lam, beta)
    )
    torch.autograd.gradcheck(
        lambda *a: cpu_virtual_observation_weights(V, *a, jitter=1e-6), (U, Svar, lam)
    )


def test_gradcheck_shared_parameters():
    mu, v, V, U, Svar, lam, noise = make(4, 3, 5, shared=True, seed=2)
    torch.autograd.gradcheck(
        lambda mu, v, U, Svar, lam, noise: cpu_response_meanvar(
            mu, v, V, lam, *cpu_virtual_observation_weights(V, U, Svar, lam)[::-1], noise
        ),
        (mu, v, U, Svar, lam, noise),
    )


def test_deterministic_mean_without_variance():
    mu, _, V, U, Svar, lam, _ = make(6, 3, 7, seed=4)
    _, beta = cpu_virtual_observation_weights(V, U, Svar, lam)
    got = cpu_response_mean(mu, None, V, lam, beta)
    with backend("reference"):
        want = response_moments(Moments(mu), V, lam, beta, None, None, "mean").mean
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got.sum().backward()
    assert mu.grad is not None and torch.isfinite(mu.grad).all()


def test_nonfinite_and_huge_activations_do_not_crash():
    _, _, V, U, Svar, lam, noise = make(1, 2, 6, seed=1)
    kappa, beta = cpu_virtual_observation_weights(V, U, Svar, lam)
    mu = torch.tensor([[float("nan"), 1e300], [-1e300, float("inf")]], dtype=F64)
    v = torch.full_like(mu, 0.1)
    mean, var = cpu_response_meanvar(mu, v, V, lam, beta, kappa, noise)
    assert torch.isnan(mean[0, 0]) and torch.isnan(var[0, 0])
    assert mean[0, 1] == 0 and mean[1, 0] == 0  # exp underflows; no overflow, no bad index


def test_not_positive_definite_raises():
    _, _, V, U, _, lam, _ = make(1, 2, 6, seed=1)
    with pytest.raises(torch.linalg.LinAlgError, match="positive definite"):
        cpu_virtual_observation_weights(V, U, torch.full_like(U, -10.0), lam)
    # negative target variances are refused up front while validation is on; without the value
    # checks the dispatching function falls back to the reference path, which raises its own
    # error
    with pytest.raises(ValueError, match="target_variances must be non-negative"):
        virtual_observation_weights(V, U, torch.full_like(U, -10.0), lam)
    with settings.validation(False), pytest.raises(ValueError, match="not positive definite"):
        virtual_observation_weights(V, U, torch.full_like(U, -10.0), lam)


def _hermite_moments(mu, v, V, lam, beta, C, noise, nodes=120):
    """Independent check: E[m(a)], Var[f(a)] + noise by Gauss-Hermite quadrature over a."""
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    a = mu[..., None] + np.sqrt(v)[..., None] * x  # [S, N, Q]
    alpha = np.exp(-0.5 * (a[..., None] - V[None, :, None, :]) ** 2 / lam[None, :, None, None] ** 2)
    m = np.einsum("snqr,nr->snq", alpha, beta)
    cvar = 1 - np.einsum("snqr,nrt,snqt->snq", alpha, C, alpha)
    mean = (m * w).sum(-1)
    var = (cvar * w).sum(-1) + (m**2 * w).sum(-1) - mean**2 + noise
    return mean, var


@pytest.mark.parametrize(
    "lengthscale,target_var,rtol",
    # 24 Gauss-Hermite nodes (the reference's rule) are good to ~1e-6 at long lengthscales;
    # the closed form (broad regime) loses digits when K + S is ill-conditioned (issue 13)
    [(0.4, 0.05, 1e-7), (0.8, 1e-2, 2e-6), (0.2, 1e-3, 1e-4)],
)
def test_against_quadrature(lengthscale, target_var, rtol):
    mu, v, V, U, Svar, lam, noise = [
        t.detach() for t in make(11, 3, 14, seed=7, lengthscale=lengthscale, target_var=target_var)
    ]
    kappa, beta = cpu_virtual_observation_weights(V, U, Svar, lam)
    mean, var = cpu_response_meanvar(mu, v, V, lam, beta, kappa, noise)
    qm, qv = _hermite_moments(*(t.numpy() for t in (mu, v, V, lam, beta, kappa, noise)))
    np.testing.assert_allclose(mean.numpy(), qm, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(var.numpy(), qv, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_give_identical_results(threads):
    leaves = make(17, 5, 14, seed=11)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ref = run(leaves, True)
        torch.set_num_threads(threads)
        got = run(leaves, True)
    finally:
        torch.set_num_threads(before)
    assert_close_all([*got[0], *got[1]], [*ref[0], *ref[1]], rtol=0, atol=0)


def test_vectorised_exponential_matches_math_exp():
    """The row kernels' block exponential (``_numba_kernels.vexp``): within 2 ulp of the
    library exponential over the exponents the progressions use (``<= 0``), 0 below
    ``exp(-708)`` and for ``-inf``, NaN for NaN."""
    import numba

    from pyro_gpn.moments import _numba_kernels as nk

    @numba.njit
    def apply(a):
        n = a.shape[0]
        out, tbuf, ebuf = np.empty(n), np.empty(n), np.empty(n, dtype=np.int64)
        nk.vexp(a, out, n, tbuf, ebuf)
        return out

    rng = np.random.default_rng(0)
    a = np.concatenate([-rng.random(5000) * 700, -rng.random(500) * 1e-6, -rng.random(50)])
    a = np.concatenate([a, [0.0, -0.0, -1e-300, -np.log(2) / 2, -707.9, -708.5, -1e4, -np.inf]])
    got = apply(a)
    want = np.exp(a)
    normal = want > np.exp(-708.0)
    np.testing.assert_allclose(got[normal], want[normal], rtol=4.5e-16, atol=0)
    assert np.all(got[~normal] <= want[~normal] + 1e-300) and got[-1] == 0 and got[-2] == 0
    assert np.isnan(apply(np.array([np.nan, -1.0])))[0]


def test_one_thread_never_starts_numbas_thread_pool():
    """With torch on one thread, no kernel call (also those of a variational layer, which pass
    an explicit ``C``) may launch Numba's thread pool: its OpenMP runtime raised torch's own
    thread count to 2 and slowed every later op of the process 2-100x."""
    code = (
        "import torch, numba\n"
        "torch.set_num_threads(1)\n"
        "from pyro_gpn.layers import VariationalGPNLayer, GPNLayer\n"
        "from pyro_gpn.moments.gaussian import Moments\n"
        "for cls in (GPNLayer, VariationalGPNLayer):\n"
        "    layer = cls(5, 4)\n"
        "    out = layer(Moments(torch.randn(16, 5), var=torch.rand(16, 5)))\n"
        "    (out.mean.sum() + out.var.sum()).backward()\n"
        "assert torch.get_num_threads() == 1, torch.get_num_threads()\n"
        "try:\n"
        "    numba.threading_layer()\n"
        "except ValueError:\n"
        "    print('pool not started')\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pool not started" in done.stdout


# ---------------------------------------------------------------------------------------------
# deterministic activations (v = 0): the kernels' one-progression rows (deterministic_row)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "regime",
    [
        {},
        {"mu_scale": 40.0},  # far outside the inducing range
        {"mu_scale": 30.0, "lengthscale": 5.0},  # far outside, Gaussians not underflowed
        {"lengthscale": 0.05},  # short: lambda / h = 0.16
        # ill-conditioned K + S: the closed form 1 - tr[(C - beta beta^T) Omega] - m^2 cancels
        # terms of size |beta|^2; the one-node rule does not
        {"lengthscale": 2.0, "target_var": 1e-6},
        {"lengthscale": 5.0, "target_var": 1e-6},
    ],
)
def test_deterministic_rows_match_the_exact_conditional_variance(regime):
    """Against ``1 - alpha^T C alpha`` for the given ``C`` in extended precision (NumPy's long
    double, alpha from the same inputs): within the bound the layers rely on for the explicit
    ``C`` (``EXPLICIT_C_ERROR_FACTOR * eps * tr C``, ``quadrature.explicit_c_rows``)."""
    from pyro_gpn.moments.quadrature import EXPLICIT_C_ERROR_FACTOR

    mu, _, V, U, Svar, lam, noise = make(37, 5, 14, seed=11, **regime)
    v = torch.zeros_like(mu)
    kappa, beta = cpu_virtual_observation_weights(V, U, Svar, lam, 1e-9)
    mean, var = cpu_response_meanvar(mu, v, V, lam, beta, kappa, None)
    ld = np.longdouble
    mu_, V_, lam_ = (t.detach().numpy().astype(ld) for t in (mu, V, lam))
    alpha = np.exp(-0.5 * (mu_[..., None] - V_) ** 2 / lam_[:, None] ** 2)  # [S, N, R]
    C = kappa.detach().numpy().astype(ld)
    want_var = 1 - np.einsum("snr,nrt,snt->sn", alpha, C, alpha)
    eps = np.finfo(np.float64).eps
    # plus 32 eps: the rounding of 1 - q and of exponents up to ~400 (short lengthscales)
    bound = EXPLICIT_C_ERROR_FACTOR * eps * np.trace(C, axis1=1, axis2=2) + 32 * eps
    err = np.abs(var.detach().numpy().astype(ld) - want_var)
    assert (err <= bound).all(), float((err / bound).max())
    # the mean: a linear form in beta, to rounding of its terms (|beta| ~ 1e7 when ill-posed;
    # exponents of size ~400 far outside the range or at short lengthscales: 1e-13 relative)
    terms = alpha * beta.detach().numpy().astype(ld)[None]
    rel = np.abs(mean.detach().numpy() - terms.sum(-1)) / (np.abs(terms).sum(-1) + 1e-300)
    assert rel.max() < 1e-11


def test_deterministic_rows_match_reference_values_and_gradients():
    """Values and every gradient against the reference path (whose deterministic rows take the
    one-node rule too), on a unit set with lengthscales on both sides of the kernels' fallback
    (``h^2 / (4 lambda^2) > 300``: ``lambda < h / 34.6`` takes the general rows)."""
    # far outside the range at a long lengthscale the reference's closed form (kept where its
    # error bound allows: 1e-6) and the kernels' one node differ by more than rounding
    for regime, tol in (({}, 1.0), ({"mu_scale": 30.0, "lengthscale": 5.0}, 100.0)):
        leaves = make(29, 4, 14, seed=21, **regime)
        with torch.no_grad():
            leaves[1].zero_()  # v = 0
            leaves[5][0] = 0.006  # h = 4 / 13: h^2 / (4 lambda^2) = 657, the fallback
        out_f, g_f = run(leaves, True, jitter=1e-9)
        out_r, g_r = run(leaves, False, jitter=1e-9)
        assert_close_all(out_f, out_r, rtol=1e-11 * tol, atol=1e-13 * tol, what="outputs")
        assert_close_all(g_f, g_r, rtol=1e-9 * tol, atol=1e-11 * tol, what="grads")


def test_deterministic_variance_slope_against_autograd():
    """``d var / dv`` at ``v = 0``, the kernels' ``m'(x)^2 + s''(x) / 2`` and the reference's,
    against autograd's first and second derivatives of the mean function ``alpha^T beta`` and
    the conditional variance ``1 - alpha^T C alpha`` written out directly (a ``v`` derivative the
    one node's ``sqrt(v)`` does not give)."""
    mu, _, V, U, Svar, lam, noise = make(13, 3, 14, seed=5, lengthscale=0.6)
    kappa, beta = cpu_virtual_observation_weights(V, U, Svar, lam)
    kappa, beta, lam = kappa.detach(), beta.detach(), lam.detach()
    a = mu.detach()
    want = variance_slope_at_zero(a, V, lam, beta, kappa)
    assert float(want.abs().max()) > 0.1  # a slope that a dropped term would miss
    for fast in (True, False):
        v = torch.zeros_like(a, requires_grad=True)
        if fast:
            _, var = cpu_response_meanvar(a, v, V, lam, beta, kappa, None)
        else:
            with backend("reference"):
                var = response_moments(
                    Moments(a, var=v), V, lam, beta, kappa, None, "meanvar",
                    equidistant=True,
                ).var  # fmt: skip
        (dv,) = torch.autograd.grad(var.sum(), v)
        torch.testing.assert_close(dv, want, rtol=1e-9, atol=1e-10)


def test_deterministic_rows_gradcheck_and_float32():
    mu, _, V, U, Svar, lam, noise = make(6, 3, 7, seed=8)
    kappa, beta = cpu_virtual_observation_weights(V, U, Svar, lam)
    kappa, beta = kappa.detach().requires_grad_(), beta.detach().requires_grad_()
    zeros = torch.zeros_like(mu)
    torch.autograd.gradcheck(
        lambda *a: cpu_response_meanvar(a[0], zeros, V, *a[1:]), (mu, lam, beta, kappa, noise)
    )
    m32, v32 = cpu_response_meanvar(
        mu.float(), zeros.float(), V, lam.float(), beta.float(), kappa.float(), noise.float()
    )
    m64, v64 = cpu_response_meanvar(mu, zeros, V, lam, beta, kappa, noise)
    assert m32.dtype == v32.dtype == torch.float32
    torch.testing.assert_close(v32.double(), v64.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m32.double(), m64.detach(), rtol=1e-5, atol=1e-6)
    leaves64 = [t.detach().clone().requires_grad_() for t in (mu, lam, beta, kappa)]
    leaves32 = [t.detach().float().requires_grad_() for t in leaves64]
    grads = []
    for ls in (leaves64, leaves32):
        z = torch.zeros_like(ls[0])
        m, v = cpu_response_meanvar(ls[0], z, V, ls[1], ls[2], ls[3], noise.detach())
        (m.sum() + (v * v).sum()).backward()
        grads.append([t.grad for t in ls])
    for g64, g32 in zip(*grads, strict=True):
        assert g32.dtype == torch.float32
        torch.testing.assert_close(g32.double(), g64, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pattern", ["deterministic", "random", "gap", "alternate"])
def test_runs_of_equal_activations_match_reference(pattern):
    """Consecutive equal activations (a CNN's background: the kernels evaluate a run once and,
    for deterministic rows, accumulate its gradient once) against the reference, values and
    every gradient; the runs cross the kernels' blocks of 16 rows and alternate with other
    rows. ``gap``: a deterministic row, then another mean with a variance and deterministic
    (the backward may not reuse the first row's Gaussians for the third); ``alternate``: one
    mean, variances alternating between 0 and not (the forward may not copy across a changed
    variance)."""
    leaves = make(53, 3, 14, seed=31)
    with torch.no_grad():
        mu, v = leaves[0], leaves[1]
        for lo, hi in ((0, 5), (9, 30), (31, 33), (40, 53)):
            mu[lo:hi] = mu[lo]
            v[lo:hi] = v[lo]
        mu[12, 1] += 0.1  # a run broken in one unit only
        if pattern == "deterministic":
            v.zero_()
        elif pattern == "gap":
            v.zero_()
            # row 8 deterministic; rows 9, 10 one mean with v = 0.2, then 0: row 10 may not
            # take row 8's Gaussians
            v[9] = 0.2
        elif pattern == "alternate":
            v[9:30:2] = 0.0  # same mean, v alternating 0.3-ish and 0
    out_f, g_f = run(leaves, True, jitter=1e-9)
    out_r, g_r = run(leaves, False, jitter=1e-9)
    assert_close_all(out_f, out_r, rtol=1e-11, atol=1e-13, what="outputs")
    assert_close_all(g_f, g_r, rtol=1e-9, atol=1e-11, what="grads")
    assert (out_f[0][1:5] == out_f[0][0]).all()
    if pattern == "alternate":
        assert (out_f[1][9:29:2] != out_f[1][10:30:2]).all()


def test_the_kernels_refuse_shapes_they_would_read_past():
    """The compiled loops index every argument by the activations' units and ``V``'s ``R``: a
    wider ``beta`` read past its end (garbage, different on every call)."""
    g = torch.Generator().manual_seed(0)
    mu, v = torch.randn(4, 3, dtype=F64, generator=g), torch.rand(4, 3, dtype=F64, generator=g)
    V = torch.linspace(-2, 2, 5, dtype=F64).expand(3, 5).clone()
    lam, C = torch.full((3,), 0.5, dtype=F64), torch.eye(5, dtype=F64).expand(3, 5, 5)
    beta = torch.randn(3, 5, dtype=F64, generator=g)
    with pytest.raises(ValueError, match=r"beta must have shape \(3 \| 1, 5\)"):
        cpu_response_meanvar(mu, v, V, lam, torch.randn(3, 7, dtype=F64), C)
    with pytest.raises(ValueError, match="the 4 units of mu"):
        cpu_response_mean(torch.randn(4, 4, dtype=F64), None, V, lam, beta)
    with pytest.raises(ValueError, match="C must have shape"):
        cpu_response_meanvar(mu, v, V, lam, beta, C[:, :4, :4])
    with pytest.raises(ValueError, match="noise_var must have shape"):
        cpu_response_meanvar(mu, v, V, lam, beta, C, torch.ones(5, dtype=F64))
    with pytest.raises(ValueError, match="v must have shape"):
        cpu_response_meanvar(mu, v[:, :2], V, lam, beta, C)


# ---------------------------------------------------------------------------------------------
# mutation audit: branches the tests above did not reach
# ---------------------------------------------------------------------------------------------
def _reference_meanvar(mu, v, V, lam, beta, C, noise):
    with backend("reference"):
        out = response_moments(
            Moments(mu, var=v, validate=False), V, lam, beta, C, noise, "meanvar",
            equidistant=True,
        )  # fmt: skip
    return out.mean, out.var


def test_clamped_variances_carry_no_gradient():
    """Rows whose noise-free variance ``1 - tr[(C - beta beta^T) Omega] - mean^2`` is negative
    (a ``C`` too large for the activation: clamped at 0) get no gradient through it, general,
    narrow and deterministic rows alike, as the reference path's ``clamp_min``; the unclamped
    rows of the same units keep theirs."""
    mu, v, V, _, _, lam, noise = make(29, 4, 9, seed=13)
    g = torch.Generator().manual_seed(13)
    with torch.no_grad():
        v[::3] = 0.0  # deterministic rows among the others
        v[1::3] *= 1e-4  # narrow rows
    C = (4.0 * torch.eye(9, dtype=F64)).expand(4, 9, 9).clone().requires_grad_()
    beta = (0.3 * torch.randn(4, 9, generator=g, dtype=F64)).requires_grad_()
    leaves = [mu, v, lam, beta, C, noise]
    out_f, g_f = projected_grads(cpu_response_meanvar(mu, v, V, lam, beta, C, noise), leaves)
    out_r, g_r = projected_grads(_reference_meanvar(mu, v, V, lam, beta, C, noise), leaves)
    clamped = out_r[1] == noise.detach()
    for rows in (v == 0, (v > 0) & (v < 1e-4), v >= 1e-4):  # every kind of row is clamped
        assert (clamped & rows).any() and (~clamped & rows).any()
    assert_close_all(out_f, out_r, what="outputs")
    assert_close_all(g_f, g_r, what="grads")


def _quadrature_torch(mu, v, V, lam, beta, C, noise, nodes=100):
    """Output mean and variance by Gauss-Hermite quadrature (``nodes`` nodes) over
    ``a ~ N(mu, v)`` of the mean function ``alpha^T beta`` and the conditional variance
    ``1 - alpha^T C alpha`` written out in PyTorch: differentiable, independent of the closed
    form and of the kernels' node tiers."""
    z, w = np.polynomial.hermite_e.hermegauss(nodes)
    z, w = torch.tensor(z, dtype=F64), torch.tensor(w / w.sum(), dtype=F64)
    a = mu[..., None] + v.sqrt()[..., None] * z  # [S, N, Q]
    alpha = torch.exp(-0.5 * (a[..., None] - V[:, None, :]) ** 2 / lam[:, None, None] ** 2)
    m = (alpha * beta[:, None, :]).sum(-1)
    C = C.expand(mu.shape[1], -1, -1)
    s = 1 - torch.einsum("snqr,nrt,snqt->snq", alpha, C, alpha)
    mean = (w * m).sum(-1)
    return mean, (w * s).sum(-1) + (w * (m - mean[..., None]) ** 2).sum(-1) + noise


def _narrow_layer(shared: bool = False, lengthscale: float = 0.6, target_var: float = 1e-6):
    """A layer whose narrow rows take Gauss-Hermite (``K + S`` ill-conditioned, ``|beta|`` up
    to 2.5e5: the closed form's error bound fails on 47 and 48 of the 48 activations), each
    node tier's ``sqrt(v) / lambda`` in each unit (0.03 to 1.15), activations across the grid,
    each in two consecutive rows."""
    _, _, V, U, Svar, lam, noise = make(
        1, 3, 14, shared, seed=17, lengthscale=lengthscale, target_var=target_var
    )
    kappa, beta = cpu_virtual_observation_weights(V, U, Svar, lam, 1e-9)
    ratios = torch.tensor([0.03, 0.08, 0.15, 0.3, 0.6, 0.9, 1.05, 1.15], dtype=F64)
    offsets = torch.tensor([0.0, 0.05, 0.11], dtype=F64)
    mu = torch.linspace(-1.9, 1.9, 16, dtype=F64)[:, None] + offsets
    v = (ratios.repeat(2)[:, None] * lam.detach()) ** 2 * torch.ones(1, 3, dtype=F64)
    # every row twice: runs of equal rows copy their outputs and the path they took
    mu, v = mu.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
    leaves = [mu, v, lam.detach(), beta.detach(), kappa.detach(), noise.detach()]
    return V, [t.clone().requires_grad_() for t in leaves]


@pytest.mark.parametrize("shared", [False, True])
def test_narrow_rows_against_quadrature_with_gradients(shared):
    """The narrow rows' Gauss-Hermite variances (per-row node tiers, the spread of the mean
    function) and every gradient (``mu``, ``v``, ``lambda``, ``beta``, ``C``, noise) against
    autograd through 100-node quadrature written out in PyTorch."""
    V, leaves = _narrow_layer(shared)
    mu, v, lam, beta, C, noise = leaves
    out_f, g_f = projected_grads(cpu_response_meanvar(mu, v, V, lam, beta, C, noise), leaves)
    out_q, g_q = projected_grads(_quadrature_torch(mu, v, V, lam, beta, C, noise), leaves)
    # both carry the rounding of |beta|^2-sized terms (measured: 2e-7 of the largest gradient),
    # and the node tiers their error (measured: 1.3e-5 in the lengthscale's gradient)
    assert_close_all(out_f, out_q, rtol=1e-6, atol=1e-7, what="outputs")
    assert_close_all(g_f, g_q, rtol=5e-5, atol=2e-6, what="grads")
    # the variance's slopes in the activations element by element (measured: 3e-5), the rows
    # copied from their equal predecessors included (they take its path backward too: the
    # closed form's slopes are wrong by up to 1e-3 here)
    _, var = cpu_response_meanvar(mu, v, V, lam, beta, C, noise)
    slopes = torch.autograd.grad(var.sum(), (mu, v))
    want = torch.autograd.grad(_quadrature_torch(mu, v, V, lam, beta, C, noise)[1].sum(), (mu, v))
    for got, expected in zip(slopes, want, strict=True):
        torch.testing.assert_close(got, expected, rtol=2e-4, atol=0)


def test_one_node_slope_below_the_deterministic_rows_lengthscale():
    """``d var / dv`` at ``v = 0`` in a unit too short for the deterministic rows
    (``lambda < h / 34.6``: the general rows' one Gauss-Hermite node, which carries the
    slope ``m'(x)^2 + s''(x) / 2`` explicitly), against autograd's derivatives of the mean
    function and the conditional variance written out. The activations sit where
    ``s(x) = 1 - alpha^T C alpha`` is a few 1e-9 (``C = (1 + eps) I``), so that the closed
    form's error bound fails and the node is taken, and ``s''`` has its ``d^2`` term."""
    R, lam = 14, torch.tensor([0.008, 0.007], dtype=F64)  # h = 4 / 13: h / 34.6 = 0.0089
    V = torch.linspace(-2, 2, R, dtype=F64).expand(2, R).clone()
    eps = torch.tensor([0.01, 0.02], dtype=F64)
    C = torch.diag_embed((1 + eps)[:, None].expand(2, R)).contiguous()
    beta = 1e-3 * torch.randn(2, R, generator=torch.Generator().manual_seed(0), dtype=F64)
    # s(x) = 1 - (1 + eps) exp(-d^2 / lambda^2) vanishes at d = lambda sqrt(log(1 + eps))
    offset = lam * torch.log1p(eps).sqrt() + 1e-10
    mu = V[0, 2:12:3, None] + torch.stack([offset, -offset])[:, None]  # [2, 4, 2] -> rows
    mu = mu.reshape(-1, 2)
    a = mu.clone().requires_grad_()
    alpha = torch.exp(-0.5 * (a.unsqueeze(-1) - V) ** 2 / lam[:, None] ** 2)
    m = (alpha * beta).sum(-1)
    s = 1 - torch.einsum("snr,nrt,snt->sn", alpha, C, alpha)
    assert 0 < float(s.detach().min()) and float(s.detach().max()) < 1e-7
    (dm,) = torch.autograd.grad(m.sum(), a, retain_graph=True)
    (ds,) = torch.autograd.grad(s.sum(), a, create_graph=True)
    (d2s,) = torch.autograd.grad(ds.sum(), a)
    want = dm.square() + 0.5 * d2s
    v = torch.zeros_like(mu, requires_grad=True)
    _, var = cpu_response_meanvar(mu, v, V, lam, beta, C, None)
    (dv,) = torch.autograd.grad(var.sum(), v)
    torch.testing.assert_close(dv, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("regime", [{}, {"lengthscale": 1.0, "target_var": 1e-4}])
def test_float32_inputs_get_float64_algebra(regime):
    """Float32 inputs are cast to float64 on entry: the outputs and gradients are the float64
    reference path's on the same values, to float32 rounding (on a grid equidistant in float32,
    17 points at spacing 1/4), also where the variance cancels ``|beta|^2``-sized terms."""
    leaves = make(31, 6, 17, seed=5, dtype=torch.float32, **regime)
    mu, v, V, U, Svar, lam, noise = leaves
    kappa, beta = cpu_virtual_observation_weights(V, U, Svar, lam)
    assert kappa.dtype == beta.dtype == torch.float32
    kappa, beta = kappa.detach().requires_grad_(), beta.detach().requires_grad_()
    inputs = [mu, v, lam, beta, kappa, noise]
    out_f, g_f = projected_grads(cpu_response_meanvar(mu, v, V, lam, beta, kappa, noise), inputs)
    wide = [t.detach().double().requires_grad_() for t in inputs]
    m, s = _reference_meanvar(*wide[:2], V.double(), *wide[2:])
    out_r, g_r = projected_grads((m, s), wide)
    assert all(t.dtype == torch.float32 for t in (*out_f, *g_f))
    assert_close_all(out_f, out_r, rtol=2e-7, atol=2e-7, what="outputs")
    assert_close_all(g_f, g_r, rtol=2e-7, atol=2e-7, what="grads")


def test_deterministic_rows_where_the_odd_midpoint_factor_overflows():
    """Deterministic activations in units with ``lambda < h / 53`` (``exp(h^2 / (4 lambda^2))``
    beyond float64's range, so the one-progression rows cannot serve them): the variances
    ``1 - alpha^T C alpha`` against extended precision, the means and every gradient against
    the reference path; activations within a few lengthscales of the inducing points."""
    R = 14
    _, _, V, U, Svar, lam, noise = make(1, 3, R, seed=23)
    with torch.no_grad():
        lam.copy_(torch.tensor([0.004, 0.005, 0.0055], dtype=F64))  # h = 4 / 13: h / 53 = 0.0058
    g = torch.Generator().manual_seed(23)
    mu = V[0, torch.randint(0, R, (24, 3), generator=g)] + 0.01 * torch.randn(24, 3, generator=g)
    leaves = [mu.requires_grad_(), torch.zeros_like(mu).requires_grad_(), V, U, Svar, lam, noise]
    out_f, g_f = run(leaves, True, jitter=1e-9)
    out_r, g_r = run(leaves, False, jitter=1e-9)
    assert_close_all(out_f, out_r, rtol=1e-11, atol=1e-13, what="outputs")
    assert_close_all(g_f, g_r, rtol=1e-9, atol=1e-11, what="grads")
    kappa, _ = cpu_virtual_observation_weights(V, U, Svar, lam, 1e-9)
    ld = np.longdouble
    mu_, V_, lam_ = (t.detach().numpy().astype(ld) for t in (mu, V, lam))
    alpha = np.exp(-0.5 * (mu_[..., None] - V_) ** 2 / lam_[:, None] ** 2)
    want = 1 - np.einsum("snr,nrt,snt->sn", alpha, kappa.detach().numpy().astype(ld), alpha)
    assert 0.1 < float(want.max() - want.min())  # activations near and between the points
    got = out_f[1].numpy() - noise.detach().numpy()
    np.testing.assert_allclose(got.astype(ld), want, rtol=0, atol=1e-12)


def test_tier_rules_and_node_buffers_match_the_node_tiers():
    """The kernels' concatenated rules (``_tier_rules``) against :data:`NODE_TIERS` read here:
    tier ``t``'s nodes and weights at ``offs[t]:offs[t + 1]`` (offsets the running sum of the
    tiers' node counts), ``tier_r2`` the squared ratios; and the per-unit node buffers sized
    by ``largest_tier`` to the largest tier's count. Caught: a buffer one node short
    (the largest tier then writes past it: no wrong value, a heap corruption that aborted a
    later test only), shifted offsets, unsquared ratios."""
    from pyro_gpn.moments.cpu_kernels import _k, _tier_rules
    from pyro_gpn.moments.quadrature import NODE_TIERS, node_rule

    zs, ws, offs, tier_r2 = _tier_rules()
    counts = [nodes for _, nodes, _ in NODE_TIERS]
    assert offs.tolist() == [sum(counts[:t]) for t in range(len(counts) + 1)]
    for t, (ratio, _, _) in enumerate(NODE_TIERS):
        z, w = node_rule(t)
        np.testing.assert_array_equal(zs[offs[t] : offs[t + 1]], z)
        np.testing.assert_array_equal(ws[offs[t] : offs[t + 1]], w)
        assert tier_r2[t] == ratio**2
    assert _k("largest_tier")(offs) == max(counts)
