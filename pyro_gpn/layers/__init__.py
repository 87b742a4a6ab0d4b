"""GPN layers: one layer class built from parts (projection, inducing grid, response).

* :class:`GPNLayerBase` -- the layer; :class:`Response` -- how the virtual observations give the
  response weights;
* :class:`GPNLayer` -- with :class:`VirtualObservations` (targets and variances as parameters);
* :class:`VariationalGPNLayer` -- with :class:`VariationalTargets` (``q(U)`` and its KL).
"""

from .base import SHARE_OPTIONS, GPNLayerBase, Response
from .parametric import TARGET_INITS, GPNLayer, VirtualObservations
from .variational import VARIATIONAL_TARGET_INITS, VariationalGPNLayer, VariationalTargets

__all__ = [
    "SHARE_OPTIONS",
    "TARGET_INITS",
    "VARIATIONAL_TARGET_INITS",
    "GPNLayer",
    "GPNLayerBase",
    "Response",
    "VariationalGPNLayer",
    "VariationalTargets",
    "VirtualObservations",
]
