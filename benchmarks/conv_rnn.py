"""GPN convolutional and recurrent networks against fixed-activation ones (issue 17).

Image task: a small CNN -- conv 3x3 (C1 channels, padding 1), average pool 2, conv 3x3 (C2),
average pool 2, flatten, softmax readout -- with ReLU, with tanh, with GPN activation functions
(one per channel, ``meanvar`` propagation, maximum likelihood with ``eq:gpn_ls``) and with
variational GPN activation functions (closed-form ELBO). Data: scikit-learn's 8x8 digits
(1,797 images, pixels / 16; a fixed stratified 20 % test split, 20 % of the rest for
validation) or the reduced MNIST (``pyro_gpn.data.mnist.load_mnist_test_only``: the 10,000
official test images split 8,000 / 2,000; the full 60k set is ``load_mnist`` for users with the
training files).

Sequence task: noisy-sine forecasting: ``x_t = sin(omega t + phi) + eps``, ``eps ~ N(0, 0.1^2)``,
random ``omega ~ U(0.5, 1.5)``, ``phi ~ U(0, 2 pi)``; from ``T`` steps predict the next noisy
value. A GPN RNN (``GPNRecurrent``, ``meanvar``) + linear readout under a Gaussian head against a
tanh RNN and a GRU of the same hidden size with a learned Gaussian noise (all trained on the
Gaussian negative log-likelihood).

Every model is trained by :class:`pyro_gpn.inference.Trainer` (Adam, the learning rate divided
by 10 after ``patience`` epochs without validation improvement, best-validation parameters).
Time per epoch is the process CPU time of training divided by the epochs (one thread), so that
ratios are less sensitive to the other jobs on the machine; the load average is recorded.

Usage::

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 10 python benchmarks/conv_rnn.py digits --seeds 0 1 2 \\
        --epochs 60 --json /tmp/conv_rnn/digits.json
    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 10 python benchmarks/conv_rnn.py sine --seeds 0 1 2 \\
        --json /tmp/conv_rnn/sine.json
    PYTHONPATH=. python benchmarks/conv_rnn.py report /tmp/conv_rnn/*.json   # markdown tables
    # --calibrate: every image model also at the temperature fitted on the validation images
    # the full MNIST experiment (60,000 training images; --download fetches missing files):
    PYTHONPATH=. python benchmarks/conv_rnn.py mnist-full --data-dir DIR --download --epochs 20
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from pyro_gpn import GPNSequential, Moments
from pyro_gpn.heads import GaussianHead, SoftmaxHead
from pyro_gpn.inference import TrainConfig, Trainer, fit_predictive_scale
from pyro_gpn.layers import (
    GPNConv2d,
    GPNRecurrent,
    MomentAvgPool2d,
    MomentFlatten,
    MomentLinear,
    VariationalGPNConv2d,
    VariationalGPNRecurrent,
)
from pyro_gpn.metrics import categorical_nll, classification_error, expected_calibration_error

IMAGE_MODELS = ("relu", "tanh", "gpn", "vgpn")
SEQUENCE_MODELS = ("tanh-rnn", "gru", "gpn-rnn", "vgpn-rnn")


# ----------------------------------------------------------------------------- baselines
class CNN(nn.Module):
    """The same CNN with a fixed activation; Trainer's interface (``loss``, ``penalty``,
    ``forward -> Moments`` of the logits)."""

    def __init__(self, shape, channels, classes, activation) -> None:
        super().__init__()
        c, h, w = shape
        self.shape, self.act = shape, {"relu": torch.relu, "tanh": torch.tanh}[activation]
        self.conv1 = nn.Conv2d(c, channels[0], 3, padding=1)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, padding=1)
        self.readout = nn.Linear(channels[1] * (h // 4) * (w // 4), classes)

    def logits(self, x: Tensor) -> Tensor:
        h = x.reshape(-1, *self.shape)
        h = F.avg_pool2d(self.act(self.conv1(h)), 2)
        h = F.avg_pool2d(self.act(self.conv2(h)), 2)
        return self.readout(h.flatten(1))

    def forward(self, x: Tensor) -> Moments:
        return Moments(self.logits(x), validate=False)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(self.logits(x), y)

    def penalty(self) -> Tensor:
        return self.readout.bias.new_zeros(())

    def probs(self, x: Tensor) -> Tensor:
        return self.logits(x).softmax(-1)


class RNN(nn.Module):
    """tanh RNN or GRU, linear readout and a learned Gaussian noise (Gaussian NLL)."""

    def __init__(self, hidden, cell) -> None:
        super().__init__()
        self.rnn = (nn.RNN if cell == "tanh-rnn" else nn.GRU)(1, hidden, batch_first=True)
        self.readout = nn.Linear(hidden, 1)
        self.log_noise = nn.Parameter(torch.tensor(math.log(0.1)))

    def mean(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(x.unsqueeze(-1))
        return self.readout(out[:, -1])

    def forward(self, x: Tensor) -> Moments:
        mean = self.mean(x)
        return Moments(mean, var=torch.full_like(mean, float(self.log_noise.exp() ** 2)))

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return -torch.distributions.Normal(self.mean(x), self.log_noise.exp()).log_prob(y).mean()

    def penalty(self) -> Tensor:
        return self.log_noise.new_zeros(())


def gpn_cnn(shape, channels, classes, variational, num_data, objective=None) -> GPNSequential:
    c, h, w = shape
    conv = VariationalGPNConv2d if variational else GPNConv2d
    options = {"whiten": True} if variational else {}
    blocks = [
        conv(c, channels[0], 3, (h, w), padding=1, **options),
        MomentAvgPool2d(2),
        conv(channels[0], channels[1], 3, (h // 2, w // 2), padding=1, **options),
        MomentAvgPool2d(2),
        MomentFlatten(),
    ]
    return GPNSequential(blocks, shape, num_outputs=classes, num_data=num_data, objective=objective)


def gpn_rnn(hidden, steps, variational, num_data, objective=None) -> GPNSequential:
    layer = (VariationalGPNRecurrent if variational else GPNRecurrent)(1, hidden)
    return GPNSequential(
        [layer, MomentLinear(hidden, 1)],
        (steps, 1),
        head="gaussian",
        num_data=num_data,
        objective=objective,
    )


# ----------------------------------------------------------------------------- data
def digits_data(seed: int = 0):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float32) / 16.0
    x_rest, x_test, y_rest, y_test = train_test_split(
        x, y, test_size=0.2, stratify=y, random_state=seed
    )
    x_train, x_val, y_train, y_val = train_test_split(
        x_rest, y_rest, test_size=0.2, stratify=y_rest, random_state=seed
    )
    t = lambda a, dt: torch.as_tensor(a, dtype=dt)
    return (
        (t(x_train, torch.float32), t(y_train, torch.long)),
        (t(x_val, torch.float32), t(y_val, torch.long)),
        (t(x_test, torch.float32), t(y_test, torch.long)),
        (1, 8, 8),
        "sklearn digits 8x8 (1,797 images, pixels / 16), stratified 20 % test, 20 % of the rest "
        "validation, split seed 0",
    )


def mnist_data(data_dir: str, full: bool = False, download: bool = False):
    """The reduced MNIST (the 10,000 official test images, split 8,000 / 2,000) or, with
    ``full``, the official 60,000 / 10,000 split (the training images must be in ``data_dir``
    or, with ``download``, are fetched and checked against their SHA-256)."""
    from pyro_gpn.data.mnist import load_mnist, load_mnist_test_only

    if full:
        data = load_mnist(data_dir, download=download)
    else:
        data = load_mnist_test_only(data_dir, download=download)
    return (
        (data.x_train, data.y_train),
        (data.x_val, data.y_val),
        (data.x_test, data.y_test),
        (1, 28, 28),
        data.description,
    )


def sine_data(steps: int, seed: int = 0, sizes=(2000, 500, 1000), noise=0.1):
    g = torch.Generator().manual_seed(seed)
    splits = []
    for n in sizes:
        omega = 0.5 + torch.rand(n, 1, generator=g)
        phi = 2 * math.pi * torch.rand(n, 1, generator=g)
        t = torch.arange(steps + 1, dtype=torch.float32)
        clean = torch.sin(omega * t + phi)
        noisy = clean + noise * torch.randn(clean.shape, generator=g)
        splits.append((noisy[:, :steps].contiguous(), noisy[:, steps:].contiguous()))
    return splits


# ----------------------------------------------------------------------------- runs
def _objective(args, name: str) -> str | None:
    """The GPN models' training objective (``GPNSequential(objective=...)``; ``None``: the
    library's default, predictive for the variational models since 2026-11-28)."""
    return args.objective if name in IMAGE_MODELS[2:] + SEQUENCE_MODELS[2:] else None


def _load() -> float:
    return os.getloadavg()[0]


def _warm_up(model, train_set, batch_size) -> None:
    """One untimed forward and backward pass (first-call costs: kernels, allocator)."""
    x, y = train_set
    (model.loss(x[:batch_size], y[:batch_size]) + model.penalty()).backward()
    model.zero_grad(set_to_none=True)


def train(model, train_set, val_set, epochs, lr, batch_size, patience, seed):
    _warm_up(model, train_set, batch_size)
    config = TrainConfig(
        lr=lr,
        batch_size=batch_size,
        max_epochs=epochs,
        patience=patience,
        seed=seed,
        progress=False,
    )
    load = _load()
    cpu, wall = time.process_time(), time.perf_counter()
    result = Trainer(model, config).fit(train_set, val_set)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return result, {
        "epochs": result.epochs,
        "best_epoch": result.best_epoch,
        "cpu_s_per_epoch": cpu / result.epochs,
        "wall_s_per_epoch": wall / result.epochs,
        "load_start": load,
        "load_end": _load(),
    }


class LogitsAsFeatures(nn.Module):
    """A fixed-activation CNN seen through the library's softmax head: its logits are the
    (point-mass) features of an identity readout, so that
    :func:`pyro_gpn.inference.fit_predictive_scale` fits its temperature exactly as it fits a
    GPN's (the same search, the same log probability)."""

    def __init__(self, cnn: CNN) -> None:
        super().__init__()
        self.cnn = cnn
        classes = cnn.readout.out_features
        self.head = SoftmaxHead(classes, classes, dtype=cnn.readout.weight.dtype)
        with torch.no_grad():
            self.head.weight.copy_(torch.eye(classes))

    def hidden(self, x: Tensor) -> Moments:
        return Moments(self.cnn.logits(x), validate=False)

    def predict(self, x: Tensor):
        return self.head.predict(self.hidden(x))


class MeanAsFeatures(nn.Module):
    """A fixed-activation RNN seen through the library's Gaussian head: its mean prediction is
    the (point-mass) feature and its learned noise the head's, so that
    :func:`pyro_gpn.inference.fit_predictive_scale` fits its predictive scale exactly as it
    fits a GPN's."""

    def __init__(self, rnn: RNN) -> None:
        super().__init__()
        self.rnn = rnn
        self.head = GaussianHead(1, noise_std_init=float(rnn.log_noise.exp()))

    def hidden(self, x: Tensor) -> Moments:
        return Moments(self.rnn.mean(x), validate=False)

    def forward(self, x: Tensor) -> Moments:
        return self.head.predictive(self.hidden(x))


@torch.no_grad()
def calibrated_sequence_metrics(model, val_set, test_set) -> dict:
    """The predictive scale fitted on the validation sequences (``fit_predictive_scale``,
    ``sigma``-scaling) and the test metrics at it (``cal_`` prefix)."""
    model.eval()
    target = MeanAsFeatures(model) if isinstance(model, RNN) else model
    scale = float(fit_predictive_scale(target, *val_set))
    return {"scale": scale} | {
        f"cal_{k}": v for k, v in sequence_metrics(target, *test_set).items()
    }


@torch.no_grad()
def calibrated_metrics(model, val_set, test_set) -> dict:
    """The temperature fitted on the validation images (``fit_predictive_scale``; the rows that
    also chose the best epoch, as in Guo et al. 2017), and the validation and test metrics at
    it (``cal_`` prefix). The model keeps the temperature."""
    model.eval()
    target = LogitsAsFeatures(model) if isinstance(model, CNN) else model
    temperature = float(fit_predictive_scale(target, *val_set))
    row = {"temperature": temperature}
    row |= {f"cal_val_{k[5:]}": v for k, v in image_metrics(target, *val_set).items()}
    row |= {f"cal_{k}": v for k, v in image_metrics(target, *test_set).items()}
    return row


@torch.no_grad()
def image_metrics(model, x, y) -> dict:
    model.eval()
    probs = model.probs(x) if isinstance(model, CNN) else model.predict(x).probs
    return probability_metrics(probs, y)


def probability_metrics(probs: Tensor, y: Tensor) -> dict:
    """Test error, NLL, ECE (15 bins) and confidence gap of class probabilities ``[S, C]``."""
    probs = probs.to(torch.float64)
    probs = probs / probs.sum(-1, keepdim=True)
    return {
        "test_error": float(classification_error(probs, y)),
        "test_nll": float(categorical_nll(probs.clamp_min(1e-12) / 1.0, y)),
        "test_ece": float(expected_calibration_error(probs, y)),
        # over- (> 0) or under-confidence (< 0): mean top probability minus accuracy
        "test_confidence_gap": float(
            probs.max(-1).values.mean() - (probs.argmax(-1) == y).to(torch.float64).mean()
        ),
    }


@torch.no_grad()
def sequence_metrics(model, x, y) -> dict:
    model.eval()
    pred = model(x)
    mean, var = pred.mean.to(torch.float64), pred.variance.to(torch.float64)
    y = y.to(torch.float64)
    z = (y - mean) / var.sqrt()
    return {
        "test_rmse": float((y - mean).square().mean().sqrt()),
        "test_nll": float((0.5 * (2 * math.pi * var).log() + 0.5 * z.square()).mean()),
        "coverage90": float((z.abs() < 1.6448536).to(torch.float64).mean()),
        "mean_pred_std": float(var.sqrt().mean()),
    }


def run_images(args) -> list[dict]:
    if args.task == "digits":
        train_set, val_set, test_set, shape, description = digits_data()
    else:
        full = args.task == "mnist-full"
        train_set, val_set, test_set, shape, description = mnist_data(
            args.data_dir, full, args.download
        )
    rows = []
    for seed in args.seeds:
        for name in args.models or IMAGE_MODELS:
            torch.manual_seed(seed)
            n = train_set[0].shape[0]
            if name in ("relu", "tanh"):
                model = CNN(shape, args.channels, 10, name)
            else:
                # the KL's weight is 1 / (kl_scale n): kl_scale > 1 tempers the prior
                model = gpn_cnn(
                    shape,
                    args.channels,
                    10,
                    name == "vgpn",
                    round(args.kl_scale * n),
                    _objective(args, name),
                )
            _, timing = train(
                model,
                train_set,
                val_set,
                args.epochs,
                args.lr,
                args.batch_size,
                args.patience,
                seed,
            )
            row = {"task": args.task, "model": name, "seed": seed, **timing}
            row |= {f"val_{k[5:]}": v for k, v in image_metrics(model, *val_set).items()}
            row |= image_metrics(model, *test_set)
            if args.calibrate:
                row |= calibrated_metrics(model, val_set, test_set)
            row["kl_scale"] = args.kl_scale
            row["objective"] = getattr(model, "objective", None)
            row["data"] = description
            rows.append(row)
            print(json.dumps(row), flush=True)
            _append(args.json, row)
    return rows


def run_sine(args) -> list[dict]:
    train_set, val_set, test_set = sine_data(args.steps)
    rows = []
    for seed in args.seeds:
        for name in args.models or SEQUENCE_MODELS:
            torch.manual_seed(seed)
            if name in ("tanh-rnn", "gru"):
                model = RNN(args.hidden, name)
            else:
                model = gpn_rnn(
                    args.hidden,
                    args.steps,
                    name == "vgpn-rnn",
                    len(train_set[0]),
                    _objective(args, name),
                )
            _, timing = train(
                model,
                train_set,
                val_set,
                args.epochs,
                args.lr,
                args.batch_size,
                args.patience,
                seed,
            )
            row = {"task": "sine", "model": name, "seed": seed, **timing}
            val = sequence_metrics(model, *val_set)
            row |= {"val_" + k.removeprefix("test_"): v for k, v in val.items()}
            row |= sequence_metrics(model, *test_set)
            if args.calibrate:
                row |= calibrated_sequence_metrics(model, val_set, test_set)
            row["objective"] = getattr(model, "objective", None)
            row["data"] = (
                f"noisy sine, T={args.steps}, noise std 0.1, 2000/500/1000 sequences, data seed 0"
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
            _append(args.json, row)
    return rows


def _append(path: str | None, row: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as handle:
            handle.write(json.dumps(row) + "\n")


def report(paths: list[str]) -> str:
    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line]
    out = []
    for task in dict.fromkeys(r["task"] for r in rows):
        sub = [r for r in rows if r["task"] == task]
        metrics = [
            k
            for k in sub[0]
            if k.startswith(
                ("test_", "cal_test_", "coverage", "cal_coverage", "mean_pred", "cal_mean")
            )
        ]
        metrics += [k for k in ("temperature", "scale") if k in sub[0]]
        base = "relu" if task != "sine" else "tanh-rnn"
        base_cpu = statistics.mean(r["cpu_s_per_epoch"] for r in sub if r["model"] == base)
        out.append(f"### {task}\n\n{sub[0]['data']}\n")
        head = ["model", "seeds", *metrics, "epochs", "CPU s/epoch", f"ratio to {base}", "load"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + " --- |" * len(head))
        for model in dict.fromkeys(r["model"] for r in sub):
            rs = [r for r in sub if r["model"] == model]
            cpu = statistics.mean(r["cpu_s_per_epoch"] for r in rs)
            loads = [r["load_start"] for r in rs] + [r["load_end"] for r in rs]
            out.append(
                "| "
                + " | ".join(
                    [
                        model,
                        ", ".join(str(r["seed"]) for r in rs),
                        *[_pm([r[k] for r in rs]) for k in metrics],
                        ", ".join(str(r["epochs"]) for r in rs),
                        f"{cpu:.3g}",
                        f"{cpu / base_cpu:.2f}",
                        f"{min(loads):.1f}-{max(loads):.1f}",
                    ]
                )
                + " |"
            )
        out.append("")
    return "\n".join(out)


def _pm(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=("digits", "mnist", "mnist-full", "sine", "report"))
    parser.add_argument("paths", nargs="*", help="report: the JSON-lines files")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--patience", type=int, default=5)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--channels", type=int, nargs=2, default=[8, 16])
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--data-dir", default=os.environ.get("PYRO_GPN_TEST_DATA"))
    parser.add_argument("--json", default=None, help="append one JSON line per run")
    parser.add_argument(
        "--download", action="store_true", help="mnist, mnist-full: fetch missing files"
    )
    parser.add_argument(
        "--kl-scale",
        type=float,
        default=1.0,
        help="variational models: the KL term is divided by kl_scale * n instead of n",
    )
    parser.add_argument(
        "--objective",
        choices=("closed_form", "predictive"),
        default=None,
        help="the GPN models' training objective (GPNSequential's): the expected negative "
        "log-likelihood plus KL / n (closed_form; the variational models' runs recorded "
        "before 2026-11-28, whose rows name no objective) or the negative log predictive "
        "density plus KL / n (predictive); default: the library's (predictive for the "
        "variational models, closed_form for the others)",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="also report every model's test metrics at the predictive scale fitted on the "
        "validation rows (cal_ columns): the temperature of the image models' class "
        "probabilities, the sigma-scaling of the sequence models' Gaussian predictive",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.task == "report":
        print(report(args.paths))
    elif args.task == "sine":
        run_sine(args)
    else:
        run_images(args)


if __name__ == "__main__":
    main()
