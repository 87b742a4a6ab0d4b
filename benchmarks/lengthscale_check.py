"""The GP lengthscale's starting value on the paper grid's Letter GPN (validation error).

For the "lengthscale" question of ``docs/results/paper_protocol.md``: trains the grid's Letter
network (``16x30x15x26``, GPN mean+variance, random targets) with the grid's protocol (Adam
1e-3, patience 30, batch 128, best-validation restore) and one seed, for each
``--lengthscales`` starting value (the library's default is the authors' 0.4; the lengthscales
are learned either way), and prints train / validation / test error, epochs and time. Choose
on the validation column only.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/lengthscale_check.py --data-dir ../shared/datasets \\
        --lengthscales 0.2 --seed 0
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from pyro_gpn import GPNNet
from pyro_gpn.data import load_dataset
from pyro_gpn.experiments.paper import PAPER_HIDDEN, RunSettings
from pyro_gpn.inference.trainer import TrainConfig, Trainer, evaluate, seed_everything


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--lengthscales", type=float, nargs="+", default=[0.2, 0.8])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    settings = RunSettings()
    data = load_dataset("letter", data_dir=args.data_dir, seed=0)
    sizes = [data.num_features, *PAPER_HIDDEN, data.num_classes]
    for lengthscale in args.lengthscales:
        seed_everything(args.seed)
        net = GPNNet(
            sizes, mode="meanvar", head="softmax", targets_init="random",
            lengthscale_init=lengthscale,
        )  # fmt: skip
        config = TrainConfig(
            batch_size=settings.batch_size, max_epochs=1_000_000, patience=settings.patience,
            seed=args.seed, task="classification", progress=False,
        )  # fmt: skip
        start = time.perf_counter()
        result = Trainer(net, config).fit((data.x_train, data.y_train), (data.x_val, data.y_val))
        wall = time.perf_counter() - start
        errors = {
            split: evaluate(
                net, getattr(data, f"x_{split}"), getattr(data, f"y_{split}"), "classification"
            )["error"]
            for split in ("train", "val", "test")
        }
        print(
            f"lengthscale_init {lengthscale}: train {errors['train']:.4f}  val {errors['val']:.4f}"
            f"  test {errors['test']:.4f}  ({result.epochs} epochs, best {result.best_epoch}, "
            f"{wall:.0f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
