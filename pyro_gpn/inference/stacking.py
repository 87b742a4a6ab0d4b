"""Stacking fitted models' predictive distributions on held-out rows.

Choosing the one model of a portfolio that scores highest on a few dozen validation rows is
noisy: the winner's score is optimistic, and the winner can be an overconfident model (the
winner's curse; ``docs/results/uci.md`` section 28: boston split 3 chose a model whose 90 %
intervals then covered 71 % of the test rows). Stacking of predictive distributions (Yao,
Vehtari, Simpson and Gelman 2018, "Using stacking to average Bayesian predictive
distributions", Bayesian Analysis 13(3); after Wolpert 1992 and Breiman 1996) keeps every
model and mixes their predictives with the weights that maximise the held-out log score,

    ``w* = argmax_{w in simplex} sum_s log sum_k w_k p_k(y_s | x_s)``,

a concave problem in ``w``. :func:`stacking_weights` solves it by the EM iteration for mixture
weights with fixed components (each step raises the objective; Dempster, Laird and Rubin
1977), which needs no step size and keeps ``w`` on the simplex. scipy's general optimisers
solve the same problem (the tests compare), but a fixed-component EM is a few lines of tensor
algebra and needs nothing beyond torch. :func:`crossfitted_combination` compares choosing the
best model with stacking, both out of sample, on the same two halves of the held-out rows as
:func:`~pyro_gpn.inference.crossfitted_scores`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_ndim, check_tensor
from .calibration import crossfit_halves

__all__ = ["crossfitted_combination", "stacking_weights"]


def _check_log_densities(log_densities: Tensor, min_rows: int) -> Tensor:
    check_ndim("log_densities", check_tensor("log_densities", log_densities), 2)
    if log_densities.shape[0] < min_rows or log_densities.shape[1] < 1:
        raise ValueError(
            f"log_densities must be [S, K] with S >= {min_rows} rows and K >= 1 models, got "
            f"{tuple(log_densities.shape)}"
        )
    if bool(torch.isnan(log_densities).any()) or bool((log_densities == math.inf).any()):
        raise ValueError("log_densities must not hold NaN or +inf")
    if not bool(torch.isfinite(log_densities).any(1).all()):
        raise ValueError("every row of log_densities needs a finite density under some model")
    if not bool(torch.isfinite(log_densities).any(0).all()):
        raise ValueError(
            "every model (column of log_densities) needs a finite density on some row: drop "
            "failed models first"
        )
    return log_densities.double()


def stacking_weights(
    log_densities: Tensor, *, max_steps: int = 10_000, tol: float = 1e-12
) -> Tensor:
    """The stacking weights of ``K`` models on ``S`` held-out rows (module docstring).

    Args:
        log_densities: ``[S, K]``: ``log p_k(y_s | x_s)``, each model's log predictive density
            of each held-out row (``-inf`` allowed where a model gives a row no mass, NaN not).
        max_steps: the most EM steps.
        tol: stop once a step raises the mean log score by less than this.

    Returns:
        ``[K]`` float64 weights, non-negative and summing to 1 (a model that no mixture needs
        tends to 0 but, by EM, never reaches it exactly).

    Raises:
        ValueError: not ``[S, K]``, NaN or ``+inf``, or a model with no finite density.
    """
    log_p = _check_log_densities(log_densities, 1)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    if not (isinstance(tol, (int, float)) and not isinstance(tol, bool) and tol >= 0):
        raise ValueError(f"tol must be a non-negative number, got {tol!r}")
    num_rows, num_models = log_p.shape
    log_w = torch.full((num_models,), -math.log(num_models), dtype=log_p.dtype, device=log_p.device)
    score = -math.inf
    for _ in range(max_steps):
        joint = log_p + log_w  # [S, K]
        row = torch.logsumexp(joint, 1, keepdim=True)  # [S, 1]
        new_score = float(row.mean())
        # responsibilities r_sk = w_k p_sk / sum_j w_j p_sj; the new w_k is their mean
        log_w = torch.logsumexp(joint - row, 0) - math.log(num_rows)
        if new_score - score < tol:
            break
        score = new_score
    weights = log_w.exp()
    return weights / weights.sum()


def _mixed_score(log_densities: Tensor, weights: Tensor) -> float:
    """The mean of ``log sum_k w_k p_sk`` over the rows."""
    return float(torch.logsumexp(log_densities + weights.log(), 1).mean())


def crossfitted_combination(log_densities: Tensor) -> tuple[float, float]:
    """Choosing the best model against stacking, both scored out of sample: the rows are split
    into their even and odd rows; on one half the best model (highest mean log density) is
    chosen and the stacking weights fitted, and the other half scores both; then back. Each
    half's score is weighted by its share of the rows (as
    :func:`~pyro_gpn.inference.crossfitted_scores`).

    Args:
        log_densities: ``[S, K]`` held-out log densities (:func:`stacking_weights`), ``S >= 2``;
            a model with no finite density on one half takes no part in that half's fit.

    Returns:
        ``(best, stacked)``: the cross-fitted mean log density of the model chosen on the other
        half, and of the mixture stacked on the other half.
    """
    log_p = _check_log_densities(log_densities, 2)
    best, stacked = 0.0, 0.0
    for fit_rows, score_rows, share in crossfit_halves(log_p.shape[0]):
        fit, held = log_p[fit_rows], log_p[score_rows]
        chosen = int(torch.argmax(fit.mean(0)))
        best += share * float(held[:, chosen].mean())
        usable = torch.isfinite(fit).any(0)  # a model without mass on this half: weight 0
        weights = torch.zeros(log_p.shape[1], dtype=log_p.dtype, device=log_p.device)
        weights[usable] = stacking_weights(fit[:, usable])
        stacked += share * _mixed_score(held, weights)
    return best, stacked
