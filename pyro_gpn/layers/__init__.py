"""GPN layers: the parametric layer and the shared base class."""

from .base import SHARE_OPTIONS, GPNLayerBase
from .parametric import TARGET_INITS, GPNLayer

__all__ = ["SHARE_OPTIONS", "TARGET_INITS", "GPNLayer", "GPNLayerBase"]
