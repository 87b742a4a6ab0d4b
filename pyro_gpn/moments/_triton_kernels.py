r"""The Triton kernels of :mod:`pyro_gpn.moments.fused` (formulas, tiling and the backward
derivation: see that module). Plain functions, jitted by :func:`pyro_gpn.moments.fused._jit` on
first use; ``tl`` and ``triton`` are set here by :func:`pyro_gpn.moments.fused._require_triton`
when Triton is first imported (Triton resolves a kernel's globals in its defining module)."""

from __future__ import annotations

triton = None
tl = None

__all__: list[str] = []


# ---------------------------------------------------------------------------------------------
# Triton kernels. They are plain functions here and go through ``triton.jit`` on first use
# (``_jit``), after ``_require_triton`` has imported Triton; with ``from __future__ import
# annotations`` their ``tl.constexpr`` annotations are strings, which Triton accepts. They call
# no helper functions, which would need a ``triton.jit`` of their own at import time.
# ---------------------------------------------------------------------------------------------


def _meanvar_fwd_kernel(
    mu_ptr,  # [S, N]
    v_ptr,  # [S, N]
    V_ptr,  # [N | 1, R]
    lam_ptr,  # [N | 1]
    beta_ptr,  # [N | 1, R]
    C_ptr,  # [N | 1, R, R]
    noise_ptr,  # [N | 1]
    mean_ptr,  # out [S, N]
    var_ptr,  # out [S, N]
    pre_ptr,  # out [S, N], the variance before max(0, .) and noise
    S,
    N,
    R,
    V_us,  # unit strides: 0 for a parameter shared by the layer
    lam_us,
    beta_us,
    C_us,
    noise_us,
    WITH_VAR: tl.constexpr,
    HAS_NOISE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    pid_s = tl.program_id(0)
    n = tl.program_id(1)
    s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    smask = s < S
    r = tl.arange(0, BLOCK_R)
    rmask = r < R
    x_off = s.to(tl.int64) * N + n

    mu = tl.load(mu_ptr + x_off, mask=smask, other=0.0)
    v = tl.load(v_ptr + x_off, mask=smask, other=0.0)
    lam = tl.load(lam_ptr + n * lam_us)
    lam2 = lam * lam
    Vr = tl.load(V_ptr + n * V_us + r, mask=rmask, other=0.0)
    beta = tl.load(beta_ptr + n * beta_us + r, mask=rmask, other=0.0)  # 0 in the padding

    # psi [BLOCK_S, R_p] (eq:gpn_normal_E_alpha) and the mean (eq:gpn_normal_mu)
    inv_c1 = 1.0 / (lam2 + v)
    d = mu[:, None] - Vr[None, :]
    psi = tl.sqrt(lam2 * inv_c1)[:, None] * tl.exp(-0.5 * d * d * inv_c1[:, None])
    mean = tl.sum(psi * beta[None, :], axis=1)
    tl.store(mean_ptr + x_off, mean, mask=smask)

    if WITH_VAR:
        # Q = sym(C) - beta beta^T, zero in the padding
        rr = r[:, None]
        tt = r[None, :]
        cmask = (rr < R) & (tt < R)
        C_n = C_ptr + n * C_us
        C = tl.load(C_n + rr * R + tt, mask=cmask, other=0.0)
        Ct = tl.load(C_n + tt * R + rr, mask=cmask, other=0.0)
        Q = 0.5 * (C + Ct) - beta[:, None] * beta[None, :]
        mid = 0.5 * (Vr[:, None] + Vr[None, :])
        f = Vr[:, None] - Vr[None, :]
        sep = f * f / (4.0 * lam2)
        # Omega [BLOCK_S, R_p, R_p] (eq:gpn_normal_omega)
        inv_c2 = 1.0 / (lam2 + 2.0 * v)
        e = mu[:, None, None] - mid[None, :, :]
        omega = tl.sqrt(lam2 * inv_c2)[:, None, None] * tl.exp(
            -e * e * inv_c2[:, None, None] - sep[None, :, :]
        )
        trace = tl.sum(tl.sum(Q[None, :, :] * omega, axis=2), axis=1)
        # eq:gpn_normal_Sigmatilde
        pre = 1.0 - trace - mean * mean
        var = tl.maximum(pre, 0.0)
        if HAS_NOISE:
            var += tl.load(noise_ptr + n * noise_us)
        tl.store(var_ptr + x_off, var, mask=smask)
        tl.store(pre_ptr + x_off, pre, mask=smask)


def _meanvar_bwd_kernel(
    mu_ptr,  # [S, N]
    v_ptr,  # [S, N]
    V_ptr,  # [N | 1, R]
    lam_ptr,  # [N | 1]
    beta_ptr,  # [N | 1, R]
    C_ptr,  # [N | 1, R, R]
    mean_ptr,  # [S, N] forward output
    pre_ptr,  # [S, N] forward unclamped variance
    gmean_ptr,  # [S, N] dL/d mean
    gvar_ptr,  # [S, N] dL/d var
    dmu_ptr,  # out [S, N]
    dv_ptr,  # out [S, N]
    dV_ptr,  # out [P, N, R] partial sums over the samples of each chunk
    dlam_ptr,  # out [P, N]
    dbeta_ptr,  # out [P, N, R]
    dC_ptr,  # out [P, N, R, R]
    S,
    N,
    R,
    V_us,
    lam_us,
    beta_us,
    C_us,
    blocks_per_prog,
    WITH_VAR: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_R: tl.constexpr,
    ACC: tl.constexpr,  # accumulator dtype: the inputs' (tl.float32 or tl.float64)
):
    chunk = tl.program_id(0)
    n = tl.program_id(1)
    r = tl.arange(0, BLOCK_R)
    rmask = r < R
    lam = tl.load(lam_ptr + n * lam_us)
    lam2 = lam * lam
    inv_lam = 1.0 / lam
    Vr = tl.load(V_ptr + n * V_us + r, mask=rmask, other=0.0)
    beta = tl.load(beta_ptr + n * beta_us + r, mask=rmask, other=0.0)
    rr = r[:, None]
    tt = r[None, :]
    cmask = (rr < R) & (tt < R)
    if WITH_VAR:
        C_n = C_ptr + n * C_us
        C = tl.load(C_n + rr * R + tt, mask=cmask, other=0.0)
        Ct = tl.load(C_n + tt * R + rr, mask=cmask, other=0.0)
        Q = 0.5 * (C + Ct) - beta[:, None] * beta[None, :]
        mid = 0.5 * (Vr[:, None] + Vr[None, :])
        f = Vr[:, None] - Vr[None, :]
        sep = f * f / (4.0 * lam2)
        f_half = f / (2.0 * lam2)

    acc_dV = tl.zeros([BLOCK_R], dtype=ACC)
    acc_dbeta = tl.zeros([BLOCK_R], dtype=ACC)
    acc_dlam = tl.zeros([BLOCK_S], dtype=ACC)
    acc_dC = tl.zeros([BLOCK_R, BLOCK_R], dtype=ACC)
    for i in range(0, blocks_per_prog):
        s = (chunk * blocks_per_prog + i) * BLOCK_S + tl.arange(0, BLOCK_S)
        smask = s < S
        x_off = s.to(tl.int64) * N + n
        mu = tl.load(mu_ptr + x_off, mask=smask, other=0.0)
        v = tl.load(v_ptr + x_off, mask=smask, other=0.0)
        gm = tl.load(gmean_ptr + x_off, mask=smask, other=0.0)
        if WITH_VAR:
            mean = tl.load(mean_ptr + x_off, mask=smask, other=0.0)
            pre = tl.load(pre_ptr + x_off, mask=smask, other=0.0)
            gv = tl.load(gvar_ptr + x_off, mask=smask, other=0.0)
            G = tl.where(pre >= 0.0, gv, 0.0)  # d var / d pre = 1[pre >= 0] (as clamp_min)
            gme = gm - 2.0 * G * mean  # total dL/d mean, including the -mean^2 term
        else:
            gme = gm

        # psi terms: wp = dL/dpsi * psi; d log psi / d(mu, v, V, lambda) in closed form
        inv_c1 = 1.0 / (lam2 + v)
        d = mu[:, None] - Vr[None, :]
        dq = d * inv_c1[:, None]
        psi = tl.sqrt(lam2 * inv_c1)[:, None] * tl.exp(-0.5 * d * dq)
        wp = gme[:, None] * beta[None, :] * psi
        dmu = -tl.sum(wp * dq, axis=1)
        dv = tl.sum(wp * (0.5 * dq * dq - 0.5 * inv_c1[:, None]), axis=1)
        acc_dV += tl.sum(wp * dq, axis=0)
        acc_dlam += tl.sum(wp * (inv_lam - lam * inv_c1[:, None] + lam * dq * dq), axis=1)
        acc_dbeta += tl.sum(gme[:, None] * psi, axis=0)

        if WITH_VAR:
            # Omega terms: W = dL/dOmega * Omega = -G Q Omega (symmetric in r, t)
            inv_c2 = 1.0 / (lam2 + 2.0 * v)
            e = mu[:, None, None] - mid[None, :, :]
            eq = e * inv_c2[:, None, None]
            omega = tl.sqrt(lam2 * inv_c2)[:, None, None] * tl.exp(-e * eq - sep[None, :, :])
            Go = G[:, None, None] * omega
            W = -Go * Q[None, :, :]
            dmu += tl.sum(tl.sum(W * (-2.0 * eq), axis=2), axis=1)
            dv += tl.sum(tl.sum(W * (2.0 * eq * eq - inv_c2[:, None, None]), axis=2), axis=1)
            dlog_lam = (
                inv_lam
                - lam * inv_c2[:, None, None]
                + 2.0 * lam * eq * eq
                + 2.0 * inv_lam * sep[None, :, :]
            )
            acc_dlam += tl.sum(tl.sum(W * dlog_lam, axis=2), axis=1)
            # d log Omega_rt / d V_r = e / c2 - (V_r - V_t) / (2 lambda^2); W_rt = W_tr
            acc_dV += 2.0 * tl.sum(tl.sum(W * (eq - f_half[None, :, :]), axis=0), axis=1)
            sum_Go = tl.sum(Go, axis=0)
            acc_dbeta += 2.0 * tl.sum(sum_Go * beta[None, :], axis=1)
            acc_dC -= sum_Go

        tl.store(dmu_ptr + x_off, dmu, mask=smask)
        tl.store(dv_ptr + x_off, dv, mask=smask)

    part = chunk * N + n
    tl.store(dV_ptr + part * R + r, acc_dV, mask=rmask)
    tl.store(dbeta_ptr + part * R + r, acc_dbeta, mask=rmask)
    tl.store(dlam_ptr + part, tl.sum(acc_dlam, axis=0))
    if WITH_VAR:
        tl.store(dC_ptr + part * R * R + rr * R + tt, acc_dC, mask=cmask)
