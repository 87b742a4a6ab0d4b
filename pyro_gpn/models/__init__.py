"""Pyro models of the GPN family (paper, Fig. ``fig:gpn_overview``) and the baselines.

* :class:`NonParametricGPN` -- GP prior over each unit's activation function, hidden outputs
  of all samples latent; exact joint for NUTS (route 1);
* :class:`ParametricGPN` -- virtual observations as parameters, sampled reparameterised
  layer-by-layer outputs, maximum likelihood by SVI (route 2);
* :class:`~pyro_gpn.GPNNet` -- the central-limit network, closed-form moments (route 3);
* :class:`VariationalGPN` -- GP prior on the targets, inducing-target guide, SVI with
  ``Trace_ELBO`` or :class:`~pyro_gpn.inference.ClosedFormELBO` (route 4);
* :class:`SampledTargetsGPN` -- the variational model's targets, weights and noise sampled
  (NUTS), activations in closed form; posterior size independent of the rows;
* :class:`NetworkEnsemble` -- the mixture of fitted networks' predictives, equal-weight or
  weighted (stacking);
* :class:`FixedActivationNet` -- tanh networks with (fast) dropout, the paper's baselines.
"""

from ..network import GPNNet
from .baselines import FixedActivationNet
from .ensemble import NetworkEnsemble
from .nonparametric import NonParametricGPN
from .parametric import ParametricGPN
from .sampled_targets import SampledTargetsGPN
from .variational import VariationalGPN

__all__ = [
    "FixedActivationNet",
    "GPNNet",
    "NetworkEnsemble",
    "NonParametricGPN",
    "ParametricGPN",
    "SampledTargetsGPN",
    "VariationalGPN",
]
