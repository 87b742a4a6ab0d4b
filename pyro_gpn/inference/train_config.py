"""The settings and the outcome of a :class:`~pyro_gpn.inference.trainer.Trainer` run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._validation import check_int

__all__ = ["TrainConfig", "TrainResult"]

_TASKS = ("classification", "regression")
# fields that may change between a run and its resumption without changing its trajectory
# (seed: a resumed run restores the generators' states instead of seeding them); a change of
# any other field refuses to resume (checkpoint.check_resume_settings)
_RESUMABLE_CHANGES = {"max_epochs", "seed", "progress", "out_dir", "device", "eval_batch_size"}


@dataclass
class TrainConfig:
    """Hyper-parameters of :class:`Trainer` (defaults: the paper's schedule).

    Attributes:
        lr: initial Adam learning rate (paper: ``1e-3``).
        batch_size: mini-batch size.
        max_epochs: hard limit on the number of epochs.
        patience: evaluations without improvement of the validation loss before the learning
            rate is multiplied by ``lr_factor``.
        lr_factor: learning-rate reduction factor (paper: ``0.1``).
        min_lr: smallest learning rate (paper: ``1e-6``); a further reduction ends training.
        eval_every: epochs between validation evaluations (the last epoch is always evaluated).
        seed: a non-negative integer (NumPy's generators refuse negative seeds); seeds
            ``torch``, ``numpy``, ``random`` and the shuffling generator at the start of a
            fresh run (model initialisation happens before, under the caller's seed); a resumed
            run restores the generators' states instead, whatever ``seed`` it is given.
        device: ``"cpu"`` or ``"cuda"`` (or ``"cuda:<index>"``).
        task: ``"classification"`` or ``"regression"`` for the reported metrics; ``None`` infers
            it from the targets (integer: classification, floating: regression).
        out_dir: directory for checkpoints and metrics (``None``: nothing is written and
            resumption is impossible).
        progress: show a ``tqdm`` progress bar over epochs.
        eval_batch_size: batch size for the validation pass (memory only, not results).
    """

    lr: float = 1e-3
    batch_size: int = 128
    max_epochs: int = 1000
    patience: int = 10
    lr_factor: float = 0.1
    min_lr: float = 1e-6
    eval_every: int = 1
    seed: int = 0
    device: str = "cpu"
    task: str | None = None
    out_dir: str | None = None
    progress: bool = True
    eval_batch_size: int = 4096

    def __post_init__(self) -> None:
        # NumPy scalars become Python numbers here, not only in the checkpoint: a resumed run
        # reads the checkpoint's Python float, and an uninterrupted one must step with the
        # same value (np.float32(0.1) is 0.10000000149011612 as a float, and Adam's step
        # arithmetic in float32 would differ from a resumed run's in float64)
        for name in (
            "lr",
            "lr_factor",
            "min_lr",
            "batch_size",
            "max_epochs",
            "patience",
            "eval_every",
            "seed",
            "eval_batch_size",
        ):
            value = getattr(self, name)
            if isinstance(value, np.generic):
                setattr(self, name, value.item())
        for name in ("batch_size", "max_epochs", "eval_every", "eval_batch_size"):
            setattr(self, name, check_int(name, getattr(self, name), 1))
        self.patience = check_int("patience", self.patience, 0)
        self.seed = check_int("seed", self.seed, 0)
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not (math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"min_lr must lie in [0, lr], got {self.min_lr}")
        if not 0 < self.lr_factor < 1:
            raise ValueError(f"lr_factor must lie in (0, 1), got {self.lr_factor}")
        if self.task is not None and self.task not in _TASKS:
            raise ValueError(f"task must be one of {_TASKS} or None, got {self.task!r}")
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}") from None
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")


@dataclass
class TrainResult:
    """Outcome of :meth:`Trainer.fit`.

    Attributes:
        history: one dict per epoch (see :meth:`Trainer.fit` for the keys).
        best_epoch: the epoch whose parameters were restored (0 if none was evaluated).
        best_val_loss: its validation loss.
        epochs: number of completed epochs.
        stop_reason: ``"min_lr"`` (the schedule ran out) or ``"max_epochs"``.
    """

    history: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int = 0
    best_val_loss: float = math.inf
    epochs: int = 0
    stop_reason: str = "max_epochs"
