"""The math core of pyro_gpn: pure functions on tensors, free of Pyro and of training code.

* :class:`Moments` -- mean and variance (or covariance) of a batch of random vectors;
* :mod:`~pyro_gpn.moments.expectations` -- psi, Omega, Lambda: expectations of SE kernels
  under Gaussian activations (``eq:gpn_normal_E_alpha``, ``eq:gpn_normal_omega``,
  ``eq:gpn_normal_lambda``);
* :mod:`~pyro_gpn.moments.propagate` -- one GPN layer from activation moments to output moments
  (its parts: :mod:`~pyro_gpn.moments.weights` parameter-only weights,
  :mod:`~pyro_gpn.moments.midpoint` Gaussian sums, :mod:`~pyro_gpn.moments.quadrature` the
  narrow-regime variance, :mod:`~pyro_gpn.moments.cross` the off-diagonal covariances;
  :mod:`~pyro_gpn.moments.backend` chooses the fused CPU or Triton kernels).
"""

from .expectations import (
    expected_cross_kernel_product,
    expected_kernel,
    expected_kernel_product,
)
from .gaussian import Moments
from .precision import DEFAULT_COMPUTE_DTYPE
from .propagate import (
    MODES,
    Mode,
    gaussian_sum,
    midpoint_expansion,
    response_moments,
    virtual_observation_weights,
)

__all__ = [
    "DEFAULT_COMPUTE_DTYPE",
    "MODES",
    "Mode",
    "Moments",
    "expected_cross_kernel_product",
    "expected_kernel",
    "expected_kernel_product",
    "gaussian_sum",
    "midpoint_expansion",
    "response_moments",
    "virtual_observation_weights",
]
