"""pyro_gpn: Gaussian Process Neurons on PyTorch and Pyro.

Neurons whose activation function is learned, with a Gaussian-process prior over it
("Gaussian Process Neurons Learn Stochastic Activation Functions"). See the README for a tour.
"""

from .kernels import gpn_kernel, squared_exponential
from .layers import GPNLayer
from .moments import Moments
from .network import GPNNet

__version__ = "0.1.0"

__all__ = ["GPNLayer", "GPNNet", "Moments", "gpn_kernel", "squared_exponential", "__version__"]
