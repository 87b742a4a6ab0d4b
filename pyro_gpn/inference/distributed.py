"""Data-parallel training on :mod:`torch.distributed`: one process per core or GPU.

:class:`~pyro_gpn.inference.Trainer` and :func:`~pyro_gpn.inference.fit_svi` need no change to
run data-parallel: launched by ``torchrun --nproc_per_node=K`` (which sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``), they join the process group
(:func:`init_distributed`: ``gloo`` on CPU, ``NCCL`` on GPU) and split every *global* mini-batch
of ``batch_size`` samples across the ranks. This module holds the plumbing they share::

    torchrun --standalone --nproc_per_node=2 -m pyro_gpn.experiments.distributed_demo --epochs 3

**Why K processes take the same steps as one.** Every rank draws the same global batch (the same
seeded permutation or random indices; a "distributed sampler" that deals positions
``r, r + K, r + 2K, ...`` of each global batch to rank ``r``, :func:`shard`). Rank ``r``'s
objective on its ``n_r`` samples is weighted by ``w_r = n_r / B`` (:func:`shard_weight`), so that
the sum over ranks of the weighted objectives is the single-process objective of the global
batch ``B`` -- also for an incomplete last batch, where the ranks' shares differ, and for
objectives with global terms (a penalty, a KL divergence), whose weights sum to one. The summed
gradient is therefore the single-process gradient, and the optimiser takes the same step (to the
order of floating-point summation; tested with 2 processes in
``tests/inference/test_distributed.py``).

* :class:`~pyro_gpn.inference.Trainer` wraps the objective ``K w_r loss + penalty`` in
  :class:`~torch.nn.parallel.DistributedDataParallel`, whose gradient all-reduce *averages* (so
  the factor ``K``), and which broadcasts rank 0's parameters and buffers at the start.
* :func:`~pyro_gpn.inference.fit_svi` trains Pyro parameters that live in the parameter store or
  in ``PyroModule`` s created while the model runs, which DDP cannot wrap; it sums the weighted
  gradients itself (:func:`all_reduce_gradients`, one flat all-reduce per step -- what DDP does,
  without the bucketing) and broadcasts rank 0's parameters after they are created
  (:func:`broadcast_parameters`).

Metrics (training loss, validation loss, RMSE, error, log-likelihood) are reduced across ranks
(:func:`reduce_metrics`) so that every rank sees the global values and takes the same decisions
(learning-rate schedule, early stopping, non-finite-loss errors); only rank 0 touches the output
folder -- it locks it, writes the checkpoints and metrics files, and with ``resume=True`` reads the
checkpoint and sends it to the other ranks (:func:`on_main_rank`, which also raises rank 0's
errors on every rank), so that the folder need not be shared between machines. A checkpoint
keeps every rank's random state (:func:`~pyro_gpn.inference.checkpoint.gather_rng_state`).

Without ``torchrun`` (no ``WORLD_SIZE`` in the environment) nothing here changes a run.
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = [
    "DistContext",
    "all_reduce_gradients",
    "broadcast_parameters",
    "current_context",
    "init_distributed",
    "on_main_rank",
    "reduce_metrics",
    "shard",
    "shard_weight",
]


T = TypeVar("T")


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
        """Whether this rank writes files and shows progress (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def init_distributed(device: str = "cpu", backend: str | None = None) -> DistContext:
    """Join the process group described by ``torchrun``'s environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); a no-op when already joined.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (each rank then takes GPU ``LOCAL_RANK``).
        backend: ``"gloo"`` or ``"nccl"``; ``None``: NCCL for CUDA, gloo for the CPU.

    Returns:
        the :class:`DistContext`; a single-process one when ``WORLD_SIZE`` is not set.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
    if "WORLD_SIZE" not in os.environ and not (dist.is_available() and dist.is_initialized()):
        return DistContext(device=torch.device(device))
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        target = torch.device("cuda", local_rank)
    else:
        target = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(
            backend or ("nccl" if device == "cuda" else "gloo"), rank=rank, world_size=world
        )
    return DistContext(rank, world, local_rank, target, dist.get_backend())


def current_context(device: torch.device | str = "cpu") -> DistContext:
    """The :class:`DistContext` for a run on ``device``: joins ``torchrun``'s process group when
    the environment describes one with more than one process, else a single-process context."""
    device = torch.device(device)
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if not launched and not (dist.is_available() and dist.is_initialized()):
        return DistContext(device=device)
    ctx = init_distributed(device.type)
    if ctx.world_size == 1:
        return DistContext(device=device)
    if device.type == "cuda" and device.index is not None and device != ctx.device:
        raise ValueError(
            f"device {str(device)!r} conflicts with LOCAL_RANK {ctx.local_rank}: under torchrun "
            "pass device='cuda' and every rank takes its own GPU"
        )
    return ctx


def shard(index: Tensor, ctx: DistContext) -> Tensor:
    """Rank ``r``'s share ``index[r::K]`` of a global batch of sample indices (all of it when
    running alone)."""
    return index if not ctx.distributed else index[ctx.rank :: ctx.world_size]


def shard_weight(local: int, total: int) -> float:
    """``w_r = n_r / B``: the weight of a rank's mean objective over its ``n_r`` of the ``B``
    samples of a global batch (module docstring)."""
    return local / total


def _flat_all_reduce(values: Tensor, ctx: DistContext) -> Tensor:
    if ctx.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_reduce_gradients(
    params: Sequence[Tensor], weight: float, loss: Tensor, ctx: DistContext
) -> Tensor:
    """Sum ``weight * grad`` of every parameter, and ``weight * loss``, over the ranks, in one
    all-reduce; the gradients are replaced in place (a missing gradient counts as zero).

    Args:
        params: the trained parameters, in the same order on every rank.
        weight: this rank's :func:`shard_weight`.
        loss: this rank's scalar objective (detached).
        ctx: the :class:`DistContext`.

    Returns:
        the global objective ``sum_r w_r loss_r`` (a 0-d tensor, identical on every rank).
    """
    pieces = [loss.detach().reshape(1).to(torch.float64)]
    for p in params:
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        pieces.append(grad.reshape(-1).to(torch.float64))
    flat = _flat_all_reduce(torch.cat([q.to(ctx.device) for q in pieces]) * weight, ctx)
    offset = 1
    for p in params:
        size = p.numel()
        p.grad = flat[offset : offset + size].view_as(p).to(p.dtype).clone()
        offset += size
    return flat[0]


def broadcast_parameters(params: Iterable[Tensor], ctx: DistContext) -> None:
    """Overwrite every parameter with rank 0's values (in place, same order on every rank)."""
    if not ctx.distributed:
        return
    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=0)


def reduce_metrics(metrics: dict[str, float], count: int, ctx: DistContext) -> dict[str, float]:
    """Global values of per-rank metrics computed on ``count`` samples each.

    Means (a loss, an error rate, a mean log-likelihood) are combined weighted by ``count``; a
    key ``"rmse"`` (a root mean square) through its square. Identical on every rank.
    """
    if not ctx.distributed:
        return dict(metrics)
    names = sorted(metrics)
    values = [
        (metrics[k] ** 2 if k == "rmse" else metrics[k]) * count if count else 0.0 for k in names
    ]
    total = _flat_all_reduce(
        torch.tensor([*values, float(count)], dtype=torch.float64, device=ctx.device), ctx
    ).tolist()
    n = total[-1]
    out = {k: v / n for k, v in zip(names, total[:-1], strict=True)}
    if "rmse" in out:
        out["rmse"] = math.sqrt(out["rmse"])
    return out


def broadcast_seed(seed: int | None, ctx: DistContext) -> int | None:
    """``seed``, or when it is ``None`` under ``torchrun`` a random seed drawn on rank 0 and
    shared, so that every rank draws the same global batches."""
    if seed is not None or not ctx.distributed:
        return seed
    value = torch.tensor([int(torch.randint(0, 2**31 - 1, ()))], device=ctx.device)
    dist.broadcast(value, src=0)
    return int(value)


def _shareable(error: Exception) -> Exception:
    """``error`` if it survives pickling (to travel to the other ranks), else a ``RuntimeError``
    with its type and message."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"on rank 0: {type(error).__name__}: {error}")
    return error


def on_main_rank(fn: Callable[[], T], ctx: DistContext) -> T:
    """``fn()`` on rank 0 alone, its outcome shared: every rank returns rank 0's result, or
    raises the exception rank 0 raised (a collective, which every rank calls; alone: ``fn()``).

    What rank 0 alone does -- check and lock the output folder, read and verify a checkpoint,
    write one -- can fail there alone; shared, its error reaches every rank at once, instead of
    leaving the others at their next collective until the process group's timeout (30 minutes
    by default). The result travels by :func:`torch.distributed.broadcast_object_list`
    (pickled), so that the other ranks need no file of their own.
    """
    if not ctx.distributed:
        return fn()
    box: list[Any] = [None]
    failure: Exception | None = None
    if ctx.is_main:
        try:
            box[0] = (True, fn())
        except Exception as error:
            failure = error
            box[0] = (False, _shareable(error))
    dist.broadcast_object_list(box, src=0)
    ok, value = box[0]
    if failure is not None:
        raise failure
    if not ok:
        raise value
    return value


class DataParallelObjective(nn.Module):
    """``scale * model.loss(x, y) + model.penalty()`` as a ``forward`` -- the module
    :class:`~torch.nn.parallel.DistributedDataParallel` wraps to hook its gradient all-reduce
    into (the :class:`~pyro_gpn.inference.Trainer` interface)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, y: Tensor, scale: float = 1.0) -> Tensor:
        return scale * self.model.loss(x, y) + self.model.penalty()
