"""The :class:`Moments` container: first and second moments of a batch of random vectors.

A GPN network in the central-limit approximation (paper, section "Central Limit Activations")
does not pass values from layer to layer but the mean and the (co)variance of each sample's
activations. :class:`Moments` holds them:

* ``mean``: ``[S, N]``, the mean of ``S`` independent samples of an ``N``-dimensional vector;
* ``var``:  ``[S, N]``, the per-dimension variances (the diagonal), or ``None``;
* ``cov``:  ``[S, N, N]``, the full covariance of each sample, or ``None``.

At most one of ``var`` and ``cov`` is given. With neither, the vector is deterministic (a point
mass at ``mean``); this is how a network receives observed inputs and how the paper's "mean only"
mode works.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .._validation import (
    check_finite,
    check_ndim,
    check_nonnegative,
    check_psd,
    check_same_dtype_device,
    check_shape,
    check_tensor,
)

__all__ = ["Moments"]


@dataclass(frozen=True, eq=False)
class Moments:
    """Mean and variance (or full covariance) of ``S`` independent ``N``-dimensional vectors.

    Args:
        mean: ``[S, N]`` means.
        var: ``[S, N]`` variances (non-negative), or ``None``.
        cov: ``[S, N, N]`` covariances (symmetric positive semi-definite), or ``None``.
        validate: check shapes, finiteness and positivity (default). Library internals that
            produce moments from already-checked inputs pass ``False``.

    Raises:
        ValueError: naming the argument, for a wrong shape, a NaN or infinite entry, a negative
            variance or a covariance that is not symmetric positive semi-definite.
    """

    mean: Tensor
    var: Tensor | None = None
    cov: Tensor | None = None

    def __init__(
        self,
        mean: Tensor,
        var: Tensor | None = None,
        cov: Tensor | None = None,
        validate: bool = True,
    ) -> None:
        if validate:
            check_tensor("mean", mean)
            check_ndim("mean", mean, 2)
            if var is not None and cov is not None:
                raise ValueError("give at most one of var and cov")
            if var is not None:
                check_tensor("var", var)
            if cov is not None:
                check_tensor("cov", cov)
            check_same_dtype_device("mean", mean, {"var": var, "cov": cov})
            check_finite("mean", mean)
            if var is not None:
                check_shape("var", var, tuple(mean.shape))
                check_nonnegative("var", var)
            if cov is not None:
                check_shape("cov", cov, (mean.shape[0], mean.shape[1], mean.shape[1]))
                check_psd("cov", cov)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "var", var)
        object.__setattr__(self, "cov", cov)

    # ------------------------------------------------------------------ properties
    @property
    def num_samples(self) -> int:
        return self.mean.shape[0]

    @property
    def num_features(self) -> int:
        return self.mean.shape[1]

    @property
    def is_deterministic(self) -> bool:
        """True when no variance or covariance is carried (a point mass at ``mean``)."""
        return self.var is None and self.cov is None

    @property
    def variance(self) -> Tensor:
        """``[S, N]`` per-dimension variances: ``var``, the diagonal of ``cov``, or zeros."""
        if self.var is not None:
            return self.var
        if self.cov is not None:
            return torch.diagonal(self.cov, dim1=-2, dim2=-1)
        return torch.zeros_like(self.mean)

    @property
    def covariance(self) -> Tensor:
        """``[S, N, N]`` covariances: ``cov``, ``diag(var)``, or zeros."""
        if self.cov is not None:
            return self.cov
        return torch.diag_embed(self.variance)

    @property
    def second_moment(self) -> Tensor:
        """``[S, N]`` raw second moments ``E[x^2] = var + mean^2``."""
        return self.variance + self.mean.square()

    # ------------------------------------------------------------------ transforms
    def linear(self, weight: Tensor, bias: Tensor | None = None) -> Moments:
        """Moments of ``x @ weight + bias`` (paper ``eq:gpn_normal_a``).

        ``weight`` is ``[N, M]``. The mean is ``mean @ weight``; a diagonal input gives a diagonal
        output (``var @ weight**2``, the paper's "mean and variance" mode, which drops the
        correlations the projection creates); a full covariance gives ``W^T cov W``.
        """
        self._check_weight(weight, bias)
        mean = self.mean @ weight
        if bias is not None:
            mean = mean + bias
        if self.cov is not None:
            cov = weight.mT @ self.cov @ weight
            return Moments(mean, cov=0.5 * (cov + cov.mT), validate=False)
        if self.var is not None:
            return Moments(mean, var=self.var @ weight.square(), validate=False)
        return Moments(mean, validate=False)

    def linear_full(self, weight: Tensor, bias: Tensor | None = None) -> Moments:
        """Like :meth:`linear` but keeps the correlations: ``cov = W^T diag(var) W``."""
        if self.var is None or self.cov is not None:
            return self.linear(weight, bias)
        self._check_weight(weight, bias)
        mean = self.mean @ weight
        if bias is not None:
            mean = mean + bias
        cov = (weight.mT * self.var.unsqueeze(-2)) @ weight
        return Moments(mean, cov=0.5 * (cov + cov.mT), validate=False)

    def _check_weight(self, weight: Tensor, bias: Tensor | None) -> None:
        """Form checks of :meth:`linear`'s arguments (no device synchronisation)."""
        check_tensor("weight", weight)
        check_shape("weight", weight, (self.num_features, None))
        check_same_dtype_device("the moments' mean", self.mean, {"weight": weight, "bias": bias})

    def diagonal(self) -> Moments:
        """Drop the off-diagonal covariances (keep mean and variances)."""
        if self.cov is None:
            return self
        return Moments(self.mean, var=self.variance, validate=False)

    def to(self, *args, **kwargs) -> Moments:
        conv = lambda t: None if t is None else t.to(*args, **kwargs)
        return Moments(conv(self.mean), conv(self.var), conv(self.cov), validate=False)

    def detach(self) -> Moments:
        det = lambda t: None if t is None else t.detach()
        return Moments(det(self.mean), det(self.var), det(self.cov), validate=False)

    def __getitem__(self, index) -> Moments:
        """Select samples (the first dimension)."""
        pick = lambda t: None if t is None else t[index]
        mean = self.mean[index]
        if mean.dim() == 1:
            raise IndexError("Moments indexing must keep the sample dimension (use a slice)")
        return Moments(mean, pick(self.var), pick(self.cov), validate=False)

    def __repr__(self) -> str:
        kind = "cov" if self.cov is not None else "var" if self.var is not None else "point"
        return f"Moments(samples={self.num_samples}, features={self.num_features}, {kind})"
