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

import csv
import dataclasses
import io
import json
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..io import CorruptFileError, atomic_write, checksum_path, load_torch, save_torch
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


def _write_text(path: Path, write: Callable[[io.StringIO], None]) -> None:
    """Write text through :func:`pyro_gpn.io.atomic_write` (no checksum: these files are for
    people and spreadsheets, the library never reads them back)."""
    buffer = io.StringIO(newline="")
    write(buffer)
    data = buffer.getvalue().encode("utf-8")
    atomic_write(path, lambda handle: handle.write(data), checksum=False)


def rng_state(generator: torch.Generator | None, device: torch.device) -> dict[str, Any]:
    """The states of torch's, NumPy's, Python's (and CUDA's) generators and ``generator`` (if
    any)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "python": random.getstate(),
    }
    if generator is not None:
        state["shuffle"] = generator.get_state()
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], generator: torch.Generator | None) -> None:
    """Restore what :func:`rng_state` recorded."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))  # noqa: NPY002
    random.setstate(state["python"])
    if generator is not None:
        generator.set_state(state["shuffle"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


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


def _warn_changed(saved: dict[str, Any], now: dict[str, Any], resumable: set[str]) -> None:
    changed = sorted(
        key for key, value in saved.items() if key not in resumable and now.get(key) != value
    )
    if changed:
        logger.warning("resuming with changed settings %s: not a continuation", changed)


def load_checkpoint(out_dir: Path, config: TrainConfig) -> dict[str, Any] | None:
    """The checkpoint in ``out_dir`` (``None`` if there is none); warns about changed settings."""
    path = out_dir / CHECKPOINT_NAME
    if not path.exists():
        logger.info("no checkpoint in %s, starting afresh", out_dir)
        return None
    # checkpoints written before checksums existed load unverified
    checkpoint = _load_for_resume(path, require_checksum=checksum_path(path).exists())
    _warn_changed(checkpoint["config"], dataclasses.asdict(config), _RESUMABLE_CHANGES)
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


def load_svi_checkpoint(out_dir: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """``svi_checkpoint.pt`` in ``out_dir``, verified against its checksum (``None`` if there is
    none); warns about settings that changed since it was written (``num_steps`` may)."""
    path = out_dir / SVI_CHECKPOINT_NAME
    if not path.exists():
        logger.info("no SVI checkpoint in %s, starting afresh", out_dir)
        return None
    checkpoint = _load_for_resume(path, require_checksum=True)
    _warn_changed(checkpoint["settings"], settings, set())
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
        "config": dataclasses.asdict(config),
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
