r"""The unscented expected cross-entropy of diagonal Gaussian features on the fused CPU kernels,
and the log of the averaged softmax (the predictive) on the same pass.

:func:`cpu_unscented_cross_entropy` computes per sample the same value as
:func:`pyro_gpn.losses.unscented_cross_entropy` for features with diagonal moments
(``eq:gpn_normal_unscented``, sigma points in the space of the features): with
``centre = mu W + b`` the logits of point ``+-i`` are ``centre +- sqrt(N + kappa) sd_i W_{i*}``
(:func:`pyro_gpn.losses.unscented_logits`). The PyTorch path evaluates the log-softmax of
``S (2N + 1)`` rows of ``C`` logits in a chain of whole-tensor operations (concatenate, max,
subtract, exp, sum, log, gather, and their backward): with rows of only ``C = 26`` logits each
pass runs at a few ns per element, and the head of the paper's Letter network took as long as
its two GPN layers. Here one compiled pass per sample builds the points' logits, their
log-sum-exp (exponentials vectorised by :func:`~pyro_gpn.moments._numba_kernels.vexp`) and
softmax; the backward is one more pass over the stored softmax. With ``predictive`` the same
pass returns ``-log sum_i w_i softmax(A_i)[t]`` (:func:`pyro_gpn.losses.unscented_log_predictive`)
by a log-sum-exp over the points, and the backward weights each point by its share
``w_i softmax(A_i)[t] / sum_j w_j softmax(A_j)[t]`` instead of ``w_i``. Everything is computed
in float64; the result and gradients are returned in the inputs' dtypes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from .cpu_kernels import _numba_module
from .cpu_layer import _f64, _out

__all__ = ["cpu_unscented_cross_entropy"]


class _UnscentedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, centre, sd, weight, target, scale, w0, w1, predictive):
        S, C = centre.shape
        N = sd.shape[1]
        centre_, sd_, weight_ = _f64(centre), _f64(sd), _f64(weight)
        target_ = np.ascontiguousarray(target.detach().numpy(), dtype=np.int64)
        loss = np.empty(S)
        probs = np.empty((S, 2 * N + 1, C))
        resp = np.empty((S, 2 * N + 1))
        _numba_module("_numba_unscented").unscented_ce_fwd(
            centre_, sd_, weight_, target_, scale, w0, w1, predictive, loss, probs, resp
        )
        ctx.arrays = (sd_, weight_, target_, probs, resp)
        ctx.scale = scale
        ctx.like = (centre, sd, weight)
        return _out(loss, centre)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, gout):
        sd_, weight_, target_, probs, resp = ctx.arrays
        centre, sd, weight = ctx.like
        dcentre = np.empty((sd_.shape[0], weight_.shape[1]))
        dsd = np.empty(sd_.shape)
        dweight = np.zeros(weight_.shape)
        _numba_module("_numba_unscented").unscented_ce_bwd(
            sd_, weight_, target_, ctx.scale, resp, probs, _f64(gout), dcentre, dsd, dweight
        )
        need = ctx.needs_input_grad
        return (
            _out(dcentre, centre) if need[0] else None,
            _out(dsd, sd) if need[1] else None,
            _out(dweight, weight) if need[2] else None,
            None,
            None,
            None,
            None,
            None,
        )


def cpu_unscented_cross_entropy(
    centre: Tensor,
    sd: Tensor,
    weight: Tensor,
    target: Tensor,
    scale: float,
    w0: float,
    w1: float,
    predictive: bool = False,
) -> Tensor:
    """Per-sample unscented expected cross-entropy ``[S]`` (module docstring), or with
    ``predictive`` the negative log of the points' averaged softmax probability of the target
    (``-log sum_i w_i softmax(A_i)[t]``, :func:`pyro_gpn.losses.unscented_log_predictive`;
    the weights must not be negative).

    Args:
        centre: ``[S, C]`` logits of the features' mean, ``mu W + b``.
        sd: ``[S, N]`` standard deviations of the features.
        weight: ``[N, C]`` map from the features to the logits.
        target: ``[S]`` integer class labels in ``[0, C)`` (not checked here: the caller,
            :func:`pyro_gpn.losses.unscented_cross_entropy`, checks them).
        scale: ``sqrt(N + kappa)``; w0, w1: the centre's and every other point's weight.
        predictive: the negative log predictive instead of the expected cross-entropy.

    Returns:
        ``[S]`` in ``centre``'s dtype, differentiable w.r.t. ``centre``, ``sd`` and ``weight``.
    """
    if predictive and min(w0, w1) < 0:
        raise ValueError(
            f"the predictive needs non-negative point weights, got w0 = {w0}, w1 = {w1}"
        )
    return _UnscentedCrossEntropy.apply(
        centre, sd, weight, target, float(scale), float(w0), float(w1), bool(predictive)
    )
