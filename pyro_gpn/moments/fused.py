r"""Fused Triton kernels for the closed-form GPN moments, with fused backward kernels.

The paper (section "Implementation") evaluates each moment expression *and its derivatives*
inside a single GPU kernel, "including the occurring sums": the many small ``[R]`` and ``[R, R]``
tensors of the virtual observations would otherwise dominate the run time. This module does the
same with Triton. Per sample ``s`` and unit ``n`` (``a ~ N(mu, v)``, ``c_1 = lambda^2 + v``,
``c_2 = lambda^2 + 2 v``):

.. math::

    \psi_r = \sqrt{\lambda^2 / c_1}\, \exp\big(-(\mu - V_r)^2 / (2 c_1)\big)
        \qquad (eq:gpn\_normal\_E\_alpha)

    \Omega_{rt} = \sqrt{\lambda^2 / c_2}\,
        \exp\big(-(\mu - \tfrac{V_r + V_t}{2})^2 / c_2 - (V_r - V_t)^2 / (4 \lambda^2)\big)
        \qquad (eq:gpn\_normal\_omega)

    \tilde\mu = \textstyle\sum_r \psi_r \beta_r \qquad (eq:gpn\_normal\_mu)

    \tilde\sigma^2 = \max\big(0,\ 1 - \textstyle\sum_{rt} (C_{rt} - \beta_r\beta_t)\Omega_{rt}
        - \tilde\mu^2\big) + \sigma_n^2 \qquad (eq:gpn\_normal\_Sigmatilde)

Kernels (in the inputs' dtype, float32 or float64; ``R`` is padded to a power of two ``R_p``
and masked, any ``R`` works):

* ``_meanvar_fwd_kernel``: one program per (block of samples, unit); ``psi`` as a
  ``[BLOCK_S, R_p]`` tile, ``Omega`` as a ``[BLOCK_S, R_p, R_p]`` tile, both contracted in
  registers. Also stores the unclamped variance (for the gradient of the ``max``).
* ``_meanvar_bwd_kernel``: one program per (chunk of sample blocks, unit); recomputes ``psi`` and
  ``Omega`` and writes ``d/d mu`` and ``d/d v`` per sample; the parameter gradients (sums over
  samples) are accumulated in registers over the chunk and written as per-chunk partial sums
  ``[P, N, ...]`` that :func:`torch.sum` reduces. No atomics: the result is deterministic.
Backward. With upstream gradients ``g_mean``, ``g_var``, let ``G = g_var 1[pre >= 0]`` (the
gradient of ``clamp_min(0)``) and ``g = g_mean - 2 G mean`` (the ``-mean^2`` term). Then
``dL/dpsi_r = g beta_r`` and ``dL/dOmega_rt = -G (C_rt - beta_r beta_t)``, and every input
gradient follows from the closed-form log-derivatives (``e = mu - (V_r + V_t) / 2``):

* ``psi``: ``d/dmu = -(mu - V_r) / c_1``, ``d/dV_r = (mu - V_r) / c_1``,
  ``d/dv = ((mu - V_r)^2 / c_1 - 1) / (2 c_1)``,
  ``d/dlambda = 1/lambda - lambda / c_1 + lambda (mu - V_r)^2 / c_1^2``;
* ``Omega``: ``d/dmu = -2 e / c_2``, ``d/dv = 2 e^2 / c_2^2 - 1 / c_2``,
  ``d/dV_r = e / c_2 - (V_r - V_t) / (2 lambda^2)``,
  ``d/dlambda = 1/lambda - lambda / c_2 + 2 lambda e^2 / c_2^2 + (V_r - V_t)^2 / (2 lambda^3)``.

Cost: ``O(S N R^2)`` time, ``O(S N)`` memory, forward and backward; the backward kernels
recompute ``psi`` and ``Omega`` instead of storing them.

A full activation covariance's off-diagonal (``eq:gpn_normal_Sigmatilde_cov``) has no kernel
here: :func:`pyro_gpn.moments.propagate.response_moments` adds Mehler's series on whole tensors
(:mod:`pyro_gpn.moments.cross`, ``O(S N R K + S N^2 K)``), a linear form in ``beta`` that does
not lose the digits the paper's ``sum_rt beta_rn beta_tm Lambda_rtnm - mean_n mean_m`` loses
when ``K + S`` is ill-conditioned (``docs/results/accuracy.md``).

Gradients are first order only (``once_differentiable``). Inputs must be all float32 or all
float64 and on a CUDA device, or on the CPU under ``TRITON_INTERPRET=1``;
:func:`pyro_gpn.moments.backend.select_backend` decides when these functions are used. They
evaluate the closed form as written; the narrow regime's quadrature variance
(:mod:`pyro_gpn.moments.quadrature`) is applied on top of them by
:func:`pyro_gpn.moments.propagate.response_moments`.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from . import _triton_kernels
from .backend import TRITON_MEANVAR_DTYPES, triton_available, triton_interpret

# Triton is imported on the first kernel launch (``_require_triton``), not with this module: the
# package imports and runs without it, and Triton reads ``TRITON_INTERPRET`` when it is first
# imported (its own ``tl.sum`` & co. are jitted then), so a test can still switch on the
# interpreter after importing pyro_gpn. The kernels below resolve ``tl`` when they are jitted.
triton = None
tl = None

__all__ = ["fused_response_mean", "fused_response_meanvar"]

# Tile budgets (elements of one ``[BLOCK_S, R_p, R_p]`` tile), forward
# and backward. Chosen so that ``ptxas`` for sm_90 reports no register spills at R = 14 with
# 4 warps; not tuned on a GPU yet.
_MEANVAR_TILE = {"fwd": 4096, "bwd": 2048}


_JIT_CACHE: dict[tuple[str, bool], object] = {}


def _require_triton() -> None:
    """Import Triton on first use; raise ``RuntimeError`` if it is missing or in the wrong mode."""
    global triton, tl
    if tl is None:
        if not triton_available():
            raise RuntimeError("the fused GPN kernels need Triton (pip install 'pyro-gpn[gpu]')")
        import triton as _triton
        import triton.language as _tl

        triton, tl = _triton, _tl
        _triton_kernels.triton, _triton_kernels.tl = _triton, _tl
    imported_interpreted = type(tl.sum).__name__ == "InterpretedFunction"
    if imported_interpreted != triton_interpret():
        raise RuntimeError(
            f"TRITON_INTERPRET is {'set' if triton_interpret() else 'unset'} now but was not "
            "when Triton was first imported; Triton fixes its mode at import, so set it before "
            "anything imports triton (in the environment or at the top of the test module)"
        )


def _jit(fn_name: str):
    """The ``triton.jit`` of kernel ``fn_name``, built on first use."""
    _require_triton()
    key = (fn_name, triton_interpret())
    kernel = _JIT_CACHE.get(key)
    if kernel is None:
        kernel = _JIT_CACHE[key] = triton.jit(getattr(_triton_kernels, fn_name))
    return kernel


# ---------------------------------------------------------------------------------------------
# launch configuration and argument preparation
# ---------------------------------------------------------------------------------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _meanvar_block_s(num_samples: int, block_r: int, with_var: bool, direction: str) -> int:
    per_sample = block_r * block_r if with_var else block_r
    budget = _MEANVAR_TILE[direction]
    return max(1, min(128, budget // per_sample, _next_pow2(num_samples)))


def _target_programs(device: torch.device) -> int:
    """How many programs the backward kernels aim for (enough to fill the GPU)."""
    if device.type == "cuda":
        return 4 * torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # interpreter: few programs, but more than one chunk so the reduction is exercised


def _split(num_items: int, num_units: int, device: torch.device) -> tuple[int, int]:
    """Split ``num_items`` work items over ``P`` chunks: returns ``(P, items_per_chunk)``."""
    wanted = max(1, min(num_items, _cdiv(_target_programs(device), num_units)))
    per_chunk = _cdiv(num_items, wanted)
    return _cdiv(num_items, per_chunk), per_chunk


def _check_inputs(
    dtypes: tuple[torch.dtype, ...] = (torch.float32,), **tensors: Tensor | None
) -> None:
    """All tensors of ``mu``'s dtype, one of ``dtypes``, and on ``mu``'s device."""
    first = next(iter(tensors.values()))
    device, dtype = first.device, first.dtype
    if dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"mu must be {names} for the fused kernels, got {dtype}")
    for name, t in tensors.items():
        if t is None:
            continue
        if t.dtype != dtype:
            raise TypeError(f"{name} must be {dtype} like mu for the fused kernels, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device} like mu")


def _unit_param(
    name: str, p: Tensor, num_units: int, trailing: tuple[int, ...]
) -> tuple[Tensor, int]:
    """Contiguous parameter ``[N | 1, *trailing]`` and its unit stride (0 if shared)."""
    if (
        p.dim() != 1 + len(trailing)
        or p.shape[0] not in (1, num_units)
        or tuple(p.shape[1:]) != tuple(trailing)
    ):
        want = ("N|1", *trailing)
        raise ValueError(f"{name} must have shape {want} with N={num_units}, got {tuple(p.shape)}")
    p = p.detach().contiguous()
    return p, (0 if p.shape[0] == 1 else math.prod(trailing))


def _reduce_units(grad: Tensor, like: Tensor) -> Tensor:
    """Sum per-unit gradients ``[N, ...]`` over the units for a shared parameter ``[1, ...]``."""
    if like.shape[0] == 1 and grad.shape[0] != 1:
        grad = grad.sum(0, keepdim=True)
    return grad.to(like.dtype)


class _Params:
    """The per-unit parameters of one layer, prepared for a kernel launch."""

    def __init__(
        self,
        num_units: int,
        V: Tensor,
        lam: Tensor,
        beta: Tensor,
        C: Tensor | None,
        noise_var: Tensor | None,
    ) -> None:
        if V.dim() != 2:
            raise ValueError(f"inducing points V must be [N|1, R], got {tuple(V.shape)}")
        R = V.shape[1]
        if R < 1:
            raise ValueError("need at least one inducing point")
        self.R = R
        self.block_r = _next_pow2(R)
        self.V, self.V_us = _unit_param("V", V, num_units, (R,))
        self.lam, self.lam_us = _unit_param("lam", lam, num_units, ())
        self.beta, self.beta_us = _unit_param("beta", beta, num_units, (R,))
        if C is not None:
            self.C, self.C_us = _unit_param("C", C, num_units, (R, R))
        else:
            self.C, self.C_us = self.beta, 0  # never read
        self.has_noise = noise_var is not None
        if noise_var is not None:
            self.noise, self.noise_us = _unit_param("noise_var", noise_var, num_units, ())
        else:
            self.noise, self.noise_us = self.lam, 0  # never read


def _device_guard(t: Tensor) -> contextlib.AbstractContextManager:
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
def _meanvar_forward(
    mu: Tensor, v: Tensor, p: _Params, with_var: bool
) -> tuple[Tensor, Tensor, Tensor]:
    S, N = mu.shape
    mean = torch.empty_like(mu)
    var = torch.empty_like(mu) if with_var else mean
    pre = torch.empty_like(mu) if with_var else mean
    if S == 0 or N == 0:
        return mean, var, pre
    block_s = _meanvar_block_s(S, p.block_r, with_var, "fwd")
    grid = (_cdiv(S, block_s), N)
    with _device_guard(mu):
        _jit("_meanvar_fwd_kernel")[grid](
            mu, v, p.V, p.lam, p.beta, p.C, p.noise, mean, var, pre,
            S, N, p.R, p.V_us, p.lam_us, p.beta_us, p.C_us, p.noise_us,
            WITH_VAR=with_var, HAS_NOISE=p.has_noise, BLOCK_S=block_s, BLOCK_R=p.block_r,
        )  # fmt: skip
    return mean, var, pre


def _meanvar_backward(
    mu: Tensor,
    v: Tensor,
    p: _Params,
    mean: Tensor,
    pre: Tensor,
    gmean: Tensor,
    gvar: Tensor | None,
    with_var: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients ``(d mu, d v, d V, d lam, d beta, d C)``, parameters per unit (``[N, ...]``)."""
    S, N = mu.shape
    R = p.R
    if S == 0 or N == 0:
        zero = mu.new_zeros
        dC = zero(N, R, R) if with_var else None
        return zero(S, N), zero(S, N), zero(N, R), zero(N), zero(N, R), dC
    block_s = _meanvar_block_s(S, p.block_r, with_var, "bwd")
    num_blocks = _cdiv(S, block_s)
    parts, blocks_per_prog = _split(num_blocks, N, mu.device)
    dmu = torch.empty_like(mu)
    dv = torch.empty_like(mu)
    dV = mu.new_empty(parts, N, R)
    dlam = mu.new_empty(parts, N)
    dbeta = mu.new_empty(parts, N, R)
    dC = mu.new_empty(parts, N, R, R) if with_var else dV
    gvar = gmean if gvar is None else gvar
    with _device_guard(mu):
        _jit("_meanvar_bwd_kernel")[(parts, N)](
            mu, v, p.V, p.lam, p.beta, p.C, mean, pre, gmean, gvar,
            dmu, dv, dV, dlam, dbeta, dC,
            S, N, R, p.V_us, p.lam_us, p.beta_us, p.C_us, blocks_per_prog,
            WITH_VAR=with_var, BLOCK_S=block_s, BLOCK_R=p.block_r,
            ACC=tl.float64 if mu.dtype == torch.float64 else tl.float32,
        )  # fmt: skip
    return dmu, dv, dV.sum(0), dlam.sum(0), dbeta.sum(0), dC.sum(0) if with_var else None


# ---------------------------------------------------------------------------------------------
# autograd functions
# ---------------------------------------------------------------------------------------------
def _noise_grad(gvar: Tensor, noise_var: Tensor | None) -> Tensor | None:
    if noise_var is None:
        return None
    return _reduce_units(gvar.sum(0), noise_var)


class _ResponseMean(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx, mu: Tensor, v: Tensor | None, V: Tensor, lam: Tensor, beta: Tensor
    ):
        mu_c = mu.detach().contiguous()
        v_c = torch.zeros_like(mu_c) if v is None else v.detach().contiguous()
        p = _Params(mu.shape[1], V, lam, beta, None, None)
        mean, _, _ = _meanvar_forward(mu_c, v_c, p, with_var=False)
        ctx.save_for_backward(mu_c, v_c, V, lam, beta)
        return mean

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, gmean: Tensor):
        mu, v, V, lam, beta = ctx.saved_tensors
        p = _Params(mu.shape[1], V, lam, beta, None, None)
        dmu, dv, dV, dlam, dbeta, _ = _meanvar_backward(
            mu, v, p, mu, mu, gmean.contiguous(), None, with_var=False
        )
        dv = dv if ctx.needs_input_grad[1] else None
        return dmu, dv, _reduce_units(dV, V), _reduce_units(dlam, lam), _reduce_units(dbeta, beta)


class _ResponseMeanVar(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx,
        mu: Tensor,
        v: Tensor,
        V: Tensor,
        lam: Tensor,
        beta: Tensor,
        C: Tensor,
        noise_var: Tensor | None,
    ):
        mu_c, v_c = mu.detach().contiguous(), v.detach().contiguous()
        p = _Params(mu.shape[1], V, lam, beta, C, noise_var)
        mean, var, pre = _meanvar_forward(mu_c, v_c, p, with_var=True)
        ctx.save_for_backward(mu_c, v_c, mean, pre, V, lam, beta, C, noise_var)
        return mean, var

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, gmean: Tensor, gvar: Tensor):
        mu, v, mean, pre, V, lam, beta, C, noise_var = ctx.saved_tensors
        p = _Params(mu.shape[1], V, lam, beta, C, noise_var)
        gvar = gvar.contiguous()
        dmu, dv, dV, dlam, dbeta, dC = _meanvar_backward(
            mu, v, p, mean, pre, gmean.contiguous(), gvar, with_var=True
        )
        return (
            dmu,
            dv,
            _reduce_units(dV, V),
            _reduce_units(dlam, lam),
            _reduce_units(dbeta, beta),
            _reduce_units(dC, C),
            _noise_grad(gvar, noise_var),
        )


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------
def _check_activations(mu: Tensor, v: Tensor | None) -> None:
    if mu.dim() != 2:
        raise ValueError(f"mu must be [S, N], got shape {tuple(mu.shape)}")
    if v is not None and v.shape != mu.shape:
        raise ValueError(f"v must have shape {tuple(mu.shape)}, got {tuple(v.shape)}")


def fused_response_mean(
    mu: Tensor, v: Tensor | None, V: Tensor, lam: Tensor, beta: Tensor
) -> Tensor:
    """Output means ``sum_r psi_snr beta_nr`` (``eq:gpn_normal_mu``, ``eq:gpn_normal_E_alpha``).

    Args:
        mu: ``[S, N]`` activation means.
        v: ``[S, N]`` activation variances (``>= 0``), or ``None`` for deterministic activations.
        V: ``[N | 1, R]`` inducing points; lam: ``[N | 1]`` lengthscales; beta: ``[N | 1, R]``.

    Returns:
        ``[S, N]`` in the inputs' dtype (float32 or float64), differentiable w.r.t. all inputs
        (one fused backward kernel).
    """
    _require_triton()
    _check_inputs(TRITON_MEANVAR_DTYPES, mu=mu, v=v, V=V, lam=lam, beta=beta)
    _check_activations(mu, v)
    return _ResponseMean.apply(mu, v, V, lam, beta)


def fused_response_meanvar(
    mu: Tensor,
    v: Tensor,
    V: Tensor,
    lam: Tensor,
    beta: Tensor,
    C: Tensor,
    noise_var: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Output means and variances (``eq:gpn_normal_mu``, ``eq:gpn_normal_Sigmatilde``).

    ``mean = sum_r psi_r beta_r`` and
    ``var = max(0, 1 - sum_rt (C_rt - beta_r beta_t) Omega_rt - mean^2) + noise_var`` with
    ``psi`` and ``Omega`` of ``eq:gpn_normal_E_alpha`` and ``eq:gpn_normal_omega``. ``C`` enters
    through its symmetric part. The gradient of the ``max`` is that of ``clamp_min(0)``.

    Args:
        mu: ``[S, N]`` activation means.
        v: ``[S, N]`` activation variances (``>= 0``).
        V: ``[N | 1, R]`` inducing points.
        lam: ``[N | 1]`` lengthscales (``> 0``).
        beta: ``[N | 1, R]`` weights of the conditional mean.
        C: ``[N | 1, R, R]`` variance reduction of the conditional variance ``1 - a^T C a``.
        noise_var: ``[N | 1]`` output noise variance, or ``None``.

    A leading dimension 1 shares the parameter across the units (its gradient is summed).

    Returns:
        ``(mean, var)``, each ``[S, N]`` in the inputs' dtype (float32 or float64),
        differentiable w.r.t. every input.
    """
    _require_triton()
    _check_inputs(
        TRITON_MEANVAR_DTYPES, mu=mu, v=v, V=V, lam=lam, beta=beta, C=C, noise_var=noise_var
    )
    _check_activations(mu, v)
    return _ResponseMeanVar.apply(mu, v, V, lam, beta, C, noise_var)
