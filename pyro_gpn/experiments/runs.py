"""One training run: which network, how it is trained, how it is scored and recorded.

* :class:`ModelSettings` and :func:`build_model`: the networks of ``pyro-gpn train`` and of the
  paper grid (:data:`CLI_MODELS`: a GPN or a tanh baseline);
* :class:`Schedule`: the paper's training schedule (Adam, learning rate divided by 10 on a
  validation plateau, early stopping) as a :class:`~pyro_gpn.inference.trainer.TrainConfig`;
* :func:`split_metrics`: the metrics of a trained network on one split (:mod:`pyro_gpn.metrics`),
  regression in original units;
* :func:`machine_description` and :func:`write_atomically`: what every result file records
  and how it is written.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..recommended import GPN
from .options import nonnegative_int, option, positive_float, positive_int, probability

__all__ = [
    "CLI_MODELS",
    "ModelSettings",
    "Schedule",
    "build_model",
    "machine_description",
    "split_metrics",
    "task_of",
    "write_atomically",
]

#: ``pyro-gpn train --model`` choices.
CLI_MODELS = ("gpn", "tanh", "tanh-dropout", "tanh-fastdropout")


@dataclass
class ModelSettings:
    """Which network to build (the options of ``pyro-gpn train``); see :func:`build_model`."""

    model: str = field(default="gpn", metadata=option("network kind", choices=CLI_MODELS))
    mode: str = field(
        default="meanvar", metadata=option("GPN propagation", choices=("mean", "meanvar", "cov"))
    )
    sizes: tuple[int, ...] = field(
        default=(30, 15),
        metadata=option(
            "hidden layer widths; input and output widths come from the data",
            type=positive_int,
            nargs="+",
            metavar="N",
        ),
    )
    init: str = field(
        default=GPN.targets_init,
        metadata=option(
            "GPN targets init (default: pyro_gpn.recommended.GPN)", choices=("random", "identity")
        ),
    )
    share: str = field(
        default="none", metadata=option("GPN activation sharing", choices=("none", "layer"))
    )
    dropout: float = field(
        default=0.2,
        metadata=option("drop rate of the dropout baselines' hidden units", type=probability),
    )
    input_dropout: float | None = field(
        default=None,
        metadata=option(
            "drop rate of their inputs (None: --dropout; 0: hidden units only)", type=probability
        ),
    )

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ModelSettings:
        """The settings stored in a run's ``result.json`` (fields it lacks keep defaults)."""
        names = {f for f in cls.__dataclass_fields__ if f in record}
        return cls(**{name: record[name] for name in names})

    def build(self, data: Any) -> nn.Module:
        """The network for ``data``: input and output widths and the head from the data."""
        sizes = [data.num_features, *self.sizes, output_width(data)]
        head = "softmax" if task_of(data) == "classification" else "gaussian"
        return build_model(
            self.model,
            sizes,
            head,
            mode=self.mode,
            init=self.init,
            share=self.share,
            dropout=self.dropout,
            input_dropout=self.input_dropout,
        )


@dataclass
class Schedule:
    """The training schedule's options (``pyro-gpn train`` defaults); :meth:`config`."""

    lr: float = field(default=1e-3, metadata=option("initial learning rate", type=positive_float))
    batch_size: int = field(default=128, metadata=option("mini-batch size", type=positive_int))
    max_epochs: int = field(default=1000, metadata=option("epoch cap", type=positive_int))
    patience: int = field(
        default=30,
        metadata=option(
            "epochs without validation improvement before the learning rate is divided by 10 "
            "(the paper grid uses 30: docs/results/paper_protocol.md)",
            type=nonnegative_int,
        ),
    )

    def config(self, **kwargs: Any):
        """A :class:`~pyro_gpn.inference.trainer.TrainConfig` with these settings (and
        ``kwargs``: seed, device, task, out_dir, progress)."""
        from ..inference.trainer import TrainConfig

        return TrainConfig(**asdict(self), **kwargs)


def task_of(data: Any) -> str:
    """``"classification"`` for data with classes, else ``"regression"``."""
    return "classification" if hasattr(data, "num_classes") else "regression"


def output_width(data: Any) -> int:
    """Classes, or regression targets."""
    return data.num_classes if hasattr(data, "num_classes") else data.y_train.shape[1]


def build_model(
    model: str,
    sizes: list[int] | tuple[int, ...],
    head: str,
    *,
    mode: str = "meanvar",
    init: str = GPN.targets_init,
    share: str = "none",
    dropout: float = 0.2,
    input_dropout: float | None = None,
) -> nn.Module:
    """Build one of the ``pyro-gpn train`` models (:data:`CLI_MODELS`).

    Args:
        model: ``"gpn"`` (:class:`~pyro_gpn.GPNNet`), ``"tanh"``, ``"tanh-dropout"`` (standard,
            sampled dropout) or ``"tanh-fastdropout"`` (fast dropout, the paper's baseline), the
            last three :class:`~pyro_gpn.models.baselines.FixedActivationNet`.
        sizes: all widths, ``[inputs, *hidden, outputs]`` (outputs: classes or targets).
        head: ``"softmax"`` (classification) or ``"gaussian"`` (regression).
        mode, init, share: GPN only: propagation mode, targets init and sharing.
        dropout: drop probability of the dropout baselines' hidden units.
        input_dropout: drop probability of their inputs (``None``: ``dropout``).
    """
    from ..models.baselines import FixedActivationNet
    from ..network import GPNNet

    sizes = [int(s) for s in sizes]
    if model == "gpn":
        return GPNNet(sizes, mode=mode, head=head, targets_init=init, share=share)
    if model == "tanh":
        return FixedActivationNet(sizes, head=head)
    if model in ("tanh-dropout", "tanh-fastdropout"):
        fast = model == "tanh-fastdropout"
        return FixedActivationNet(
            sizes, head=head, dropout=dropout, input_dropout=input_dropout, fast_dropout=fast
        )
    raise ValueError(f"model must be one of {CLI_MODELS}, got {model!r}")


@torch.no_grad()
def split_metrics(model: nn.Module, data: Any, split: str, device: str = "cpu") -> dict[str, float]:
    """Metrics of ``model`` on one split (``"train"``, ``"val"`` or ``"test"``) of ``data``.

    Classification: ``{"error": ...}`` (misclassification rate). Regression:
    ``{"rmse": ..., "log_likelihood": ...}`` in the original units of the targets
    (:func:`~pyro_gpn.metrics.rmse` of the predictive mean; the mean log predictive density
    under the model's head, :meth:`~pyro_gpn.heads.Head.log_predictive`, minus
    ``sum_d log y_std_d``: the Gaussian ``N(mean, var)`` of a Gaussian head, a full output
    covariance reduced to its diagonal, and the Gauss-Hermite mixture of a heteroscedastic
    head, whose predictive is not Gaussian).
    """
    from ..inference.trainer import evaluate
    from ..metrics import rmse

    x = getattr(data, f"x_{split}").to(device)
    y = getattr(data, f"y_{split}").to(device)
    if task_of(data) == "classification":
        return evaluate(model, x, y, "classification")
    was_training = model.training
    model.eval()
    try:
        features = model.hidden(x)
        mean = model.head.predictive(features).mean
        log_density = model.head.log_predictive(features, y)
    finally:
        model.train(was_training)
    scale = data.y_std.to(device=device, dtype=mean.dtype)
    log_scale = scale.log().expand(mean.shape[-1:]).sum()
    return {
        "rmse": float(rmse(mean, y.reshape(mean.shape).to(mean.dtype), scale)),
        "log_likelihood": float(log_density.mean() - log_scale),
    }


def machine_description(device: str = "cpu") -> str:
    """A short description of the machine, e.g. ``"2-core CPU, no GPU"``."""
    cpu = f"{os.cpu_count()}-core CPU"
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        return f"{cpu}, GPU {torch.cuda.get_device_name(torch.device(device))}"
    return f"{cpu}, no GPU"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` with :func:`pyro_gpn.io.atomic_write`: a temporary
    file unique to the process and the call, then a rename, so that readers and concurrent
    writers never see a half-written file and a failed write leaves the previous version.

    No checksum file: these are the result files committed under ``docs/results``."""
    from .. import io as pio

    data = text.encode("utf-8")
    pio.atomic_write(path, lambda handle: handle.write(data), checksum=False)
