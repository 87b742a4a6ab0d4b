"""The unscented softmax loss against Monte Carlo at a trained GPN's parameters (UCI Letter).

For the "unscented kappa" question of ``docs/results/paper_protocol.md``: loads the best
parameters of a GPN mean+variance run of the paper grid (``<work-dir>/letter__gpn-meanvar__
random__none__seed<k>/best_model.pt``, written by ``pyro-gpn reproduce --work-dir ...``; without
``--checkpoint``: the network as initialised with seed 0), takes
the Gaussian moments of its last hidden layer on the first ``--rows`` training rows, and prints
the expected softmax cross-entropy of the logits under that Gaussian

* by the unscented transform (``eq:gpn_normal_unscented``) for each ``--kappas`` (``0`` is the
  library's default, ``3 - N`` the paper's),
* by Monte Carlo (``--draws`` Gaussian draws per row; the reference, with its standard error),
* at the mean alone (the plain cross-entropy of the mean logits, no variance),

averaged over the rows, with the unscented estimates' relative error against Monte Carlo. The
training objective is this average plus the target-variance penalty, so a biased transform
changes what is optimised.

Usage::

    RUN=/tmp/pyro-gpn-runs/paper/letter__gpn-meanvar__random__none__seed4
    OMP_NUM_THREADS=1 python benchmarks/unscented_check.py \\
        --checkpoint $RUN/best_model.pt --data-dir ../shared/datasets
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F

from pyro_gpn.data import load_dataset
from pyro_gpn.experiments.paper import PAPER_HIDDEN
from pyro_gpn.experiments.runs import build_model
from pyro_gpn.losses import unscented_cross_entropy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkpoint", default=None, help="best_model.pt of a GPN grid run (default: at init)"
    )
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--draws", type=int, default=4000, help="Monte Carlo draws per row")
    parser.add_argument("--kappas", type=float, nargs="+", default=None, help="default: 0 1 3-N")
    args = parser.parse_args(argv)
    data = load_dataset("letter", data_dir=args.data_dir, seed=0)
    x, y = data.x_train[: args.rows], data.y_train[: args.rows]
    sizes = [data.num_features, *PAPER_HIDDEN, data.num_classes]
    torch.manual_seed(0)
    net = build_model("gpn", sizes, "softmax", mode="meanvar", init="random")
    if args.checkpoint is not None:
        state = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
        net.load_state_dict(state)
    net.eval()
    weight, bias = net.head.weight.double(), net.head.bias.double()
    with torch.no_grad():
        features = net.hidden(x)
        mean = features.mean.double()
        std = features.variance.double().sqrt()
        num_features = mean.shape[-1]
        kappas = args.kappas if args.kappas is not None else [0.0, 1.0, 3.0 - num_features]

        # Monte Carlo reference, per row: mean over draws (in chunks to bound memory)
        totals = torch.zeros(len(y), dtype=torch.float64)
        squares = torch.zeros(len(y), dtype=torch.float64)
        chunk = 500
        for start in range(0, args.draws, chunk):
            n = min(chunk, args.draws - start)
            draws = mean + std * torch.randn(n, *mean.shape, dtype=torch.float64)
            logits = draws @ weight + bias  # [n, S, C]
            losses = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.repeat(n), reduction="none"
            ).reshape(n, -1)
            totals += losses.sum(0)
            squares += losses.square().sum(0)
        row_mean = totals / args.draws
        row_var = (squares / args.draws - row_mean.square()).clamp_min(0) / args.draws
        mc = float(row_mean.mean())
        mc_se = math.sqrt(float(row_var.sum())) / len(y)
        plain = float(F.cross_entropy(mean @ weight + bias, y))
        print(
            f"{len(y)} rows, N = {num_features} hidden features, mean feature sd "
            f"{float(std.mean()):.3f}"
        )
        print(f"Monte Carlo ({args.draws} draws/row): {mc:.5f} +- {mc_se:.5f}")
        print(f"cross-entropy at the mean:         {plain:.5f}  ({plain / mc - 1:+.2%})")
        for kappa in kappas:
            moments = type(features)(mean, var=std.square())
            value = float(unscented_cross_entropy(moments, y, weight, bias, kappa=kappa))
            label = f"unscented, kappa = {kappa:+g}:"
            print(f"{label:<35}{value:.5f}  ({value / mc - 1:+.2%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
