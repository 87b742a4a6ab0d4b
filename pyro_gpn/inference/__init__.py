"""Inference for the GPN models: NUTS, SVI, the closed-form ELBO and the deterministic trainer."""

from .calibration import crossfitted_scores, fit_predictive_scale, predictive_scale_of
from .closed_form import (
    ClosedFormELBO,
    VGPNFit,
    closed_form_elbo,
    fit_vgpn,
    predictive_log_likelihood,
)
from .distributed import DistContext, init_distributed
from .mcmc import NUTSResult, run_nuts
from .selection import VGPNSelection, crossfitted_stacked_scores, select_vgpn
from .stacking import crossfitted_combination, stacking_weights
from .svi import SVIResult, fit_svi
from .trainer import TrainConfig, Trainer, TrainResult, evaluate, seed_everything

__all__ = [
    "ClosedFormELBO",
    "DistContext",
    "NUTSResult",
    "SVIResult",
    "TrainConfig",
    "TrainResult",
    "VGPNFit",
    "VGPNSelection",
    "Trainer",
    "closed_form_elbo",
    "crossfitted_combination",
    "crossfitted_scores",
    "crossfitted_stacked_scores",
    "evaluate",
    "fit_predictive_scale",
    "fit_svi",
    "predictive_scale_of",
    "fit_vgpn",
    "predictive_log_likelihood",
    "init_distributed",
    "run_nuts",
    "select_vgpn",
    "seed_everything",
    "stacking_weights",
]
