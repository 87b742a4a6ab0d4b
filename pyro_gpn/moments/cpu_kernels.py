r"""Fused CPU kernels (Numba) for the closed-form GPN moments, equidistant inducing points.

The reference path (:mod:`pyro_gpn.moments.propagate`) evaluates the Gaussian sums

.. math::

    \psi^T\beta = \sqrt{\lambda^2 / c_1} \sum_r \beta_r e^{-(\mu - V_r)^2 / (2 c_1)},
    \qquad
    tr[(C - \beta\beta^T)\Omega] = \sqrt{\lambda^2 / c_2} \sum_k P_k e^{-(\mu - m_k)^2 / c_2}

(``eq:gpn_normal_E_alpha``, ``eq:gpn_normal_mu``, ``eq:gpn_normal_omega``,
``eq:gpn_normal_Sigmatilde``; ``c_1 = \lambda^2 + v``, ``c_2 = \lambda^2 + 2 v``, ``m_k`` the
``2R - 1`` midpoints and ``P`` the midpoint weights of
:func:`~pyro_gpn.moments.propagate.midpoint_expansion`) as a chain of full-size ``[S, N, K]``
tensor operations. Here one compiled loop visits every (sample, unit) once, forward and
backward, and keeps everything in registers.

**Geometric progression.** For equidistant centres ``x_0 + k h`` the Gaussians
``E_k = exp(-(mu - x_0 - k h)^2 / w)`` satisfy ``E_{k+1} / E_k = q_k`` with
``q_{k+1} = q_k rho``, ``rho = exp(-2 h^2 / w)``. Anchored at the centre nearest to ``mu``
(offset ``delta``, ``|delta| <= h / 2`` inside the range), the sum needs three exponentials per
row: ``E_{k_0} = exp(-delta^2 / w)``, ``q_up = exp((2 delta h - h^2) / w)`` and
``q_down = exp((-2 delta h - h^2) / w)`` (``rho = q_up q_down``). Every factor is ``<= 1``, so
nothing overflows; outside the range only one direction is walked and ``rho`` is exponentiated
directly. The relative error grows like ``K`` roundings (about ``1e-14`` in float64).

**Deterministic activations** (``v = 0``: a first layer with point weights, a CNN's zero
patches). Their variance is the one-node rule ``1 - alpha(mu)^T C alpha(mu)`` (no cancellation
of ``|beta|^2``-sized terms, whatever the conditioning), and its midpoint Gaussians are products
of the mean's, ``G_{2r} = E_r^2`` and ``G_{2r+1} = e^{h^2 / (4 lambda^2)} E_r E_{r+1}``: one
progression (three exponentials) serves the row, forward and backward, with the exact
``d var / dv = m'(mu)^2 + s''(mu) / 2`` at ``v = 0`` (``s`` the conditional variance). Units with
``lambda < h / 34.6`` (where that factor would pass ``e^300``) take the general rows. (The
reference path keeps the closed form at ``v = 0`` where its error bound allows, as for every
narrow row: the two agree to that bound, ``CLOSED_FORM_RTOL``.)

**Runs of equal activations.** A row equal to the previous one of its unit (a CNN's background,
where consecutive positions see the same zero patch) copies its outputs; in the backward pass a
run of equal deterministic rows is evaluated once and its parameter gradient accumulated once,
with the run's summed coefficients (the gradient is linear in them).

**Parameter-only part.** ``kappa = (K(V, V) + diag(S))^-1`` (LU inverse) and ``beta = kappa U``
(``eq:gpn_normal_alpha_kappa``, Cholesky solve), and the midpoint weights
``P_k = sum_{r + t = k} (C_rt - beta_r beta_t) exp(-(r - t)^2 h^2 / (4 lambda^2))``, with their
backward passes in closed form (``d kappa = -kappa dG kappa``), also as compiled loops: a few
microseconds for a 50-unit layer instead of dozens of small PyTorch operations.

Everything is computed in float64 whatever the input dtype (the inputs are cast on entry and the
results cast back), so float32 layers get float64 per-sample algebra for free.

Numba is optional (``pip install 'pyro-gpn[fast]'``). Kernels are compiled on first use and
cached on disk (``cache=True``): the first call in a fresh environment compiles for several
seconds (see ``docs/results/layer_speed.md``), later processes load the cache in well under a
second. Multi-threading follows :func:`torch.get_num_threads` (``prange`` over units); on one
thread the serial builds run and Numba's thread pool is never started.
:mod:`pyro_gpn.moments.backend` decides when these kernels are used.
"""

from __future__ import annotations

import functools
import importlib

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from .._validation import check_ndim, check_per_unit, check_shape
from .backend import numba_available

__all__ = [
    "NotPositiveDefinite",
    "cpu_response_mean",
    "cpu_response_meanvar",
    "cpu_virtual_observation_weights",
    "numba_available",
]


# ---------------------------------------------------------------------------------------------
# kernels: pyro_gpn/moments/_numba_kernels.py, imported (and compiled) on first use
# ---------------------------------------------------------------------------------------------
@functools.cache
def _kernels():
    if not numba_available():
        raise RuntimeError(
            "the fused CPU kernels need numba, which is not installed "
            "(pip install 'pyro-gpn[fast]'); use backend('auto') or backend('reference')"
        )
    import numba

    from . import _numba_kernels

    return numba, _numba_kernels


def _numba_module(name: str):
    """The kernel module ``pyro_gpn.moments.<name>`` (imported on first use: it imports numba;
    a clear error when numba is missing)."""
    _kernels()
    return importlib.import_module(f"{__package__}.{name}")


def _k(name: str):
    """The kernel ``name``, run on as many threads as torch uses (:func:`torch.get_num_threads`):
    on one thread its serial build (``name + "_serial"``, where there is one), which never starts
    Numba's thread pool (see :mod:`pyro_gpn.moments._numba_kernels`)."""
    numba, module = _kernels()
    serial = getattr(module, name + "_serial", None)
    if serial is None:  # not a parallel kernel: leave Numba's thread pool alone
        return getattr(module, name)
    threads = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    if threads == 1:
        return serial
    # Only here may the pool start: numba.set_num_threads launches it, and its OpenMP runtime
    # then raises torch's own thread count to the pool's size (seen: 1 -> 2 after one call).
    if numba.get_num_threads() != threads:
        numba.set_num_threads(threads)
    return getattr(module, name)


@functools.cache
def _tier_rules() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The quadrature rules of every node tier of
    :data:`~pyro_gpn.moments.quadrature.NODE_TIERS`, concatenated: nodes, weights, offsets
    ``[T + 1]`` and each tier's largest ``v / lambda^2`` ``[T]``."""
    from .quadrature import NODE_TIERS, node_rule

    rules = [node_rule(t) for t in range(len(NODE_TIERS))]
    offs = np.cumsum([0] + [len(z) for z, _ in rules]).astype(np.int64)
    zs = np.ascontiguousarray(np.concatenate([z for z, _ in rules]))
    ws = np.ascontiguousarray(np.concatenate([w for _, w in rules]))
    r2 = np.array([ratio**2 for ratio, _, _ in NODE_TIERS])
    return zs, ws, offs, r2


def _np(t: Tensor | None) -> np.ndarray | None:
    """Contiguous float64 numpy view (or copy) of a CPU tensor."""
    if t is None:
        return None
    return np.ascontiguousarray(t.detach().to(torch.float64).numpy())


def _torch(a: np.ndarray, like: Tensor) -> Tensor:
    return torch.from_numpy(a).to(like.dtype)


def _reduce(grad: np.ndarray, like: Tensor) -> Tensor:
    """Gradient ``[G, ...]`` of a parameter ``like`` of shape ``[G | 1, ...]``."""
    if like.shape[0] == 1 and grad.shape[0] != 1:
        grad = grad.sum(0, keepdims=True)
    return _torch(np.ascontiguousarray(grad), like)


def _units(num_units: int, *params: Tensor | None) -> int:
    """Leading size of per-unit gradient buffers: ``N`` if any parameter is per unit, else 1."""
    return num_units if any(p is not None and p.shape[0] > 1 for p in params) else 1


def _ratio2() -> float:
    from .quadrature import NODE_MAX_STD_RATIO

    return float(NODE_MAX_STD_RATIO) ** 2


def _closed_form_rtol() -> float:
    from .propagate import CLOSED_FORM_RTOL

    return float(CLOSED_FORM_RTOL)


def closed_form_error_scale(num_points: int, dtype: torch.dtype) -> float:
    from .propagate import closed_form_error_scale as scale

    return scale(num_points, dtype)


class NotPositiveDefinite(torch.linalg.LinAlgError):
    """``K(V, V) + diag(S)`` failed the Cholesky factorisation in the CPU kernel (the reference
    path then retries with more jitter, :func:`~pyro_gpn.moments.propagate.safe_cholesky`)."""


# ---------------------------------------------------------------------------------------------
# autograd functions
# ---------------------------------------------------------------------------------------------
class _MeanVar(torch.autograd.Function):
    """``(mean, var)`` (or ``mean`` alone) of one layer; ``C is None`` means "mean only"."""

    @staticmethod
    def forward(ctx: FunctionCtx, mu, v, V, lam, beta, C, noise_var):
        with_var = C is not None
        S, N = mu.shape
        R = V.shape[1]
        mu_, V_, lam_, beta_ = _np(mu), _np(V), _np(lam), _np(beta)
        v_ = np.zeros((S, N)) if v is None else _np(v)
        if with_var:
            G = max(C.shape[0], beta.shape[0], lam.shape[0], V.shape[0])
            P_, PC_ = np.empty((G, 2 * R - 1)), np.empty((G, 2 * R - 1))
            PA_ = np.empty((G, 2 * R - 1))
            C_ = _np(C)
            _k("midpoint_fwd")(C_, beta_, lam_, V_, P_)
            _k("midpoint_fwd")(C_, np.zeros((1, R)), lam_, V_, PC_)
            _k("midpoint_abs")(C_, beta_, lam_, V_, PA_)
        else:
            P_ = PC_ = PA_ = np.zeros((1, 1))
            C_ = None
        zs, ws, offs, tier_r2 = _tier_rules()
        noise_ = np.zeros(1) if noise_var is None else _np(noise_var)
        mean = np.empty((S, N))
        var = np.empty((S, N)) if with_var else mean
        pre = np.empty((S, N)) if with_var else mean
        how = np.zeros((S, N) if with_var else (1, 1), dtype=np.int8)
        _k("meanvar_fwd")(
            mu_, v_, V_, lam_, beta_, P_, PA_, PC_, zs, ws, offs, tier_r2, _ratio2(),
            closed_form_error_scale(R, torch.float64), _closed_form_rtol(), noise_, with_var,
            mean, var, pre, how,
        )  # fmt: skip
        ctx.arrays = (mu_, v_, V_, lam_, beta_, C_, P_, PC_, mean, pre, how)
        ctx.with_var = with_var
        ctx.has_v = v is not None
        ctx.like = (mu, V, lam, beta, C, noise_var)
        out_mean = _torch(mean, mu)
        if not with_var:
            return out_mean
        return out_mean, _torch(var, mu)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, gmean, gvar=None):
        mu_, v_, V_, lam_, beta_, C_, P_, PC_, mean, pre, how = ctx.arrays
        mu, V, lam, beta, C, noise_var = ctx.like
        with_var = ctx.with_var
        S, N = mu_.shape
        R = V_.shape[1]
        gm = np.zeros((S, N)) if gmean is None else _np(gmean)
        gv = np.zeros((S, N)) if (gvar is None or not with_var) else _np(gvar)
        dmu, dv = np.empty((S, N)), np.empty((S, N))
        dlam = np.empty(N)
        dbeta = np.zeros((N, R))
        dP, dPC = np.zeros((N, P_.shape[1])), np.zeros((N, P_.shape[1]))
        zs, ws, offs, _ = _tier_rules()
        _k("meanvar_bwd")(
            mu_, v_, V_, lam_, beta_, P_, PC_, zs, ws, offs, mean, pre, how, gm, gv, with_var,
            dmu, dv, dlam, dbeta, dP, dPC,
        )  # fmt: skip
        need = ctx.needs_input_grad
        g_lam = _reduce(dlam, lam) if need[3] else None
        g_beta = _reduce(dbeta, beta) if need[4] else None
        g_C = None
        if with_var:
            G = P_.shape[0]
            if G == 1:
                dP, dPC = dP.sum(0, keepdims=True), dPC.sum(0, keepdims=True)
            dC, dbeta2, dlam2 = np.empty((G, R, R)), np.empty((G, R)), np.empty(G)
            _k("midpoint_bwd")(C_, beta_, lam_, V_, dP, dC, dbeta2, dlam2)
            dC3, dbeta3, dlam3 = np.empty((G, R, R)), np.empty((G, R)), np.empty(G)
            _k("midpoint_bwd")(C_, np.zeros((1, R)), lam_, V_, dPC, dC3, dbeta3, dlam3)
            if need[3]:
                g_lam = g_lam + _reduce(dlam2 + dlam3, lam)
            if need[4]:
                g_beta = g_beta + _reduce(dbeta2, beta)
            g_C = _reduce(dC + dC3, C) if need[5] else None
        g_noise = None
        if noise_var is not None and need[6]:
            g_noise = _reduce(gv.sum(0), noise_var)
        return (
            _torch(dmu, mu) if need[0] else None,
            _torch(dv, mu) if (need[1] and ctx.has_v) else None,
            None,
            g_lam,
            g_beta,
            g_C,
            g_noise,
        )


class _VirtualObservations(torch.autograd.Function):
    """``kappa = (K(V, V) + diag(S + jitter))^-1`` and ``beta = kappa U`` per unit."""

    @staticmethod
    def forward(ctx: FunctionCtx, V, U, Svar, lam, jitter):
        G = max(V.shape[0], U.shape[0], Svar.shape[0], lam.shape[0])
        R = V.shape[1]
        V_ = np.ascontiguousarray(np.broadcast_to(_np(V), (G, R)))
        U_ = np.ascontiguousarray(np.broadcast_to(_np(U), (G, R)))
        S_ = np.ascontiguousarray(np.broadcast_to(_np(Svar), (G, R)))
        lam_ = np.ascontiguousarray(np.broadcast_to(_np(lam), (G,)))
        kappa = np.empty((G, R, R))
        beta = np.empty((G, R))
        if not _k("vow_fwd")(V_, U_, S_, lam_, float(jitter), kappa, beta):
            raise NotPositiveDefinite(
                "K(V, V) + diag(target_variances) is not positive definite (fused CPU kernel)"
            )
        ctx.arrays = (V_, U_, lam_, kappa, beta)
        ctx.like = (U, Svar, lam)
        return _torch(kappa, U), _torch(beta, U)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, gK, gb):
        V_, U_, lam_, kappa, beta = ctx.arrays
        U, Svar, lam = ctx.like
        G, R = U_.shape
        gK_ = np.zeros((G, R, R)) if gK is None else _np(gK)
        gb_ = np.zeros((G, R)) if gb is None else _np(gb)
        dU, dS, dlam = np.empty((G, R)), np.empty((G, R)), np.empty(G)
        _k("vow_bwd")(V_, U_, lam_, kappa, beta, gK_, gb_, dU, dS, dlam)
        need = ctx.needs_input_grad
        return (
            None,
            _reduce(dU, U) if need[1] else None,
            _reduce(dS, Svar) if need[2] else None,
            _reduce(dlam, lam) if need[3] else None,
            None,
        )


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------
def _check_shapes(
    mu: Tensor,
    v: Tensor | None,
    V: Tensor,
    lam: Tensor,
    beta: Tensor,
    C: Tensor | None = None,
    noise_var: Tensor | None = None,
) -> None:
    """The shapes the compiled loops index by (they read past an array's end otherwise): Python
    comparisons only, no device synchronisation."""
    check_ndim("mu", mu, 2)
    num_units = mu.shape[1]
    if v is not None:
        check_shape("v", v, tuple(mu.shape))
    check_per_unit("V", V, num_units, (None,), owner="mu")
    points = f"R = {V.shape[1]} inducing points as in V"
    check_per_unit("lam", lam, num_units, owner="mu")
    check_per_unit("beta", beta, num_units, (V.shape[1],), points, "mu")
    if C is not None:
        check_per_unit("C", C, num_units, (V.shape[1], V.shape[1]), points, "mu")
    if noise_var is not None:
        check_per_unit("noise_var", noise_var, num_units, owner="mu")


def cpu_response_mean(mu: Tensor, v: Tensor | None, V: Tensor, lam: Tensor, beta: Tensor) -> Tensor:
    """Output means ``sqrt(lambda^2 / c_1) sum_r beta_r exp(-(mu - V_r)^2 / (2 c_1))``.

    ``eq:gpn_normal_mu`` with ``psi`` of ``eq:gpn_normal_E_alpha``.

    Args:
        mu: ``[S, N]`` activation means; v: ``[S, N]`` variances or ``None`` (deterministic).
        V: ``[N | 1, R]`` equidistant, ascending inducing points (not differentiated).
        lam: ``[N | 1]`` lengthscales; beta: ``[N | 1, R]``.

    Returns:
        ``[S, N]`` in ``mu``'s dtype, differentiable w.r.t. ``mu``, ``v``, ``lam``, ``beta``.

    Raises:
        ValueError: naming the argument, for shapes that do not fit together.
    """
    _check_shapes(mu, v, V, lam, beta)
    return _cpu_response_mean(mu, v, V, lam, beta)


def _cpu_response_mean(
    mu: Tensor, v: Tensor | None, V: Tensor, lam: Tensor, beta: Tensor
) -> Tensor:
    """:func:`cpu_response_mean` without the shape checks (``response_moments`` made them)."""
    return _MeanVar.apply(mu, v, V, lam, beta, None, None)


def cpu_response_meanvar(
    mu: Tensor,
    v: Tensor,
    V: Tensor,
    lam: Tensor,
    beta: Tensor,
    C: Tensor,
    noise_var: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Output means and variances (``eq:gpn_normal_mu``, ``eq:gpn_normal_Sigmatilde``).

    ``var = max(0, 1 - tr[(C - beta beta^T) Omega] - mean^2) + noise_var``, the trace through
    the midpoint expansion; the same function as the reference path of
    :func:`~pyro_gpn.moments.propagate.response_moments` in ``"meanvar"`` mode.

    Args:
        mu, v: ``[S, N]``; V: ``[N | 1, R]`` equidistant ascending (not differentiated);
        lam: ``[N | 1]``; beta: ``[N | 1, R]``; C: ``[N | 1, R, R]``; noise_var: ``[N | 1]``.

    Returns:
        ``(mean, var)`` ``[S, N]`` in ``mu``'s dtype, differentiable w.r.t. every input but
        ``V``.

    Raises:
        ValueError: naming the argument, for shapes that do not fit together.
    """
    _check_shapes(mu, v, V, lam, beta, C, noise_var)
    return _cpu_response_meanvar(mu, v, V, lam, beta, C, noise_var)


def _cpu_response_meanvar(
    mu: Tensor,
    v: Tensor,
    V: Tensor,
    lam: Tensor,
    beta: Tensor,
    C: Tensor,
    noise_var: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`cpu_response_meanvar` without the shape checks (``response_moments`` made
    them)."""
    return _MeanVar.apply(mu, v, V, lam, beta, C, noise_var)


def cpu_virtual_observation_weights(
    inducing_points: Tensor,
    targets: Tensor,
    target_variances: Tensor,
    lengthscales: Tensor,
    jitter: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """``kappa = (K(V, V) + diag(S + jitter))^-1`` and ``beta = kappa U``
    (``eq:gpn_normal_alpha_kappa``) in one compiled loop per call: ``beta`` by a Cholesky solve,
    ``kappa`` by an LU (Gauss-Jordan, partial pivoting) inverse, symmetrised -- the same
    factorisations as the reference path.

    Shapes as :func:`~pyro_gpn.moments.propagate.virtual_observation_weights`; the inducing
    points are not differentiated.

    Raises:
        NotPositiveDefinite: if a ``K(V, V) + diag(S)`` fails the Cholesky factorisation.
    """
    return _VirtualObservations.apply(
        inducing_points, targets, target_variances, lengthscales, jitter
    )
