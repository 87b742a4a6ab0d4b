"""The default dtype of the GPN moment algebra (issue 13, ``docs/results/accuracy.md``).

* :data:`DEFAULT_COMPUTE_DTYPE` -- float64. With the stable algebra of
  :func:`pyro_gpn.moments.response_moments` (quadrature variance in the narrow regime,
  Cholesky factors instead of an explicit ``C``) float64 is accurate to 6.5e-7 relative (variance)
  and 1.1e-7 (mean) against quadrature over the whole grid, lengthscales up to 16 inducing
  spacings and target variances down to 1e-6.
* float32 is accurate to 1e-4 only while the target variances stay >= 0.1 (all lengthscales)
  or >= 0.01 with lengthscale / spacing <= 1.3. Trained networks leave that range: a Letter GPN
  after 150 epochs had target variances down to 3.6e-4, lengthscales up to 11.9 inducing
  spacings and output noise variances ~1e-7, where float32 (new algebra) was off by 6.3e-4
  relative in the variance (the old algebra: 0.25-0.30). The floor is float32 itself: the
  conditional variance ``1 - |L^-1 alpha|^2`` of a nearly noise-free unit is ~1e-4 and float32
  resolves 1 - q only to ~6e-8.
"""

from __future__ import annotations

import torch

__all__ = ["DEFAULT_COMPUTE_DTYPE", "FLOAT32_MIN_TARGET_VARIANCE"]

#: The compute dtype of the layers' GP algebra by default (``GPNLayerBase(compute_dtype=...)``).
DEFAULT_COMPUTE_DTYPE: torch.dtype = torch.float64

#: Smallest target variance ``S`` at which float32 met 1e-4 relative for every lengthscale of the
#: accuracy grid (up to 16 inducing spacings); at ``S = 0.01`` only up to 1.3 spacings.
FLOAT32_MIN_TARGET_VARIANCE: float = 0.1
