"""Mini-batch training with the paper's learning-rate schedule, checkpoints and resumption.

The paper trains every network the same way (section "Maximum Likelihood Training of Parametric
GPNs", "Training"): Adam at a learning rate of ``1e-3``, divided by 10 each time the validation
loss stops improving, training ends when the learning rate has reached ``1e-6`` and the
validation loss still does not improve, and the parameters of the best validation iteration are
kept. :class:`Trainer` implements exactly that for any model that exposes

* ``model.loss(x, y) -> Tensor``: the mean training objective of a mini-batch,
* ``model.penalty() -> Tensor``: a regulariser added once per step (``eq:gpn_ls`` for GPNs),
* ``model(x) -> Moments``: predictions (logit moments or the Gaussian predictive), used by
  :func:`evaluate`,

plus the usual ``torch.nn.Module`` methods: :class:`pyro_gpn.GPNNet`,
:class:`pyro_gpn.models.baselines.FixedActivationNet` and any user module.

The schedule is :class:`torch.optim.lr_scheduler.ReduceLROnPlateau` (``factor=0.1``, ``patience``
counted in evaluations, default relative threshold ``1e-4``); training stops at the first
evaluation where the scheduler calls for a reduction that ``min_lr`` no longer allows, or after
``max_epochs``. Every epoch writes a checkpoint (model, optimizer, scheduler, the random number
generator states, the best parameters so far and the metrics history) atomically, so that
``fit(..., resume=True)`` after a crash or a kill continues bit-for-bit where the last completed
epoch left off: the finished run equals an uninterrupted one.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .. import settings
from .._validation import check_finite, check_ndim, check_tensor
from ..metrics import classification_error, gaussian_log_likelihood, mean_squared_error

__all__ = ["TrainConfig", "TrainResult", "Trainer", "evaluate", "seed_everything"]

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
BEST_MODEL_NAME = "best_model.pt"
METRICS_CSV_NAME = "metrics.csv"
METRICS_JSON_NAME = "metrics.json"
_TASKS = ("classification", "regression")
# fields that may change between a run and its resumption without changing its trajectory
_RESUMABLE_CHANGES = {"max_epochs", "progress", "out_dir", "device", "eval_batch_size"}


# ---------------------------------------------------------------------------------- config
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
        seed: seeds ``torch``, ``numpy``, ``random`` and the shuffling generator at the start of a
            fresh run (model initialisation happens before, under the caller's seed).
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
        for name in ("batch_size", "max_epochs", "eval_every", "eval_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.patience, int) or self.patience < 0:
            raise ValueError(f"patience must be a non-negative integer, got {self.patience!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not (math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"min_lr must lie in [0, lr], got {self.min_lr}")
        if not 0 < self.lr_factor < 1:
            raise ValueError(f"lr_factor must lie in (0, 1), got {self.lr_factor}")
        if self.task is not None and self.task not in _TASKS:
            raise ValueError(f"task must be one of {_TASKS} or None, got {self.task!r}")
        device = torch.device(self.device)  # raises on a malformed string
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


# ---------------------------------------------------------------------------------- helpers
def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and CUDA).

    NumPy's legacy global state is seeded on purpose: it is what third-party code (data
    augmentation, samplers) draws from when it is not handed a ``numpy.random.Generator``.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002
    torch.manual_seed(seed)


def _infer_task(y: Tensor) -> str:
    return "regression" if y.is_floating_point() else "classification"


def _check_data(name: str, data: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ValueError(f"{name} must be a pair (x, y) of tensors")
    x, y = data
    check_tensor(f"{name} x", x)
    check_ndim(f"{name} x", x, 2)
    check_finite(f"{name} x", x)
    if not isinstance(y, Tensor):
        raise TypeError(f"{name} y must be a torch.Tensor, got {type(y).__name__}")
    if y.shape[:1] != x.shape[:1] or x.shape[0] == 0:
        raise ValueError(
            f"{name} x and y must hold the same, non-zero number of samples, "
            f"got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if y.is_floating_point():
        check_finite(f"{name} y", y)
    return x, y


def _check_labels(name: str, labels: Tensor, num_classes: int | None) -> None:
    """Class labels: integers in ``[0, num_classes)`` (the model's head, where it has one)."""
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(
            f"task='classification' needs integer class labels as {name} y, got dtype "
            f"{labels.dtype} (float targets: use task='regression')"
        )
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or (num_classes is not None and high >= num_classes):
        bound = "" if num_classes is None else f", {num_classes}"
        raise ValueError(
            f"{name} y holds class labels in [{low}, {high}]; the model's head takes [0{bound})"
        )


def _atomic_write(path: Path, write: Callable[[io.IOBase], None], binary: bool) -> None:
    """Write ``path`` through a temporary file in the same directory and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb" if binary else "w", newline=None if binary else "") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _rng_state(generator: torch.Generator, device: torch.device) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "python": random.getstate(),
        "shuffle": generator.get_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))  # noqa: NPY002
    random.setstate(state["python"])
    generator.set_state(state["shuffle"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _batches(n: int, batch_size: int, order: Tensor | None = None):
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        yield slice(start, stop) if order is None else order[start:stop]


@torch.no_grad()
def _mean_loss(model: nn.Module, x: Tensor, y: Tensor, batch_size: int) -> float:
    total = 0.0
    for index in _batches(x.shape[0], batch_size):
        total += float(model.loss(x[index], y[index])) * (index.stop - index.start)
    return total / x.shape[0]


@torch.no_grad()
def evaluate(
    model: nn.Module, x: Tensor, y: Tensor, task: str | None = None, batch_size: int = 4096
) -> dict[str, float]:
    """Test metrics of a model's predictions ``model(x)`` (in ``eval()`` mode, no gradients).

    * classification: ``{"error": e}``, the fraction of samples whose label differs from the
      argmax of the predictive mean logits (for Gaussian logits with a full covariance this is the
      most probable class of the mean prediction, not of the averaged softmax);
    * regression: ``{"rmse": r, "log_likelihood": ll}``, the root mean squared error of the
      predictive mean over all samples and outputs, and the mean over samples of
      ``log N(y | mean, var)`` (:func:`~pyro_gpn.metrics.gaussian_log_likelihood`).

    Args:
        model: returns :class:`~pyro_gpn.moments.gaussian.Moments` from ``model(x)``.
        x: ``[S, M]`` inputs.
        y: ``[S]`` integer labels or ``[S, D]`` real targets.
        task: ``"classification"``, ``"regression"`` or ``None`` (inferred from ``y``'s dtype).
        batch_size: evaluation batch size (memory only).
    """
    x, y = _check_data("data", (x, y))
    task = _infer_task(y) if task is None else task
    if task not in _TASKS:
        raise ValueError(f"task must be one of {_TASKS} or None, got {task!r}")
    was_training = model.training
    model.eval()
    try:
        errors = squared = log_lik = 0.0
        for index in _batches(x.shape[0], batch_size):
            prediction = model(x[index])
            if task == "classification":
                errors += float(classification_error(prediction.mean, y[index], reduction="sum"))
            else:
                target = y[index].reshape(prediction.mean.shape)
                squared += float(mean_squared_error(prediction.mean, target, reduction="sum"))
                log_lik += float(gaussian_log_likelihood(prediction, target, reduction="sum"))
    finally:
        model.train(was_training)
    n = x.shape[0]
    if task == "classification":
        return {"error": errors / n}
    return {"rmse": math.sqrt(squared / y.numel()), "log_likelihood": log_lik / n}


# ---------------------------------------------------------------------------------- trainer
class Trainer:
    """Train a model by mini-batch Adam with the paper's plateau schedule (module docstring).

    Args:
        model: a ``torch.nn.Module`` with ``loss(x, y)``, ``penalty()`` and ``forward(x)``
            returning ``Moments``; it is moved to ``config.device``.
        config: the hyper-parameters; defaults to ``TrainConfig()``.

    Example::

        trainer = Trainer(net, TrainConfig(batch_size=64, patience=5, out_dir="runs/letter"))
        result = trainer.fit((x_train, y_train), (x_val, y_val))
        evaluate(net, x_test, y_test)  # net now holds the best-validation parameters
    """

    def __init__(self, model: nn.Module, config: TrainConfig | None = None) -> None:
        for method in ("loss", "penalty"):
            if not callable(getattr(model, method, None)):
                raise TypeError(f"model must have a callable .{method}()")
        self.model = model
        self.config = TrainConfig() if config is None else config
        self.device = torch.device(self.config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.config.device!r} requested but CUDA is unavailable")
        self.out_dir = None if self.config.out_dir is None else Path(self.config.out_dir)

    # ------------------------------------------------------------------ public
    def fit(
        self,
        train: tuple[Tensor, Tensor],
        val: tuple[Tensor, Tensor],
        resume: bool = False,
    ) -> TrainResult:
        """Train on ``train`` with early stopping on ``val``; restore the best parameters.

        Each epoch visits the training set once in a random order (from a seeded
        ``torch.Generator``) in mini-batches of ``batch_size``, minimising
        ``model.loss(x, y) + model.penalty()``. Every ``eval_every`` epochs the validation loss
        (the mean of ``model.loss`` over ``val`` in ``eval()`` mode, without the penalty) drives
        the schedule and the choice of the best parameters, and :func:`evaluate` adds the
        validation error (classification) or RMSE and log-likelihood (regression).

        History entries hold ``epoch``, ``step`` (optimiser steps so far), ``train_loss`` (mean
        objective over the epoch, penalty included), ``lr`` (used during the epoch),
        ``epoch_time`` and ``elapsed_time`` (seconds), and, on evaluated epochs, ``val_loss`` and
        ``val_error`` or ``val_rmse`` / ``val_log_likelihood``. With ``out_dir`` set they are
        written to ``metrics.csv`` and ``metrics.json`` and the state to ``checkpoint.pt`` after
        every epoch; the restored best parameters go to ``best_model.pt`` at the end.

        Args:
            train: ``(x [S, M], y)`` training data; ``y`` is ``[S]`` labels or ``[S, D]``.
            val: validation data in the same format.
            resume: continue from ``out_dir/checkpoint.pt`` if it exists (else start afresh).
                Changing hyper-parameters other than ``max_epochs`` (and device, progress or
                output settings) between the runs breaks the equality with an uninterrupted run.

        Raises:
            FloatingPointError: when a training or validation loss is not finite (naming the
                epoch and step); the last checkpoint is left intact.
            ValueError: for malformed data or ``resume=True`` without ``out_dir``.
        """
        cfg = self.config
        x_train, y_train = (t.to(self.device) for t in _check_data("train", train))
        x_val, y_val = (t.to(self.device) for t in _check_data("val", val))
        task = cfg.task or _infer_task(y_train)
        if task == "classification":
            classes = getattr(getattr(self.model, "head", None), "num_classes", None)
            for name, labels in (("train", y_train), ("val", y_val)):
                _check_labels(name, labels, classes)
        if resume and self.out_dir is None:
            raise ValueError("resume=True needs config.out_dir")
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)

        model = self.model.to(self.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=cfg.lr_factor, patience=cfg.patience, min_lr=cfg.min_lr
        )
        generator = torch.Generator()
        result = TrainResult()
        best_state: dict[str, Tensor] | None = None
        step, elapsed = 0, 0.0

        checkpoint = self._load_checkpoint() if resume else None
        if checkpoint is None:
            seed_everything(cfg.seed)
            generator.manual_seed(cfg.seed)
        else:
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            scheduler.load_state_dict(checkpoint["scheduler"])
            _set_rng_state(checkpoint["rng"], generator)
            best_state = checkpoint["best_state"]
            result = TrainResult(**checkpoint["result"])
            step, elapsed = checkpoint["step"], checkpoint["elapsed"]
            logger.info("resuming from epoch %d of %s", result.epochs, self.out_dir)
            self._write_metrics(result.history)  # drop rows written after the checkpoint
            if result.stop_reason == "min_lr":
                return self._finish(result, best_state)

        bar = tqdm(
            total=cfg.max_epochs, initial=result.epochs, disable=not cfg.progress, unit="epoch"
        )
        try:
            for epoch in range(result.epochs + 1, cfg.max_epochs + 1):
                start = time.perf_counter()
                lr = optimizer.param_groups[0]["lr"]
                train_loss, step = self._train_epoch(
                    optimizer, generator, x_train, y_train, epoch, step
                )
                row: dict[str, Any] = {"epoch": epoch, "step": step, "train_loss": train_loss}
                if epoch % cfg.eval_every == 0 or epoch == cfg.max_epochs:
                    row.update(self._validate(x_val, y_val, task, epoch, step))
                    if row["val_loss"] < result.best_val_loss:
                        result.best_val_loss, result.best_epoch = row["val_loss"], epoch
                        best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                    if self._schedule(scheduler, optimizer, row["val_loss"]):
                        result.stop_reason = "min_lr"
                epoch_time = time.perf_counter() - start
                elapsed += epoch_time
                row.update(lr=lr, epoch_time=epoch_time, elapsed_time=elapsed)
                result.history.append(row)
                result.epochs = epoch
                self._save(
                    model, optimizer, scheduler, generator, best_state, result, step, elapsed
                )
                bar.update(1)
                bar.set_postfix(
                    {k: f"{row[k]:.4g}" for k in ("train_loss", "val_loss", "lr") if k in row}
                )
                if result.stop_reason == "min_lr":
                    break
        finally:
            bar.close()
        return self._finish(result, best_state)

    # ------------------------------------------------------------------ internals
    def _train_epoch(
        self,
        optimizer: torch.optim.Optimizer,
        generator: torch.Generator,
        x: Tensor,
        y: Tensor,
        epoch: int,
        step: int,
    ) -> tuple[float, int]:
        """One shuffled pass over the data; returns the mean objective and the step count.

        Value checks are off (:func:`pyro_gpn.settings.validation`): the data were checked on
        entry, and the loss is read back once per step (one device synchronisation).
        """
        with settings.validation(False):
            return self._run_epoch(optimizer, generator, x, y, epoch, step)

    def _run_epoch(self, optimizer, generator, x, y, epoch, step) -> tuple[float, int]:
        self.model.train()
        n, total = x.shape[0], 0.0
        order = torch.randperm(n, generator=generator).to(self.device)
        for batch in _batches(n, self.config.batch_size, order):
            optimizer.zero_grad(set_to_none=True)
            step += 1
            try:
                loss = self.model.loss(x[batch], y[batch]) + self.model.penalty()
            except ValueError as error:  # e.g. K + S no longer positive definite
                if step == 1:
                    raise
                raise FloatingPointError(
                    f"training failed at epoch {epoch}, step {step} ({error}); the optimisation "
                    f"has most likely diverged: lower lr (now {self.config.lr:g})"
                ) from error
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"non-finite training loss {value} at epoch {epoch}, step {step}"
                )
            loss.backward()
            optimizer.step()
            total += value * batch.numel()
        return total / n, step

    def _validate(self, x: Tensor, y: Tensor, task: str, epoch: int, step: int) -> dict:
        """Validation loss (mean ``model.loss``, eval mode) and :func:`evaluate` metrics."""
        self.model.eval()
        with settings.validation(False):
            val_loss = _mean_loss(self.model, x, y, self.config.eval_batch_size)
        if not math.isfinite(val_loss):
            raise FloatingPointError(
                f"non-finite validation loss {val_loss} at epoch {epoch}, step {step}"
            )
        with settings.validation(False):
            metrics = evaluate(self.model, x, y, task, self.config.eval_batch_size)
        return {"val_loss": val_loss, **{f"val_{k}": v for k, v in metrics.items()}}

    @staticmethod
    def _schedule(scheduler, optimizer, val_loss: float) -> bool:
        """Step the plateau scheduler; True when a reduction is due but ``min_lr`` forbids it."""
        lr_before, best_before = optimizer.param_groups[0]["lr"], scheduler.best
        scheduler.step(val_loss)
        improved = scheduler.best != best_before
        reduction_due = not improved and scheduler.num_bad_epochs == 0
        return reduction_due and optimizer.param_groups[0]["lr"] >= lr_before

    def _finish(self, result: TrainResult, best_state: dict[str, Tensor] | None) -> TrainResult:
        if best_state is not None:
            self.model.load_state_dict(best_state)
            if self.out_dir is not None:
                path = self.out_dir / BEST_MODEL_NAME
                _atomic_write(path, lambda f: torch.save(best_state, f), binary=True)
        return result

    def _load_checkpoint(self) -> dict[str, Any] | None:
        path = self.out_dir / CHECKPOINT_NAME
        if not path.exists():
            logger.info("no checkpoint in %s, starting afresh", self.out_dir)
            return None
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        now = dataclasses.asdict(self.config)
        changed = sorted(
            key
            for key, value in checkpoint["config"].items()
            if key not in _RESUMABLE_CHANGES and now.get(key) != value
        )
        if changed:
            logger.warning("resuming with changed settings %s: not a continuation", changed)
        return checkpoint

    def _save(self, model, optimizer, scheduler, generator, best_state, result, step, elapsed):
        if self.out_dir is None:
            return
        checkpoint = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": _rng_state(generator, self.device),
            "best_state": best_state,
            "result": dataclasses.asdict(result),
            "step": step,
            "elapsed": elapsed,
            "config": dataclasses.asdict(self.config),
        }
        # metrics first: a kill between the two writes leaves them one epoch ahead of the
        # checkpoint, and resuming rewrites them from the checkpoint's history
        self._write_metrics(result.history)
        path = self.out_dir / CHECKPOINT_NAME
        _atomic_write(path, lambda f: torch.save(checkpoint, f), binary=True)

    def _write_metrics(self, history: list[dict[str, Any]]) -> None:
        columns: list[str] = []
        for row in history:
            columns.extend(key for key in row if key not in columns)

        def write_csv(handle) -> None:
            writer = csv.DictWriter(handle, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(history)

        _atomic_write(self.out_dir / METRICS_CSV_NAME, write_csv, binary=False)
        _atomic_write(
            self.out_dir / METRICS_JSON_NAME,
            lambda handle: json.dump(history, handle, indent=1),
            binary=False,
        )
