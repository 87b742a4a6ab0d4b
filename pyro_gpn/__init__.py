"""pyro_gpn: Gaussian Process Neurons on PyTorch and Pyro.

Neurons whose activation function is learned, with a Gaussian-process prior over it
("Gaussian Process Neurons Learn Stochastic Activation Functions"). See the README for a tour.
"""

from .kernels import gpn_kernel, squared_exponential
from .layers import GPNLayer
from .moments import Moments
from .network import GPNNet

__version__ = "0.1.0"

__all__ = [
    "GPNLayer",
    "GPNNet",
    "Moments",
    "gpn_kernel",
    "load_run",
    "squared_exponential",
    "__version__",
]


def __getattr__(name: str):
    """``pyro_gpn.load_run`` (:func:`pyro_gpn.experiments.saved.load_run`), imported on first
    use so that importing the core does not import the orchestration package."""
    if name == "load_run":
        from .experiments.saved import load_run

        return load_run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
