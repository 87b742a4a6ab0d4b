"""pyro_gpn: Gaussian Process Neurons on PyTorch and Pyro.

Neurons whose activation function is learned, with a Gaussian-process prior over it:

    S. Urban, M. Basalla, P. van der Smagt, "Gaussian Process Neurons Learn Stochastic
    Activation Functions", arXiv:1711.11059 (2017).

Docstrings cite the paper's equations by their LaTeX labels (``eq:gpn_vi_mu``, ...), which refer
to the paper's LaTeX source (the arXiv source files). See the README for a tour and
``docs/architecture.md`` for the layout.
"""

from . import settings
from ._validation import UnscaledInputWarning
from .heads import (
    GaussianHead,
    HeteroscedasticGaussianHead,
    Prediction,
    SoftmaxHead,
    StudentTHead,
)
from .kernels import gpn_kernel, squared_exponential
from .layers import GPNLayer, VariationalGPNLayer
from .moments import Moments
from .network import GPNNet
from .sequential import GPNSequential

__version__ = "0.1.0"

__all__ = [
    "GPNLayer",
    "GPNNet",
    "GPNSequential",
    "GaussianHead",
    "HeteroscedasticGaussianHead",
    "Moments",
    "Prediction",
    "SoftmaxHead",
    "StudentTHead",
    "UnscaledInputWarning",
    "VariationalGPNLayer",
    "__version__",
    "gpn_kernel",
    "load_run",
    "settings",
    "squared_exponential",
]


def __getattr__(name: str):
    """``pyro_gpn.load_run`` (:func:`pyro_gpn.experiments.saved.load_run`), imported on first
    use so that importing the core does not import the orchestration package."""
    if name == "load_run":
        from .experiments.saved import load_run

        return load_run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
