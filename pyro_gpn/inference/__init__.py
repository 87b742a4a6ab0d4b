"""Inference for the GPN models: NUTS, SVI, the closed-form ELBO and the deterministic trainer."""

from .closed_form import ClosedFormELBO, closed_form_elbo
from .mcmc import NUTSResult, run_nuts
from .svi import SVIResult, fit_svi
from .trainer import TrainConfig, Trainer, TrainResult, evaluate, seed_everything

__all__ = [
    "ClosedFormELBO",
    "NUTSResult",
    "SVIResult",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "closed_form_elbo",
    "evaluate",
    "fit_svi",
    "run_nuts",
    "seed_everything",
]
