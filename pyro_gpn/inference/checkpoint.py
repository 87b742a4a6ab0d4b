"""What :class:`~pyro_gpn.inference.trainer.Trainer` writes to its output folder and reads back.

* ``checkpoint.pt``: model, optimizer and scheduler state, the random number generator states,
  the best parameters so far and the metrics history, so that a resumed run continues
  bit-for-bit;
* ``metrics.csv`` / ``metrics.json``: the history, one row per epoch;
* ``best_model.pt``: the restored best parameters at the end.

:func:`~pyro_gpn.inference.fit_svi` writes ``svi_checkpoint.pt`` (:data:`SVI_CHECKPOINT_NAME`):
the trained parameters by their Pyro names, the optimiser state, the step, the random number
generator states and the loss history (:func:`save_svi_checkpoint`).

Every file is written through :func:`pyro_gpn.io.atomic_write` (a temporary file unique to the
process, removed on any error, then ``os.replace``): a kill, a full disk or a read-only folder
leaves the previous version intact and no partial file behind. The ``.pt`` files carry a SHA-256
checksum beside them (``checkpoint.pt.sha256``) that resuming verifies.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import logging
import math
import os
import random
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from ..io import (
    CorruptFileError,
    RunLock,
    atomic_write,
    checksum_path,
    ensure_can_write,
    load_torch,
    save_torch,
)
from .distributed import DistContext, on_main_rank
from .train_config import _RESUMABLE_CHANGES, TrainConfig

__all__ = [
    "BEST_MODEL_NAME",
    "CHECKPOINT_NAME",
    "METRICS_CSV_NAME",
    "METRICS_JSON_NAME",
    "SVI_CHECKPOINT_NAME",
    "seed_everything",
]

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
BEST_MODEL_NAME = "best_model.pt"
METRICS_CSV_NAME = "metrics.csv"
METRICS_JSON_NAME = "metrics.json"
SVI_CHECKPOINT_NAME = "svi_checkpoint.pt"


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and CUDA).

    NumPy's legacy global state is seeded on purpose: it is what third-party code (data
    augmentation, samplers) draws from when it is not handed a ``numpy.random.Generator``.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002
    torch.manual_seed(seed)


@contextlib.contextmanager
def locked_out_dir(out_dir: Path | None, ctx: DistContext, marker: str) -> Iterator[bool]:
    """The output folder of a training loop, checked (created) and locked by rank 0 for the
    loop's duration (``marker``: the loop's checkpoint, for
    :func:`~pyro_gpn.io.ensure_can_write`; not locked again if this process holds its lock
    already, as the command line does). Yields whether the loop writes checkpoints: whether
    ``out_dir`` is given -- under ``torchrun``, rank 0's ``out_dir``, the same answer on every
    rank, so that every rank calls the collectives of the checkpoints that rank 0 writes.

    Under ``torchrun`` every rank waits on entry for rank 0's outcome
    (:func:`~pyro_gpn.inference.distributed.on_main_rank`, also when ``out_dir`` is ``None``
    on some ranks): a folder rank 0 cannot use raises rank 0's error (``RunInUseError``,
    ``NotADirectoryError``, ...) on every rank at once. On a normal exit every rank waits for
    rank 0's last write. The other ranks never touch their own ``out_dir`` (which may be
    ``None``): rank 0's folder need not be shared between machines. Alone, ``None``: nothing.
    """
    with contextlib.ExitStack() as stack:

        def claim() -> bool:
            if out_dir is None:
                return False
            ensure_can_write(out_dir, overwrite=True, marker=marker)
            if not RunLock.is_held(out_dir):
                stack.enter_context(RunLock(out_dir))
            return True

        writes = on_main_rank(claim, ctx)  # rank 0's answer, on every rank
        yield writes
        if writes and ctx.distributed:
            dist.barrier()  # rank 0's last checkpoint is written


def _write_text(path: Path, write: Callable[[io.StringIO], None]) -> None:
    """Write text through :func:`pyro_gpn.io.atomic_write` (no checksum: these files are for
    people and spreadsheets, the library never reads them back)."""
    buffer = io.StringIO(newline="")
    write(buffer)
    data = buffer.getvalue().encode("utf-8")
    atomic_write(path, lambda handle: handle.write(data), checksum=False)


def rng_state(generator: torch.Generator | None, device: torch.device) -> dict[str, Any]:
    """The states of torch's CPU generator, NumPy's and Python's global generators, ``generator``
    (if any) and, when ``device`` is a CUDA device, that device's generator alone: under
    ``torchrun`` each process draws on its own GPU (``LOCAL_RANK``), never on the others."""
    name, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "python": random.getstate(),
    }
    if generator is not None:
        state["shuffle"] = generator.get_state()
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(
    state: dict[str, Any], generator: torch.Generator | None, device: torch.device
) -> None:
    """Restore what :func:`rng_state` recorded; CUDA's state goes to ``device`` alone (a CPU run
    ignores it). A ``generator`` is restored when ``state`` holds its state; when it does not (a
    single process's :func:`~pyro_gpn.inference.fit_svi` checkpoint, or one of the first
    version, resumed under ``torchrun``) a warning says that it keeps its seeded state."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))  # noqa: NPY002
    random.setstate(state["python"])
    if generator is not None:
        if "shuffle" in state:
            generator.set_state(state["shuffle"])
        else:
            logger.warning(
                "the checkpoint holds no state of the mini-batch generator (written by a single "
                "process or an earlier version): the batch order restarts from the seed (a "
                "continuation, but not the uninterrupted run's batches)"
            )
    cuda = state.get("cuda")
    if cuda is None or device.type != "cuda":
        return
    if isinstance(cuda, (list, tuple)):  # earlier checkpoints: every visible device's state
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= len(cuda):
            return
        cuda = cuda[index]
    torch.cuda.set_rng_state(cuda, device)


def gather_rng_state(generator: torch.Generator | None, ctx: DistContext) -> dict[str, Any]:
    """What a checkpoint stores of the random number generators: :func:`rng_state` of this
    process, or under ``torchrun`` that of every rank, ``{"ranks": [state of rank 0, ...]}``
    (gathered to every rank: a collective, which every rank calls).

    Every rank's state is kept because the ranks' states differ: each draws the random numbers
    of its own share of the batch (Monte Carlo samples of local latents, dropout masks), whose
    size differs between ranks when the batch does not split evenly, and its own GPU's
    generator. :func:`own_rng_state` picks a rank's state back out.
    """
    state = rng_state(generator, ctx.device)
    if not ctx.distributed:
        return state
    states: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(states, state)
    return {"ranks": states}


def own_rng_state(saved: dict[str, Any], ctx: DistContext) -> dict[str, Any]:
    """This rank's state in a record of :func:`gather_rng_state`.

    A single process's record is every rank's; a record of another number of processes gives
    every rank rank 0's state (the ranks must draw the same global batches; the run continues,
    though not as the uninterrupted run on either number of processes would have). Under
    ``torchrun`` both log a warning.
    """
    if "ranks" not in saved:
        if ctx.distributed:
            logger.warning(
                "the checkpoint holds the random states of a single process, this run has %d: "
                "every rank restores it (a continuation, but not the uninterrupted run's random "
                "numbers)",
                ctx.world_size,
            )
        return saved
    ranks = saved["ranks"]
    if len(ranks) == ctx.world_size:
        return ranks[ctx.rank]
    logger.warning(
        "the checkpoint holds the random states of %d processes, this run has %d: every rank "
        "restores rank 0's (a continuation, but not the uninterrupted run's random numbers)",
        len(ranks),
        ctx.world_size,
    )
    return ranks[0]


def save_model(state: dict[str, Tensor], path: Path) -> None:
    """``torch.save`` a ``state_dict`` atomically, with its checksum beside it."""
    save_torch(state, path)


def _load_for_resume(path: Path, require_checksum: bool) -> dict[str, Any]:
    """``load_torch(path)`` with the way out of a damaged file in the error's message."""
    try:
        return load_torch(path, require_checksum=require_checksum)
    except CorruptFileError as error:
        raise CorruptFileError(
            error.path,
            error.reason,
            "resume cannot continue from it: fit with resume=False (or remove the file) to "
            "start afresh",
        ) from error


def plain_settings(value: Any) -> Any:
    """``value`` (a dict of settings) with plain Python values, as a checkpoint records them: a
    NumPy scalar becomes its Python value, a subclass of ``bool``, ``int``, ``float`` or ``str``
    that type, a path its string, inside dicts, lists and tuples too; anything else is kept.
    ``torch.load(..., weights_only=True)`` refuses NumPy scalars and paths (the checkpoint would
    read as damaged)."""
    if isinstance(value, np.generic):
        return value.item()
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, dict):
        return {plain_settings(key): plain_settings(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain_settings(item) for item in value)
    return value


def same_setting(now: Any, saved: Any, strict: bool = False) -> bool:
    """Whether a setting's value ``now`` is the checkpoint's ``saved``: equal, inside dicts,
    lists and tuples too, with a float NaN the same as a float NaN (``nan != nan`` would refuse
    every resumption of a run with one). ``strict``: the types must match as well, so that
    ``1`` is not ``1.0`` and ``True`` not ``1`` (a model may branch on the type of an argument;
    a learning rate of ``1`` and ``1.0`` is the same run, so settings other than a model's
    arguments compare loosely)."""
    if isinstance(now, float) and isinstance(saved, float) and math.isnan(now):
        return math.isnan(saved)
    if strict and type(now) is not type(saved):
        return False
    if isinstance(now, dict) and isinstance(saved, dict):
        return now.keys() == saved.keys() and all(
            same_setting(now[key], saved[key], strict) for key in now
        )
    if isinstance(now, (list, tuple)) and isinstance(saved, (list, tuple)):
        return len(now) == len(saved) and all(
            same_setting(a, b, strict) for a, b in zip(now, saved)
        )
    return bool(now == saved)


def check_resume_settings(
    path: Path,
    saved: dict[str, Any],
    now: dict[str, Any],
    may_change: Collection[str],
    strict: Collection[str] = (),
) -> None:
    """Refuse to resume from the checkpoint ``path``, written with the settings ``saved``, under
    other settings ``now``: a resumed run continues the saved one, never a mix of two.

    Every setting of ``now`` that the checkpoint records is compared (:func:`same_setting`),
    except those in ``may_change`` (which cannot change the trajectory: a longer run, the
    output folder, a seed that the restored generator states replace); those in ``strict``
    compare their types too.

    Raises:
        ValueError: naming every changed setting with its value now and the checkpoint's.
    """
    changed = sorted(
        key
        for key in now
        if key in saved
        and key not in may_change
        and not same_setting(now[key], saved[key], key in strict)
    )
    if changed:
        listed = ", ".join(f"{key}={now[key]!r} (checkpoint: {saved[key]!r})" for key in changed)
        raise ValueError(
            f"cannot resume from {path} with other settings than it was written with: {listed}. "
            "A resumed run continues the saved one: pass the checkpoint's settings, or start "
            "afresh with resume=False (or another out_dir)"
        )


def load_checkpoint(out_dir: Path, config: TrainConfig) -> dict[str, Any] | None:
    """The checkpoint in ``out_dir`` (``None`` if there is none), refused if it was written
    with other settings than ``config`` (:func:`check_resume_settings`; these may change:
    ``max_epochs``, ``seed``, ``progress``, ``out_dir``, ``device``, ``eval_batch_size``)."""
    path = out_dir / CHECKPOINT_NAME
    if not path.exists():
        logger.info("no checkpoint in %s, starting afresh", out_dir)
        return None
    # checkpoints written before checksums existed load unverified
    checkpoint = _load_for_resume(path, require_checksum=checksum_path(path).exists())
    check_resume_settings(
        path, checkpoint["config"], plain_settings(dataclasses.asdict(config)), _RESUMABLE_CHANGES
    )
    return checkpoint


def save_svi_checkpoint(
    out_dir: Path,
    *,
    params: dict[str, Tensor],
    optim_state: dict[str, Any],
    rng: dict[str, Any],
    step: int,
    losses: list[float],
    wall_time: float,
    settings: dict[str, Any],
) -> None:
    """Write ``svi_checkpoint.pt`` of :func:`~pyro_gpn.inference.fit_svi` atomically with its
    checksum: the unconstrained parameters by their Pyro names, the optimiser's state
    (:meth:`pyro.optim.PyroOptim.get_state`), the random number generator states, the step, the
    loss history, the loop's wall time and the run's settings."""
    checkpoint = {
        "params": {name: value.detach().clone() for name, value in params.items()},
        "optim": optim_state,
        "rng": rng,
        "step": step,
        "losses": list(losses),
        "wall_time": wall_time,
        "settings": settings,
    }
    save_torch(checkpoint, out_dir / SVI_CHECKPOINT_NAME)


def load_svi_checkpoint(
    out_dir: Path, settings: dict[str, Any], may_change: Collection[str]
) -> dict[str, Any] | None:
    """``svi_checkpoint.pt`` in ``out_dir``, verified against its checksum (``None`` if there is
    none), refused if it was written with other ``settings`` than these, except those in
    ``may_change`` (:func:`check_resume_settings`)."""
    path = out_dir / SVI_CHECKPOINT_NAME
    if not path.exists():
        logger.info("no SVI checkpoint in %s, starting afresh", out_dir)
        return None
    checkpoint = _load_for_resume(path, require_checksum=True)
    check_resume_settings(
        path, checkpoint["settings"], settings, may_change, strict=("model_kwargs",)
    )
    return checkpoint


def save_checkpoint(
    out_dir: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    rng: dict[str, Any],
    best_state: dict[str, Tensor] | None,
    result: Any,
    step: int,
    elapsed: float,
    config: TrainConfig,
) -> None:
    """Write the metrics and then ``checkpoint.pt`` of the epoch just completed.

    Metrics first: a kill between the two writes leaves them one epoch ahead of the checkpoint,
    and resuming rewrites them from the checkpoint's history.
    """
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng,
        "best_state": best_state,
        "result": dataclasses.asdict(result),
        "step": step,
        "elapsed": elapsed,
        "config": plain_settings(dataclasses.asdict(config)),
    }
    write_metrics(out_dir, result.history)
    save_torch(checkpoint, out_dir / CHECKPOINT_NAME)


def write_metrics(out_dir: Path, history: list[dict[str, Any]]) -> None:
    """``metrics.csv`` (one column per key seen in any row) and ``metrics.json``."""
    columns: list[str] = []
    for row in history:
        columns.extend(key for key in row if key not in columns)

    def write_csv(handle) -> None:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(history)

    _write_text(out_dir / METRICS_CSV_NAME, write_csv)
    _write_text(out_dir / METRICS_JSON_NAME, lambda handle: json.dump(history, handle, indent=1))
