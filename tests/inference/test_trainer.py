"""Tests of pyro_gpn.inference.trainer with small stand-in models."""

import csv
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pyro_gpn.inference.trainer import (
    BEST_MODEL_NAME,
    CHECKPOINT_NAME,
    METRICS_CSV_NAME,
    METRICS_JSON_NAME,
    TrainConfig,
    Trainer,
    evaluate,
    seed_everything,
)
from pyro_gpn.io import load_torch
from pyro_gpn.models.baselines import FixedActivationNet
from pyro_gpn.moments.gaussian import Moments


class SoftmaxRegression(nn.Module):
    """Linear classifier with dropout: exercises the global RNG, penalty and optimizer state."""

    def __init__(self, m, c, dropout=0.3):
        super().__init__()
        self.linear = nn.Linear(m, c)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return Moments(self.linear(self.drop(x)), validate=False)

    def loss(self, x, y):
        return F.cross_entropy(self(x).mean, y)

    def penalty(self):
        return 1e-3 * self.linear.weight.square().sum()


class ScriptedModel(nn.Module):
    """Training pulls ``w`` towards 1; the validation loss follows a given script."""

    def __init__(self, val_losses, nan_at_step=None):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.val_losses = list(val_losses)
        self.snapshots = []  # w at each validation
        self.steps = 0
        self.nan_at_step = nan_at_step

    def forward(self, x):
        return Moments(x[:, :1] * self.w, validate=False)

    def loss(self, x, y):
        if self.training:
            self.steps += 1
            if self.steps == self.nan_at_step:
                return self.w.sum() * float("nan")
            return (self.w - 1).square().sum()
        self.snapshots.append(float(self.w))
        value = self.val_losses[min(len(self.snapshots), len(self.val_losses)) - 1]
        return self.w.sum() * 0 + value

    def penalty(self):
        return self.w.new_zeros(())


def _blobs(seed, n_per_class=30):
    g = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[0.0, 2.0], [2.0, -1.0], [-2.0, -1.0]])
    x = torch.cat([c + 0.7 * torch.randn(n_per_class, 2, generator=g) for c in centres])
    y = torch.arange(3).repeat_interleave(n_per_class)
    return x, y


def _config(tmp_path=None, **kwargs):
    base = dict(batch_size=16, max_epochs=10, patience=2, progress=False)
    if tmp_path is not None:
        base["out_dir"] = str(tmp_path)
    base.update(kwargs)
    return TrainConfig(**base)


def _dummy_data(n=12):
    return (torch.zeros(n, 1), torch.zeros(n, dtype=torch.long))


# ---------------------------------------------------------------------------------- schedule
def test_plateau_schedule_and_stop_at_min_lr(tmp_path):
    # The validation loss never improves after the first evaluation. With patience 2 the lr is
    # divided by 10 after every 3 bad evaluations: 1e-3 -> 1e-4 -> 1e-5 -> 1e-6, and 3 more bad
    # evaluations at 1e-6 end training: 1 + 4 * 3 = 13 epochs.
    model = ScriptedModel([1.0])
    result = Trainer(model, _config(tmp_path, max_epochs=100, batch_size=4)).fit(
        _dummy_data(), _dummy_data()
    )
    assert result.stop_reason == "min_lr"
    assert result.epochs == 13
    lrs = [row["lr"] for row in result.history]
    expected = [1e-3] * 4 + [1e-4] * 3 + [1e-5] * 3 + [1e-6] * 3
    assert lrs == pytest.approx(expected, rel=1e-9)
    assert result.best_epoch == 1


def test_eval_every_and_max_epochs():
    model = ScriptedModel([5.0, 4.0, 3.0, 2.0])
    result = Trainer(model, _config(max_epochs=7, eval_every=3, batch_size=4)).fit(
        _dummy_data(), _dummy_data()
    )
    assert result.stop_reason == "max_epochs" and result.epochs == 7
    evaluated = [row["epoch"] for row in result.history if "val_loss" in row]
    assert evaluated == [3, 6, 7]  # every 3rd epoch and the last one


def test_best_parameters_restored(tmp_path):
    model = ScriptedModel([3.0, 2.0, 1.0, 2.0, 3.0, 4.0])
    result = Trainer(model, _config(tmp_path, max_epochs=6, batch_size=4, lr=0.1)).fit(
        _dummy_data(), _dummy_data()
    )
    assert result.best_epoch == 3 and result.best_val_loss == 1.0
    assert float(model.w.detach()) == model.snapshots[2]
    assert model.snapshots[2] != model.snapshots[-1]  # training did move w afterwards
    saved = torch.load(tmp_path / BEST_MODEL_NAME, weights_only=True)
    assert float(saved["w"]) == model.snapshots[2]


def test_non_finite_loss_raises_and_keeps_checkpoint(tmp_path):
    # 12 samples in batches of 4: 3 steps per epoch, so step 5 is in epoch 2
    model = ScriptedModel([1.0], nan_at_step=5)
    trainer = Trainer(model, _config(tmp_path, batch_size=4))
    with pytest.raises(FloatingPointError, match="epoch 2, step 5"):
        trainer.fit(_dummy_data(), _dummy_data())
    checkpoint = torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)
    assert checkpoint["result"]["epochs"] == 1


def test_plateau_schedule_uses_lr_factor():
    # lr_factor=0.5 instead of the paper's 0.1: with patience 2 the lr is halved after every 3
    # bad evaluations, 1e-3 -> 5e-4 -> 2.5e-4 (exactly: halving is exact in binary floats)
    model = ScriptedModel([1.0])
    result = Trainer(model, _config(max_epochs=10, batch_size=4, lr_factor=0.5)).fit(
        _dummy_data(), _dummy_data()
    )
    lrs = [row["lr"] for row in result.history]
    assert lrs == [1e-3] * 4 + [1e-3 * 0.5] * 3 + [1e-3 * 0.25] * 3
    assert result.stop_reason == "max_epochs"


class RecordingModel(nn.Module):
    """Training loss: the mean of the batch's targets (``y_i = i^2`` for row ``i``), at the
    minimum of ``w^2`` so that Adam's steps (zero gradients) leave ``w`` at 0; penalty: 0.25.
    Records the rows (``x[:, 0]`` holds the row index) of every training batch."""

    PENALTY = 0.25

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.batches = []

    def forward(self, x):
        return Moments(x[:, :1] * 0 + self.w, var=torch.ones_like(x[:, :1]), validate=False)

    def loss(self, x, y):
        if self.training:
            self.batches.append(x[:, 0].long().tolist())
        return y[:, 0].mean() + self.w.square().sum()

    def penalty(self):
        return self.w.new_tensor(self.PENALTY) + 0 * self.w.sum()


def _indexed_rows(n):
    rows = torch.arange(n, dtype=torch.float32)
    return rows[:, None], rows.square()[:, None]


def test_train_loss_is_the_row_weighted_mean_of_loss_plus_penalty():
    # 10 rows in batches of 4: 4 + 4 + 2. Each step's objective is mean(y_batch) + 0.25; the
    # epoch's train_loss weights each by its rows: (sum_i i^2) / 10 + 0.25 = 28.5 + 0.25
    model = RecordingModel()
    data = _indexed_rows(10)
    result = Trainer(model, _config(max_epochs=2, batch_size=4, lr=0.1)).fit(data, data)
    assert [len(b) for b in model.batches] == [4, 4, 2, 4, 4, 2]
    expected = sum(i * i for i in range(10)) / 10 + RecordingModel.PENALTY
    assert expected == 28.75
    for row in result.history:
        assert row["train_loss"] == pytest.approx(expected, rel=1e-6)
    assert float(model.w.detach()) == 0.0  # the objective did not move between the steps


def test_each_epoch_visits_the_seeded_permutation_of_the_rows():
    # the shuffling generator is a torch.Generator seeded with config.seed at the start of a
    # fresh run; epoch e takes its e-th randperm, cut into consecutive batches
    seed = 7
    model = RecordingModel()
    data = _indexed_rows(10)
    Trainer(model, _config(max_epochs=2, batch_size=4, seed=seed)).fit(data, data)
    generator = torch.Generator().manual_seed(seed)
    expected = []
    for _ in range(2):
        order = torch.randperm(10, generator=generator).tolist()
        expected.append([order[0:4], order[4:8], order[8:10]])
    assert model.batches == expected[0] + expected[1]
    assert expected[0] != expected[1]  # the order changes between epochs
    assert sorted(sum(expected[0], [])) == list(range(10))


# ---------------------------------------------------------------------------------- resume
def _params(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_resume_equals_uninterrupted_run(tmp_path):
    x, y = _blobs(0)
    xv, yv = _blobs(1, 10)
    cfg = dict(max_epochs=9, batch_size=16, lr=0.5, patience=0, seed=3)

    torch.manual_seed(123)
    straight = SoftmaxRegression(2, 3)
    full = Trainer(straight, _config(tmp_path / "a", **cfg)).fit((x, y), (xv, yv))

    torch.manual_seed(123)
    first = SoftmaxRegression(2, 3)
    Trainer(first, _config(tmp_path / "b", **{**cfg, "max_epochs": 4})).fit((x, y), (xv, yv))
    # scramble every global generator and start from a different model: the checkpoint must
    # restore all of it
    seed_everything(999)
    resumed_model = SoftmaxRegression(2, 3)
    resumed = Trainer(resumed_model, _config(tmp_path / "b", **cfg)).fit(
        (x, y), (xv, yv), resume=True
    )

    assert resumed.epochs == full.epochs == 9
    for key, value in _params(straight).items():
        assert torch.equal(value, resumed_model.state_dict()[key]), key
    keys = ("train_loss", "val_loss", "val_error", "lr", "step")
    assert [{k: r.get(k) for k in keys} for r in resumed.history] == [
        {k: r.get(k) for k in keys} for r in full.history
    ]
    assert len({row["lr"] for row in full.history}) > 1  # the schedule was exercised
    assert (resumed.best_epoch, resumed.best_val_loss) == (full.best_epoch, full.best_val_loss)

    # the same last state too (not only the restored best one), and the same schedule state
    last_a = torch.load(tmp_path / "a" / CHECKPOINT_NAME, weights_only=True)
    last_b = torch.load(tmp_path / "b" / CHECKPOINT_NAME, weights_only=True)
    assert all(torch.equal(last_a["model"][k], last_b["model"][k]) for k in last_a["model"])
    assert last_a["scheduler"] == last_b["scheduler"]
    assert torch.equal(last_a["rng"]["shuffle"], last_b["rng"]["shuffle"])


def test_numpy_scalar_config_resumes(tmp_path):
    """A TrainConfig with NumPy scalars (lr=np.float64) is recorded with Python values, which
    weights_only=True loads: the run resumes (with a Python float as the same lr)."""
    x, y = _dummy_data()
    Trainer(SoftmaxRegression(1, 2), _config(tmp_path, lr=np.float64(0.01), max_epochs=1)).fit(
        (x, y), (x, y)
    )
    assert type(load_torch(tmp_path / "checkpoint.pt")["config"]["lr"]) is float
    result = Trainer(SoftmaxRegression(1, 2), _config(tmp_path, lr=0.01, max_epochs=2)).fit(
        (x, y), (x, y), resume=True
    )
    assert result.epochs == 2


def test_numpy_scalar_settings_are_python_numbers_in_the_run_too():
    """Not only in the checkpoint: the run itself steps with the Python value, as a resumed run
    (which reads the checkpoint's) does; a NumPy integer batch size is accepted."""
    config = TrainConfig(lr=np.float32(0.1), batch_size=np.int64(8), min_lr=np.float32(1e-6))
    assert type(config.lr) is float and config.lr == float(np.float32(0.1))
    assert type(config.batch_size) is int and config.batch_size == 8
    assert type(config.min_lr) is float


def test_resume_of_finished_run_returns_immediately(tmp_path):
    Trainer(ScriptedModel([1.0]), _config(tmp_path, max_epochs=100, batch_size=4)).fit(
        _dummy_data(), _dummy_data()
    )
    model = ScriptedModel([1.0])
    result = Trainer(model, _config(tmp_path, max_epochs=100, batch_size=4)).fit(
        _dummy_data(), _dummy_data(), resume=True
    )
    assert result.stop_reason == "min_lr" and result.epochs == 13
    assert model.steps == 0


def test_resume_with_another_configuration_is_refused(tmp_path):
    """A resumed run continues the saved one: another lr or patience raises naming both values
    (nothing is trained); another seed (replaced by the restored generators), max_epochs or
    progress setting resumes."""
    x, y = _blobs(0)
    Trainer(SoftmaxRegression(2, 3), _config(tmp_path, max_epochs=2)).fit((x, y), (x, y))
    changed = _config(tmp_path, max_epochs=3, lr=0.01, patience=4)
    message = r"lr=0\.01 \(checkpoint: 0\.001\), patience=4 \(checkpoint: 2\)"
    with pytest.raises(ValueError, match=message):
        Trainer(SoftmaxRegression(2, 3), changed).fit((x, y), (x, y), resume=True)
    assert torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)["result"]["epochs"] == 2
    allowed = _config(tmp_path, max_epochs=3, seed=123, progress=True)
    result = Trainer(SoftmaxRegression(2, 3), allowed).fit((x, y), (x, y), resume=True)
    assert result.epochs == 3


def test_resume_without_checkpoint_starts_afresh(tmp_path):
    x, y = _blobs(0)
    torch.manual_seed(1)
    a = SoftmaxRegression(2, 3)
    Trainer(a, _config(tmp_path / "a", max_epochs=3)).fit((x, y), (x, y))
    torch.manual_seed(1)
    b = SoftmaxRegression(2, 3)
    Trainer(b, _config(tmp_path / "b", max_epochs=3)).fit((x, y), (x, y), resume=True)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


# ---------------------------------------------------------------------------------- outputs
def test_metrics_files(tmp_path):
    x, y = _blobs(0)
    result = Trainer(SoftmaxRegression(2, 3), _config(tmp_path, max_epochs=4)).fit((x, y), (x, y))
    with open(tmp_path / METRICS_CSV_NAME) as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
    assert {"train_loss", "val_loss", "val_error", "lr", "epoch_time"} <= set(rows[0])
    assert float(rows[-1]["val_loss"]) == pytest.approx(result.history[-1]["val_loss"])
    with open(tmp_path / METRICS_JSON_NAME) as handle:
        assert json.load(handle) == result.history
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_fixed_activation_net_classification_and_regression(tmp_path):
    torch.manual_seed(0)
    x, y = _blobs(0)
    xv, yv = _blobs(1, 20)
    net = FixedActivationNet([2, 8, 3], dropout=0.1, fast_dropout=True)
    result = Trainer(net, _config(tmp_path / "c", max_epochs=40, lr=0.02)).fit((x, y), (xv, yv))
    assert result.history[-1]["val_loss"] < 0.5 * result.history[0]["val_loss"]
    assert evaluate(net, xv, yv)["error"] < 0.1

    g = torch.Generator().manual_seed(2)
    xr = torch.rand(120, 1, generator=g) * 4 - 2
    yr = torch.sin(2 * xr) + 0.1 * torch.randn(120, 1, generator=g)
    reg = FixedActivationNet([1, 16, 1], head="gaussian")
    cfg = _config(tmp_path / "r", max_epochs=60, lr=0.02, batch_size=32)
    result = Trainer(reg, cfg).fit((xr[:100], yr[:100]), (xr[100:], yr[100:]))
    assert {"val_rmse", "val_log_likelihood"} <= set(result.history[-1])
    assert result.history[-1]["val_rmse"] < 0.5 * result.history[0]["val_rmse"]


# ---------------------------------------------------------------------------------- evaluate
class FixedPredictor(nn.Module):
    def __init__(self, var=None):
        super().__init__()
        self.var = var

    def forward(self, x):
        var = None if self.var is None else torch.full_like(x, self.var)
        return Moments(x, var=var, validate=False)


def test_evaluate_metrics():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.5], [0.2, 0.1]])
    labels = torch.tensor([0, 1, 1, 1])
    assert evaluate(FixedPredictor(), logits, labels, batch_size=3) == {"error": 0.5}

    mean = torch.tensor([[0.0], [1.0], [2.0]])
    target = torch.tensor([[0.5], [1.0], [1.0]])
    metrics = evaluate(FixedPredictor(var=0.25), mean, target, batch_size=2)
    assert metrics["rmse"] == pytest.approx(math.sqrt((0.25 + 0 + 1) / 3))
    expected = torch.distributions.Normal(mean, 0.5).log_prob(target).mean()
    assert metrics["log_likelihood"] == pytest.approx(float(expected))


# ---------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"max_epochs": -1}, "max_epochs"),
        ({"patience": -1}, "patience"),
        ({"lr": 0.0}, "lr"),
        ({"min_lr": 1.0}, "min_lr"),
        ({"lr_factor": 1.0}, "lr_factor"),
        ({"eval_batch_size": 0}, "eval_batch_size"),
        ({"task": "ranking"}, "task"),
        ({"device": "meta"}, "device"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"seed": "a"}, "seed must be a non-negative integer"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_bad_fit_arguments(tmp_path):
    trainer = Trainer(ScriptedModel([1.0]), _config())
    with pytest.raises(ValueError, match="resume"):
        trainer.fit(_dummy_data(), _dummy_data(), resume=True)
    with pytest.raises(ValueError, match="train"):
        trainer.fit((torch.zeros(3, 1), torch.zeros(4)), _dummy_data())
    with pytest.raises(ValueError, match="val x"):
        trainer.fit(_dummy_data(), (torch.full((2, 1), float("nan")), torch.zeros(2)))
    with pytest.raises(TypeError, match="loss"):
        Trainer(nn.Linear(2, 2))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            Trainer(ScriptedModel([1.0]), _config(device="cuda"))


# ---------------------------------------------------------------------------------- issue 14
def test_saved_files_carry_verified_checksums(tmp_path):
    from pyro_gpn.io import checksum_path, verify

    seed_everything(0)
    train = _blobs(0)
    Trainer(SoftmaxRegression(2, 3), _config(tmp_path, max_epochs=2)).fit(train, train)
    for name in (CHECKPOINT_NAME, BEST_MODEL_NAME):
        assert checksum_path(tmp_path / name).exists()
        verify(tmp_path / name)
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_resume_from_a_damaged_checkpoint_names_the_file(tmp_path, damage):
    from pyro_gpn.io import CorruptFileError

    seed_everything(0)
    train = _blobs(0)
    Trainer(SoftmaxRegression(2, 3), _config(tmp_path, max_epochs=2)).fit(train, train)
    path = tmp_path / CHECKPOINT_NAME
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = b""
    path.write_bytes(bytes(data))
    trainer = Trainer(SoftmaxRegression(2, 3), _config(tmp_path, max_epochs=3))
    with pytest.raises(CorruptFileError, match=r"checkpoint\.pt.*resume=False"):
        trainer.fit(train, train, resume=True)


def test_out_dir_that_is_a_file_or_in_use_is_refused(tmp_path):
    from pyro_gpn.io import RunInUseError

    train = _blobs(0)
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        Trainer(SoftmaxRegression(2, 3), _config(tmp_path / "f")).fit(train, train)
    # a second process holding the folder: the lock of another PID
    import subprocess
    import sys

    out = tmp_path / "busy"
    code = (
        "import sys, time; from pyro_gpn.io import RunLock; "
        f"lock = RunLock({str(out)!r}).acquire(); print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunInUseError, match=f"in use by process {holder.pid}"):
            Trainer(SoftmaxRegression(2, 3), _config(out)).fit(train, train)
    finally:
        holder.kill()
        holder.wait()


def test_float64_and_numpy_data_are_cast_to_the_model_dtype(tmp_path):
    seed_everything(0)
    x, y = _blobs(0)
    model = SoftmaxRegression(2, 3, dropout=0.0)
    result = Trainer(model, _config(max_epochs=1)).fit((x.double().numpy(), y), (x.double(), y))
    assert math.isfinite(result.history[-1]["val_loss"])


def test_evaluate_refuses_regression_on_labels():
    x, y = _blobs(0)
    model = SoftmaxRegression(2, 3)
    with pytest.raises(ValueError, match="task='regression' needs floating targets y"):
        evaluate(model, x, y, task="regression")
    with pytest.raises(ValueError, match=r"task='regression': y \(90, 2\) does not match"):
        evaluate(model, x, torch.randn(len(x), 2), task="regression")


def test_data_on_a_device_without_data_is_refused():
    x, y = _blobs(0)
    with pytest.raises(ValueError, match="train x is on device meta"):
        Trainer(SoftmaxRegression(2, 3), _config()).fit((x.to("meta"), y.to("meta")), (x, y))
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda', got 'tpu'"):
        TrainConfig(device="tpu")


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_evaluate_refuses_a_batch_size_that_is_not_a_positive_integer(batch_size):
    """``batch_size=0`` raised ``range() arg 3 must not be zero``."""
    x, y = _blobs(0)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        evaluate(SoftmaxRegression(2, 3), x, y, batch_size=batch_size)


@pytest.mark.parametrize("shift", [5, -5])
def test_evaluate_refuses_labels_outside_the_classes(shift):
    """Out-of-range labels were scored as errors: ``{'error': 1.0}``."""
    from pyro_gpn import GPNNet

    x, y = _blobs(0)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"data y must hold class labels in \[0, 3\)"):
        evaluate(GPNNet([2, 3, 3]), x, y + shift)
    # a model without a head: the class count comes from its predictions
    with pytest.raises(ValueError, match=r"(data y|labels).* class labels"):
        evaluate(FixedPredictor(), torch.randn(4, 2), torch.tensor([0, 1, 2, 1]) + shift)


def test_evaluate_checks_the_labels_once_not_per_batch(monkeypatch):
    """The labels were read back on entry and again (min and max) in every batch."""
    from pyro_gpn import GPNNet, _validation, metrics

    def refuse(*args, **kwargs):
        raise AssertionError("classification_error's checks ran per batch")

    monkeypatch.setattr(metrics, "_check_labels", refuse)
    calls = []
    original = _validation.check_class_labels
    monkeypatch.setattr(
        _validation, "check_class_labels", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    from pyro_gpn.inference import evaluation

    monkeypatch.setattr(evaluation, "check_class_labels", _validation.check_class_labels)
    x, y = _blobs(0)
    torch.manual_seed(0)
    assert 0.0 <= evaluate(GPNNet([2, 3, 3]), x, y, batch_size=4)["error"] <= 1.0
    assert len(calls) == 1
    # without a head the first prediction gives the classes, checked once too
    calls.clear()
    evaluate(FixedPredictor(), torch.randn(4, 3), torch.tensor([0, 1, 2, 1]), batch_size=1)
    assert len(calls) == 2  # the dtype on entry, the range with the first prediction


# ---------------------------------------------------------------------------------- audit
class ModeAwarePredictor(nn.Module):
    """Predicts ``x`` in ``eval()`` mode and ``x + 10`` in ``train()`` mode (a stand-in for
    dropout), with unit variance."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        shift = 10.0 if self.training else 0.0
        return Moments(x + shift + 0 * self.w, var=torch.ones_like(x), validate=False)


@pytest.mark.parametrize("training", [True, False])
def test_evaluate_predicts_in_eval_mode_and_restores_the_mode(training):
    mean = torch.tensor([[0.0], [1.0], [2.0]])
    target = torch.tensor([[0.5], [1.0], [1.0]])
    model = ModeAwarePredictor().train(training)
    metrics = evaluate(model, mean, target)
    assert metrics["rmse"] == pytest.approx(math.sqrt((0.25 + 0 + 1) / 3))
    assert model.training is training


def test_evaluate_multi_output_regression_averages_rmse_over_entries_and_ll_over_samples():
    # S = 3 samples of D = 2 outputs, in batches of 2: the RMSE is over all 6 entries, the
    # log-likelihood a mean over the 3 samples of the sum over the 2 outputs
    mean = torch.tensor([[0.0, 1.0], [1.0, -1.0], [2.0, 0.5]])
    target = torch.tensor([[0.5, 1.0], [1.0, 1.0], [1.0, 0.0]])
    metrics = evaluate(FixedPredictor(var=0.25), mean, target, batch_size=2)
    errors = (mean - target).numpy()
    assert metrics["rmse"] == pytest.approx(math.sqrt((errors**2).sum() / 6))
    density = -0.5 * math.log(2 * math.pi * 0.25) - errors**2 / (2 * 0.25)
    assert metrics["log_likelihood"] == pytest.approx(density.sum() / 3)


def test_validation_loss_weights_each_batch_by_its_rows():
    # 10 validation rows in batches of 4 (4 + 4 + 2): the loss of a batch is mean(y_batch)
    # (y_i = i^2, w stays 0), so the row-weighted mean is sum_i i^2 / 10 = 28.5 whatever the
    # evaluation batch size (the mean of the batch means would be 35.83)
    data = _indexed_rows(10)
    for eval_batch_size in (4, 10):
        result = Trainer(
            RecordingModel(), _config(max_epochs=1, batch_size=4, eval_batch_size=eval_batch_size)
        ).fit(data, data)
        assert result.history[0]["val_loss"] == pytest.approx(28.5, rel=1e-6)


def test_plateau_schedule_stops_at_the_configured_min_lr():
    # min_lr=1e-4: 1e-3 for the first and 3 bad evaluations, 1e-4 for 3 more, then a further
    # reduction is due but forbidden: 1 + 2 * 3 = 7 epochs
    model = ScriptedModel([1.0])
    result = Trainer(model, _config(max_epochs=100, batch_size=4, min_lr=1e-4)).fit(
        _dummy_data(), _dummy_data()
    )
    assert result.stop_reason == "min_lr" and result.epochs == 7
    lrs = [row["lr"] for row in result.history]
    assert lrs == pytest.approx([1e-3] * 4 + [1e-4] * 3, rel=1e-9)


def test_resume_with_another_min_lr_is_refused(tmp_path):
    # min_lr shapes the schedule (when training stops): not a resumable change
    Trainer(ScriptedModel([1.0]), _config(tmp_path, max_epochs=2, batch_size=4)).fit(
        _dummy_data(), _dummy_data()
    )
    changed = _config(tmp_path, max_epochs=3, batch_size=4, min_lr=1e-4)
    with pytest.raises(ValueError, match="min_lr"):
        Trainer(ScriptedModel([1.0]), changed).fit(_dummy_data(), _dummy_data(), resume=True)
