"""GPN layers: the shared base, the parametric layer and its variational twin."""

from .base import SHARE_OPTIONS, GPNLayerBase
from .parametric import TARGET_INITS, GPNLayer
from .variational import VariationalGPNLayer

__all__ = ["SHARE_OPTIONS", "TARGET_INITS", "GPNLayer", "GPNLayerBase", "VariationalGPNLayer"]
