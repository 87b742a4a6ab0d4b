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

**Data-parallel.** Launched by ``torchrun --nproc_per_node=K``, the same script trains on ``K``
processes with :class:`~torch.nn.parallel.DistributedDataParallel`: every global mini-batch of
``batch_size`` is split across the ranks, the metrics are reduced, rank 0 alone writes (and on
resumption reads) the files, and the ``K`` processes take the steps of one
(:mod:`pyro_gpn.inference.distributed`).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from .. import settings
from .._validation import check_parameters_finite
from .checkpoint import (
    BEST_MODEL_NAME,
    CHECKPOINT_NAME,
    METRICS_CSV_NAME,
    METRICS_JSON_NAME,
    gather_rng_state,
    load_checkpoint,
    locked_out_dir,
    own_rng_state,
    save_checkpoint,
    save_model,
    seed_everything,
    set_rng_state,
    write_metrics,
)
from .distributed import (
    DataParallelObjective,
    DistContext,
    current_context,
    on_main_rank,
    reduce_metrics,
    shard,
    shard_weight,
)
from .evaluation import (
    _batches,
    _check_data,
    _check_labels,
    _infer_task,
    _mean_loss,
    _parameter_like,
    evaluate,
)
from .train_config import TrainConfig, TrainResult

__all__ = [
    "BEST_MODEL_NAME",
    "CHECKPOINT_NAME",
    "METRICS_CSV_NAME",
    "METRICS_JSON_NAME",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "evaluate",
    "seed_everything",
]

logger = logging.getLogger(__name__)


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
        self._ctx = DistContext(device=self.device)
        self._writes = False  # whether fit() writes checkpoints (set by locked_out_dir)
        self._objective: nn.Module = DataParallelObjective(model)  # DDP-wrapped by fit()

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
            resume: continue from ``out_dir/checkpoint.pt`` if it exists (else start afresh),
                so that the finished run equals an uninterrupted one. The configuration must be
                the checkpoint's, except ``max_epochs``, ``seed`` (the restored generator states
                replace it), ``progress``, ``out_dir``, ``device`` and ``eval_batch_size``;
                another value of any other field raises ``ValueError`` naming it.

        Raises:
            FloatingPointError: when a training or validation loss is not finite (naming the
                epoch and step); the last checkpoint is left intact.
            ValueError: for malformed data, non-finite parameters, ``resume=True`` without
                ``out_dir``, or a checkpoint written with another configuration (naming the
                fields, their values and the checkpoint's).
            pyro_gpn.io.CorruptFileError: ``resume=True`` and ``checkpoint.pt`` is damaged
                (checked against its checksum), naming the file.
            pyro_gpn.io.RunInUseError: another live process trains into ``out_dir``.
            OSError: ``out_dir`` is a file or not writable, or the disk is full (the message
                names the file; no partial file is left and the previous checkpoint is intact).
        """
        cfg = self.config
        self._ctx = current_context(self.device)
        self.device = self._ctx.device if self._ctx.distributed else self.device
        like = _parameter_like(self.model)
        x_train, y_train = (t.to(self.device) for t in _check_data("train", train, like))
        x_val, y_val = (t.to(self.device) for t in _check_data("val", val, like))
        task = cfg.task or _infer_task(y_train)
        if task == "classification":
            classes = getattr(getattr(self.model, "head", None), "num_classes", None)
            for name, labels in (("train", y_train), ("val", y_val)):
                _check_labels(name, labels, classes)  # one synchronisation each
        check_parameters_finite(self.model, "the model (before training)")
        with locked_out_dir(self.out_dir, self._ctx, CHECKPOINT_NAME) as self._writes:
            # after the folder's collective: under torchrun rank 0's out_dir decides, and every
            # rank raises together (a rank raising alone would leave rank 0 waiting)
            if resume and not self._writes:
                raise ValueError("resume=True needs config.out_dir (rank 0's, under torchrun)")
            return self._fit(x_train, y_train, x_val, y_val, task, resume)

    def _fit(self, x_train, y_train, x_val, y_val, task: str, resume: bool) -> TrainResult:
        """:meth:`fit` on checked data, with ``out_dir`` locked and writable."""
        cfg = self.config
        model = self.model.to(self.device)
        # foreach: one pass per parameter group instead of a loop of small ops (the same steps)
        # plain floats: the optimiser's and scheduler's states go into checkpoints, whose
        # weights_only=True load refuses NumPy scalars (an lr of np.float64)
        optimizer = torch.optim.Adam(model.parameters(), lr=float(cfg.lr), foreach=True)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer,
            mode="min",
            factor=float(cfg.lr_factor),
            patience=int(cfg.patience),
            min_lr=float(cfg.min_lr),
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
            set_rng_state(own_rng_state(checkpoint["rng"], self._ctx), generator, self.device)
            best_state = checkpoint["best_state"]
            result = TrainResult(**checkpoint["result"])
            step, elapsed = checkpoint["step"], checkpoint["elapsed"]
            logger.info("resuming from epoch %d of %s", result.epochs, self.out_dir)
            self._write_metrics(result.history)  # drop rows written after the checkpoint
            if result.stop_reason == "min_lr":
                return self._finish(result, best_state)
        self._objective = self._wrap(model)

        bar = tqdm(
            total=cfg.max_epochs,
            initial=result.epochs,
            disable=not (cfg.progress and self._ctx.is_main),
            unit="epoch",
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
    def _wrap(self, model: nn.Module) -> nn.Module:
        """The per-step objective; wrapped in DDP under ``torchrun`` (which also broadcasts
        rank 0's parameters and buffers)."""
        objective = DataParallelObjective(model)
        if not self._ctx.distributed:
            return objective
        ids = [self._ctx.device.index] if self._ctx.device.type == "cuda" else None
        return DistributedDataParallel(objective, device_ids=ids)

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
        entry, and the loss is read back once per step (one device synchronisation). Under
        ``torchrun`` each rank trains on its :func:`~pyro_gpn.inference.distributed.shard` of
        every global batch, its loss scaled so that DDP's averaged gradient is the global
        batch's, and the loss read back is the global one (one all-reduce).
        """
        with settings.validation(False):
            return self._run_epoch(optimizer, generator, x, y, epoch, step)

    def _run_epoch(self, optimizer, generator, x, y, epoch, step) -> tuple[float, int]:
        self.model.train()
        n, total = x.shape[0], 0.0
        order = torch.randperm(n, generator=generator).to(self.device)
        ctx = self._ctx
        for batch in _batches(n, self.config.batch_size, order):
            optimizer.zero_grad(set_to_none=True)
            step += 1
            local = shard(batch, ctx)
            # K w_r: DDP averages over the K ranks; a rank without samples contributes nothing
            scale = ctx.world_size * shard_weight(local.numel(), batch.numel())
            if local.numel() == 0:
                local = batch[:1]
            try:
                loss = self._objective(x[local], y[local], scale)
            except ValueError as error:  # e.g. K + S no longer positive definite
                if step == 1:
                    raise
                raise FloatingPointError(
                    f"training failed at epoch {epoch}, step {step} ({error}); the optimisation "
                    f"has most likely diverged: lower lr (now {self.config.lr:g})"
                ) from error
            value = self._global_value(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"non-finite training loss {value} at epoch {epoch}, step {step}"
                )
            loss.backward()
            optimizer.step()
            total += value * batch.numel()
        return total / n, step

    def _global_value(self, loss: Tensor) -> float:
        """The step's objective averaged over the ranks (the global batch's objective)."""
        if self._ctx.distributed:
            loss = loss.to(torch.float64).reshape(1)
            dist.all_reduce(loss, op=dist.ReduceOp.SUM)
            loss = loss / self._ctx.world_size
        return float(loss)

    def _validate(self, x: Tensor, y: Tensor, task: str, epoch: int, step: int) -> dict:
        """Validation loss (mean ``model.loss``, eval mode) and :func:`evaluate` metrics (each
        rank evaluates its share of ``val``; the metrics are reduced across ranks)."""
        self.model.eval()
        if x.shape[0] >= self._ctx.world_size:  # else every rank evaluates all of it
            index = shard(torch.arange(x.shape[0], device=x.device), self._ctx)
            x, y = x[index], y[index]
        with settings.validation(False):
            val_loss = _mean_loss(self.model, x, y, self.config.eval_batch_size)
            metrics = evaluate(self.model, x, y, task, self.config.eval_batch_size)
        metrics = reduce_metrics({"loss": val_loss, **metrics}, x.shape[0], self._ctx)
        val_loss = metrics.pop("loss")
        if not math.isfinite(val_loss):
            raise FloatingPointError(
                f"non-finite validation loss {val_loss} at epoch {epoch}, step {step}"
            )
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
            if self._writes:  # rank 0's out_dir decides on every rank
                on_main_rank(
                    lambda: save_model(best_state, self.out_dir / BEST_MODEL_NAME), self._ctx
                )
        return result

    def _load_checkpoint(self) -> dict[str, Any] | None:
        """Rank 0 reads and verifies the checkpoint and sends it to every rank (its errors
        raise on every rank)."""
        return on_main_rank(lambda: load_checkpoint(self.out_dir, self.config), self._ctx)

    def _save(self, model, optimizer, scheduler, generator, best_state, result, step, elapsed):
        if not self._writes:  # rank 0's out_dir decides on every rank (collectives follow)
            return
        rng = gather_rng_state(generator, self._ctx)  # every rank's (a collective)
        on_main_rank(  # a failed write raises on every rank
            lambda: save_checkpoint(
                self.out_dir,
                model=model,
                optimizer=optimizer,
                scheduler=scheduler,
                rng=rng,
                best_state=best_state,
                result=result,
                step=step,
                elapsed=elapsed,
                config=self.config,
            ),
            self._ctx,
        )

    def _write_metrics(self, history: list[dict[str, Any]]) -> None:
        on_main_rank(lambda: write_metrics(self.out_dir, history), self._ctx)
