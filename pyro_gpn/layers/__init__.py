"""GPN layers: one layer class built from parts (projection, inducing grid, response).

* :class:`GPNLayerBase` -- the layer; :class:`Response` -- how the virtual observations give the
  response weights;
* :class:`GPNLayer` -- with :class:`VirtualObservations` (targets and variances as parameters);
* :class:`VariationalGPNLayer` -- with :class:`VariationalTargets` (``q(U)`` and its KL);
* :class:`GPNConv2d`, :class:`GPNRecurrent` (and their variational twins) -- convolutional and
  recurrent GPN layers; :class:`MomentAvgPool2d`, :class:`MomentFlatten`, :class:`MomentLinear`
  -- the linear blocks between them (for :class:`pyro_gpn.sequential.GPNSequential`).
"""

from .base import SHARE_OPTIONS, GPNLayerBase, Response
from .conv import GPNConv2d, VariationalGPNConv2d
from .linear import MomentAvgPool2d, MomentFlatten, MomentLinear
from .parametric import TARGET_INITS, GPNLayer, VirtualObservations
from .recurrent import GPNRecurrent, VariationalGPNRecurrent
from .variational import VARIATIONAL_TARGET_INITS, VariationalGPNLayer, VariationalTargets

__all__ = [
    "SHARE_OPTIONS",
    "TARGET_INITS",
    "VARIATIONAL_TARGET_INITS",
    "GPNConv2d",
    "GPNLayer",
    "GPNLayerBase",
    "GPNRecurrent",
    "MomentAvgPool2d",
    "MomentFlatten",
    "MomentLinear",
    "Response",
    "VariationalGPNConv2d",
    "VariationalGPNRecurrent",
    "VariationalGPNLayer",
    "VariationalTargets",
    "VirtualObservations",
]
