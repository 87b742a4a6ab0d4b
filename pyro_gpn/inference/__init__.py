"""Inference for the GPN models: NUTS, SVI, the closed-form ELBO and the deterministic trainer."""

from .closed_form import ClosedFormELBO, closed_form_elbo
from .distributed import DistConfig, fit_distributed, init_distributed
from .mcmc import NUTSResult, run_nuts
from .svi import SVIResult, fit_svi
from .trainer import TrainConfig, Trainer, TrainResult, evaluate, seed_everything

__all__ = [
    "ClosedFormELBO",
    "DistConfig",
    "NUTSResult",
    "SVIResult",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "closed_form_elbo",
    "evaluate",
    "fit_distributed",
    "fit_svi",
    "init_distributed",
    "run_nuts",
    "seed_everything",
]
