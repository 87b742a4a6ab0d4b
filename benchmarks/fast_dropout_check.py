"""Fast dropout against sampled dropout at a trained tanh network's parameters (UCI Letter).

For the "Fast dropout" section of ``docs/results/paper_protocol.md``: loads the best parameters
of a plain tanh run of the paper grid (``<work-dir>/letter__tanh__none__none__seed<k>/
best_model.pt``, written by ``pyro-gpn reproduce --work-dir ...``) into
``FixedActivationNet([16, 30, 15, 26])`` with fast dropout and with sampled dropout, and prints,
on the first 2,000 training rows, the fast-dropout loss, the Monte Carlo mean of the
sampled-dropout loss and the loss without dropout. ``--input-dropout 0`` drops the hidden units
only (default: the inputs at the same rate as the hidden units).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/fast_dropout_check.py \\
        --checkpoint /tmp/pyro-gpn-runs/paper/letter__tanh__none__none__seed4/best_model.pt \\
        --data-dir ../shared/datasets
"""

from __future__ import annotations

import argparse
import sys

import torch

from pyro_gpn.data import load_dataset
from pyro_gpn.models.baselines import FixedActivationNet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="best_model.pt of a tanh grid run")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--rates", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--draws", type=int, default=200, help="sampled-dropout passes")
    parser.add_argument(
        "--input-dropout", type=float, default=None, help="input rate (default: each rate)"
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    data = load_dataset("letter", data_dir=args.data_dir, seed=0)
    x, y = data.x_train[: args.rows], data.y_train[: args.rows]
    state = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    for rate in args.rates:
        rates = {"dropout": rate, "input_dropout": args.input_dropout}
        fast = FixedActivationNet([16, 30, 15, 26], **rates, fast_dropout=True)
        sampled = FixedActivationNet([16, 30, 15, 26], **rates, fast_dropout=False)
        fast.load_state_dict(state)
        sampled.load_state_dict(state)
        with torch.no_grad():
            fast_loss = float(fast.train().loss(x, y))
            mc_loss = float(
                torch.stack([sampled.train().loss(x, y) for _ in range(args.draws)]).mean()
            )
            plain = float(fast.eval().loss(x, y))
        print(
            f"rate {rate}: no dropout {plain:.4f}  fast dropout {fast_loss:.4f}  "
            f"sampled dropout (mean of {args.draws}) {mc_loss:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
