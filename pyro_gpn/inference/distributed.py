"""Data-parallel training on :mod:`torch.distributed`: one process per core or GPU.

Launch any script that calls :func:`fit_distributed` with ``torchrun``::

    torchrun --nproc_per_node=2 -m pyro_gpn.inference.distributed --epochs 5

Each of the ``K`` processes (ranks) holds a replica of the model, wrapped in
:class:`~torch.nn.parallel.DistributedDataParallel` (``gloo`` on CPU, ``NCCL`` on GPU), and
trains on its shard of every global mini-batch: a :class:`~torch.utils.data.DistributedSampler`
permutes the training set with the seed ``seed + epoch`` (the same permutation on every rank) and
deals positions ``r, r + K, r + 2K, ...`` to rank ``r``. The ``k``-th local batches of size
``B / K`` of all ranks are then exactly the ``k``-th global batch of size ``B`` of a single
process that walks the same permutation, and since every rank's objective is the mean over its
shard (``model.loss(x, y) + model.penalty()``, the :class:`~pyro_gpn.inference.Trainer`
interface) the all-reduced mean gradient equals the single-process gradient of the global
batch: ``K`` processes take the same optimiser steps as one (to floating-point summation order;
tested: ``tests/inference/test_distributed.py``). Incomplete last batches are dropped so that
every step has ``B`` samples.

Metrics are reduced across ranks (sample-weighted sums, so the epoch's training loss and the
validation loss are the global means); only rank 0 writes, a checkpoint per epoch
(:func:`pyro_gpn.io.save_torch`: atomic, checksummed) holding the model, the optimiser, the
epoch, the step and the history. ``resume=True`` makes every rank load it and continue from the
next epoch (the sampler's permutation depends only on ``seed + epoch``, so the resumed run takes
the steps of an uninterrupted one).

Without ``torchrun`` (no ``WORLD_SIZE`` in the environment) the same function trains in one
process; this is the reference the equality test compares with.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from ..io import load_torch, save_torch

__all__ = [
    "DistConfig",
    "DistContext",
    "DistResult",
    "fit_distributed",
    "init_distributed",
]

CHECKPOINT_NAME = "distributed_checkpoint.pt"


@dataclass(frozen=True)
class DistContext:
    """Where this process stands: ``rank`` of ``world_size``, its device and the backend
    (``None`` when running alone, without a process group)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def init_distributed(device: str = "cpu", backend: str | None = None) -> DistContext:
    """Join the process group described by ``torchrun``'s environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``).

    Args:
        device: ``"cpu"`` or ``"cuda"`` (each rank takes GPU ``LOCAL_RANK``).
        backend: ``"gloo"`` or ``"nccl"``; ``None``: NCCL for CUDA, gloo for the CPU.

    Returns:
        the :class:`DistContext`; a single-process one when ``WORLD_SIZE`` is not set.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
    if "WORLD_SIZE" not in os.environ:
        return DistContext(device=torch.device(device))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        target = torch.device("cuda", local_rank)
    else:
        target = torch.device("cpu")
    backend = backend or ("nccl" if device == "cuda" else "gloo")
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world)
    return DistContext(rank, world, local_rank, target, backend)


@dataclass
class DistConfig:
    """Settings of :func:`fit_distributed`.

    Attributes:
        batch_size: the *global* mini-batch ``B`` (must be divisible by the number of ranks).
        epochs: passes over the training set.
        lr: Adam's learning rate.
        seed: the sampler's seed (epoch ``e`` uses ``seed + e``).
        max_steps: stop after this many optimiser steps (``None``: no limit).
        out_dir: where rank 0 writes ``distributed_checkpoint.pt`` (``None``: nowhere).
        eval_batch_size: validation batch per rank (memory only).
    """

    batch_size: int = 128
    epochs: int = 1
    lr: float = 1e-3
    seed: int = 0
    max_steps: int | None = None
    out_dir: str | None = None
    eval_batch_size: int = 4096

    def __post_init__(self) -> None:
        for name in ("batch_size", "epochs", "eval_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_steps is not None and (
            not isinstance(self.max_steps, int) or self.max_steps < 1
        ):
            raise ValueError(f"max_steps must be a positive integer or None, got {self.max_steps}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be positive, got {self.lr}")


@dataclass
class DistResult:
    """Outcome of :func:`fit_distributed` (identical on every rank).

    Attributes:
        history: per epoch ``epoch``, ``step``, ``train_loss`` (global mean), ``val_loss`` (if
            validation data were given), ``epoch_time`` (seconds, this rank's wall clock).
        steps: optimiser steps taken.
        world_size: the number of ranks.
    """

    history: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    world_size: int = 1


class _Objective(nn.Module):
    """``model.loss(x, y) + model.penalty()`` as a ``forward``, which DDP needs to hook its
    gradient all-reduce into."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.model.loss(x, y) + self.model.penalty()


def _all_sum(values: list[float], ctx: DistContext) -> list[float]:
    if not ctx.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


@torch.no_grad()
def _validation_loss(model: nn.Module, data: tuple[Tensor, Tensor], ctx, batch_size) -> float:
    x, y = data
    shard = torch.arange(ctx.rank, x.shape[0], ctx.world_size)
    total = 0.0
    for start in range(0, shard.numel(), batch_size):
        index = shard[start : start + batch_size]
        total += float(model.loss(x[index], y[index])) * index.numel()
    total, count = _all_sum([total, float(shard.numel())], ctx)
    return total / count


def fit_distributed(
    model: nn.Module,
    train: tuple[Tensor, Tensor],
    val: tuple[Tensor, Tensor] | None = None,
    config: DistConfig | None = None,
    context: DistContext | None = None,
    resume: bool = False,
) -> DistResult:
    """Train ``model`` (``loss``, ``penalty``: the :class:`~pyro_gpn.inference.Trainer`
    interface) data-parallel over the ranks of ``context`` with Adam.

    Args:
        model: the module; every rank builds it identically (DDP also broadcasts rank 0's
            parameters at the start).
        train: ``(x [S, ...], y [S, ...])``, the full training set on every rank.
        val: optional validation set (sharded across ranks for the loss).
        config: :class:`DistConfig`.
        context: from :func:`init_distributed` (default: initialise from the environment).
        resume: continue from ``out_dir``'s checkpoint if there is one.

    Returns:
        :class:`DistResult`; the trained parameters are in ``model`` on every rank.
    """
    config = config or DistConfig()
    ctx = context or init_distributed()
    for method in ("loss", "penalty"):
        if not callable(getattr(model, method, None)):
            raise TypeError(f"model must have a {method}() method")
    if config.batch_size % ctx.world_size:
        raise ValueError(
            f"batch_size (global) {config.batch_size} must be divisible by the "
            f"{ctx.world_size} ranks"
        )
    x, y = train
    if not isinstance(x, Tensor) or not isinstance(y, Tensor) or x.shape[0] != y.shape[0]:
        raise ValueError("train must be a pair of tensors with the same number of samples")
    if x.shape[0] < config.batch_size:
        raise ValueError(
            f"batch_size {config.batch_size} exceeds the {x.shape[0]} training samples"
        )
    model = model.to(ctx.device)
    objective = _Objective(model)
    if ctx.distributed:
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        objective = DistributedDataParallel(objective, device_ids=ids)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    result = DistResult(world_size=ctx.world_size)
    start_epoch = 0
    path = Path(config.out_dir) / CHECKPOINT_NAME if config.out_dir else None
    if resume and path is not None and path.exists():
        state = load_torch(path, map_location=ctx.device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        result.history, result.steps = state["history"], state["steps"]
        start_epoch = state["epoch"]
    local_batch = config.batch_size // ctx.world_size
    sampler = DistributedSampler(
        range(x.shape[0]),
        num_replicas=ctx.world_size,
        rank=ctx.rank,
        shuffle=True,
        seed=config.seed,
        drop_last=True,
    )
    for epoch in range(start_epoch, config.epochs):
        if config.max_steps is not None and result.steps >= config.max_steps:
            break
        began = time.perf_counter()
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)), dtype=torch.long)
        model.train()
        total, count = 0.0, 0
        for begin in range(0, order.numel() - local_batch + 1, local_batch):
            if config.max_steps is not None and result.steps >= config.max_steps:
                break
            index = order[begin : begin + local_batch].to(x.device)
            optimizer.zero_grad(set_to_none=True)
            loss = objective(x[index].to(ctx.device), y[index].to(ctx.device))
            loss.backward()
            optimizer.step()
            result.steps += 1
            total += float(loss.detach()) * local_batch
            count += local_batch
        total, count = _all_sum([total, float(count)], ctx)
        row: dict[str, Any] = {
            "epoch": epoch + 1,
            "step": result.steps,
            "train_loss": total / max(count, 1.0),
        }
        if val is not None:
            model.eval()
            row["val_loss"] = _validation_loss(model, val, ctx, config.eval_batch_size)
        row["epoch_time"] = time.perf_counter() - began
        result.history.append(row)
        if path is not None and ctx.is_main:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_torch(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch + 1,
                    "steps": result.steps,
                    "history": result.history,
                    "config": asdict(config),
                    "world_size": ctx.world_size,
                },
                path,
            )
        if ctx.distributed:
            dist.barrier()
    return result


def _demo(argv: list[str] | None = None) -> None:
    """``torchrun --nproc_per_node=K -m pyro_gpn.inference.distributed``: a 64-H-10 GPN on
    scikit-learn's 8x8 digits, printing the time per epoch on rank 0."""
    from sklearn.datasets import load_digits

    from ..network import GPNNet

    parser = argparse.ArgumentParser(description="data-parallel GPN training demo")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ctx = init_distributed(args.device)
    features, labels = load_digits(return_X_y=True)
    x = torch.as_tensor(features, dtype=torch.float32) / 16
    y = torch.as_tensor(labels, dtype=torch.long)
    torch.manual_seed(0)
    model = GPNNet([64, args.hidden, 10], mode="meanvar", head="softmax")
    config = DistConfig(batch_size=args.batch_size, epochs=args.epochs, out_dir=args.out_dir)
    cpu = time.process_time()
    result = fit_distributed(model, (x, y), (x, y), config, ctx, resume=args.resume)
    cpu = time.process_time() - cpu
    if ctx.is_main:
        times = [row["epoch_time"] for row in result.history]
        print(
            f"world_size={ctx.world_size} steps={result.steps} "
            f"epoch_times={[round(t, 3) for t in times]} "
            f"rank0_cpu_s={cpu:.2f} final_train_loss={result.history[-1]['train_loss']:.4f} "
            f"load={os.getloadavg()[0]:.1f}",
            flush=True,
        )
    if ctx.distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    _demo()
