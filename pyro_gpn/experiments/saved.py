"""A finished ``pyro-gpn train`` folder read back, verified: :func:`load_run`.

``pyro-gpn train --out DIR`` writes ``DIR/model.pt`` (the network's ``state_dict``) and, last,
``DIR/result.json`` (settings, metrics; its presence marks the run finished), each with a
SHA-256 checksum beside it (``model.pt.sha256``; :mod:`pyro_gpn.io`) and ``"format": 2`` in the
record. :func:`load_run` rebuilds the network from the recorded settings and loads its weights:

* files with a checksum (or a format-2 record) must verify: a flipped byte, a truncated file or a
  missing checksum raise :class:`~pyro_gpn.io.CorruptFileError` naming the file;
* folders written before checksums existed (no ``.sha256`` files, no ``"format"``) still load,
  with ``verified=False`` (``pyro-gpn evaluate`` prints a one-line warning);
* a record without settings, or weights that do not fit the recorded network (an edited
  ``result.json``, files of two different runs) are a :class:`~pyro_gpn.io.CorruptFileError` too.

Example::

    run = pyro_gpn.load_run("runs/yacht-gpn-seed0")
    prediction = run.model(x)  # Moments in standardised units; run.data() gives the data set
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from .. import io as pio
from .runs import ModelSettings

__all__ = ["FORMAT", "MODEL_NAME", "RESULT_NAME", "TrainedRun", "load_record", "load_run"]

RESULT_NAME = "result.json"
MODEL_NAME = "model.pt"
#: ``"format"`` of the ``result.json`` written by this version (2: checksummed files).
FORMAT = 2


@dataclass
class TrainedRun:
    """A trained network and what its ``result.json`` records.

    Attributes:
        model: the network with the trained weights (evaluation mode, on ``device``).
        settings: the recorded settings: ``dataset``, ``split``, ``seed`` and the
            :class:`~pyro_gpn.experiments.runs.ModelSettings` fields.
        record: the whole ``result.json`` (metrics, schedule, machine, ...).
        run_dir: the folder.
        verified: whether the files were checked against their checksums (``False`` only for
            folders written before checksums existed).
    """

    model: nn.Module
    settings: dict[str, Any]
    record: dict[str, Any] = field(repr=False)
    run_dir: Path
    verified: bool

    def data(self, data_dir: str | None = None, **kwargs: Any) -> Any:
        """The run's data set and split (:func:`pyro_gpn.data.load_dataset`), from ``data_dir``
        or else the folder recorded at training time."""
        from ..data import load_dataset

        data_dir = data_dir or self.record.get("data_dir")
        return load_dataset(
            self.settings["dataset"], data_dir=data_dir, split=self.settings["split"], **kwargs
        )


def _check_folder(run_dir: Path) -> None:
    if not run_dir.exists():
        raise pio.MissingFileError(
            run_dir / RESULT_NAME,
            f"the folder {run_dir} does not exist",
            "give the --out folder of `pyro-gpn train`",
        )
    if not run_dir.is_dir():
        raise pio.CorruptFileError(
            run_dir,
            f"is a file, not a directory with {RESULT_NAME} and {MODEL_NAME}",
            "give the --out folder of `pyro-gpn train`",
        )


def load_record(run_dir: str | Path) -> tuple[dict[str, Any], bool]:
    """``run_dir/result.json`` (verified where it can be) and whether it was verified.

    Raises:
        MissingFileError: no such folder or no ``result.json`` in it.
        CorruptFileError: damaged, truncated or without settings; a checksum that does not match;
            a format-2 record without its checksum.
    """
    run_dir = Path(run_dir)
    _check_folder(run_dir)
    path = run_dir / RESULT_NAME
    checked = pio.checksum_path(path).exists()
    record = pio.load_json(path, require_checksum=checked)
    if not isinstance(record, dict):
        raise pio.CorruptFileError(path, "not a `pyro-gpn train` result (not a JSON object)")
    if not checked and record.get("format", 1) >= FORMAT:
        pio.verify(path)  # a format-2 record must have its checksum: raises MissingFileError
    settings = record.get("settings")
    if not isinstance(settings, dict) or not {"dataset", "split"} <= settings.keys():
        raise pio.CorruptFileError(
            path,
            "no settings entry (dataset, split, network): not a `pyro-gpn train` result",
            "restore result.json from a copy or re-run `pyro-gpn train`",
        )
    return record, checked


def _build(record: dict[str, Any], path: Path, data: Any | None) -> nn.Module:
    """The network described by ``record`` (widths from ``record['data_shape']`` or ``data``)."""
    settings = record["settings"]
    try:
        model_settings = ModelSettings.from_record(settings)
        if data is None:
            data = _shape_only(record, path)
        return model_settings.build(data)
    except (TypeError, ValueError, KeyError) as error:
        raise pio.CorruptFileError(
            path,
            f"its settings do not describe a network ({type(error).__name__}: {error})",
            "restore result.json from a copy or re-run `pyro-gpn train`",
        ) from error


class _Shape:
    """Stands in for a data set where only its widths are needed (:meth:`ModelSettings.build`)."""

    def __init__(self, num_features: int, outputs: int, classes: bool) -> None:
        import torch

        self.num_features = num_features
        if classes:
            self.num_classes = outputs
        self.y_train = torch.empty(0, outputs)


def _shape_only(record: dict[str, Any], path: Path) -> _Shape:
    shape = record.get("data_shape")
    if not isinstance(shape, dict):
        raise KeyError("data_shape (written by `pyro-gpn train` since format 2)")
    return _Shape(
        int(shape["num_features"]), int(shape["outputs"]), shape["task"] == "classification"
    )


def data_shape(data: Any) -> dict[str, Any]:
    """What :func:`load_run` needs to rebuild a network without loading its data set."""
    from .runs import output_width, task_of

    return {
        "num_features": int(data.num_features),
        "outputs": int(output_width(data)),
        "task": task_of(data),
    }


def load_weights(model: nn.Module, run_dir: Path, verified: bool) -> nn.Module:
    """Load ``run_dir/model.pt`` into ``model``; a mismatch is a :class:`CorruptFileError`."""
    path = run_dir / MODEL_NAME
    checked = verified or pio.checksum_path(path).exists()
    state = pio.load_torch(path, require_checksum=checked)
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise pio.CorruptFileError(
            path,
            f"its weights do not fit the network described in {RESULT_NAME} ({first})",
            f"{MODEL_NAME} and {RESULT_NAME} must come from the same run: restore them from a "
            "copy or re-run `pyro-gpn train`",
        ) from error
    return model


def load_run(run_dir: str | Path, device: str = "cpu", data: Any | None = None) -> TrainedRun:
    """The trained network of a ``pyro-gpn train`` output folder, checked against its checksums.

    Args:
        run_dir: the ``--out`` folder of ``pyro-gpn train``.
        device: where to put the network.
        data: the run's data set, to take the network's widths from; only needed for folders
            written before format 2 (which do not record them; then the data set is loaded).

    Returns:
        A :class:`TrainedRun` (``.model`` in evaluation mode, ``.settings``, ``.record``).

    Raises:
        MissingFileError: no such folder, or ``result.json`` / ``model.pt`` missing.
        CorruptFileError: a damaged, truncated or edited file, a checksum that does not match, or
            weights that do not fit the recorded network; the message names the file.
    """
    run_dir = Path(run_dir)
    record, verified = load_record(run_dir)
    result_path = run_dir / RESULT_NAME
    if data is None and "data_shape" not in record:
        data = TrainedRun(nn.Module(), record["settings"], record, run_dir, verified).data()
    model = _build(record, result_path, data)
    load_weights(model, run_dir, verified)
    model.to(device).eval()
    return TrainedRun(model, dict(record["settings"]), record, run_dir, verified)
