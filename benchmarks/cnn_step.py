"""One training step (loss + penalty, backward, Adam) of the GPN CNN of
``benchmarks/conv_rnn.py`` against the ReLU CNN, on a batch of 28x28 images (reduced MNIST
shape) or 8x8 (digits), in one process, interleaved round by round (median CPU time, one
thread). ``vgpn`` / ``vgpn-closed-form``: the variational GPN CNN on its default (predictive)
and its closed-form ELBO objective. ``gpn-points-head`` is the same GPN CNN with the softmax
head's expected loss computed by the algorithm before 2026-11-24 (explicit sigma points in the
features' space, ``benchmarks/head_speed.py``'s ``points_path``): it shows what the head had
cost.

    OMP_NUM_THREADS=1 python benchmarks/cnn_step.py --side 28 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conv_rnn import CNN, gpn_cnn  # noqa: E402
from head_speed import points_path  # noqa: E402

from pyro_gpn.settings import validation  # noqa: E402


def step_of(model, x, y, loss):
    opt = torch.optim.Adam(model.parameters(), 1e-3)

    def step():
        opt.zero_grad()
        (loss(model, x, y) + model.penalty()).backward()
        opt.step()

    return step


def default_loss(model, x, y):
    return model.loss(x, y)


def points_head_loss(model, x, y):
    features = model.hidden(x)
    head = model.head
    return points_path(features.mean, features.variance, head.weight, head.bias, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=28)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2, help="steps per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape = (1, args.side, args.side)
    x = torch.rand(args.batch, args.side * args.side)
    y = torch.randint(0, 10, (args.batch,))
    steps = {
        "relu": step_of(CNN(shape, (8, 16), 10, "relu"), x, y, default_loss),
        "gpn": step_of(gpn_cnn(shape, (8, 16), 10, False, 8000), x, y, default_loss),
        "gpn-points-head": step_of(
            gpn_cnn(shape, (8, 16), 10, False, 8000), x, y, points_head_loss
        ),
        # the variational GPN CNN on its two objectives (the default: predictive)
        "vgpn": step_of(gpn_cnn(shape, (8, 16), 10, True, 8000), x, y, default_loss),
        "vgpn-closed-form": step_of(
            gpn_cnn(shape, (8, 16), 10, True, 8000, "closed_form"), x, y, default_loss
        ),
    }
    with validation(False):
        for step in steps.values():
            step()  # compile / warm up
        times = {k: [] for k in steps}
        for _ in range(args.rounds):
            for k, step in steps.items():
                t = time.process_time()
                for _ in range(args.calls):
                    step()
                times[k].append((time.process_time() - t) / args.calls)
    base = statistics.median(times["relu"])
    print(f"{args.side}x{args.side}, batch {args.batch}, 1 thread, load {os.getloadavg()}")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"  {k:16s} {med * 1e3:9.1f} ms  x {med / base:7.1f} relu")


if __name__ == "__main__":
    main()
