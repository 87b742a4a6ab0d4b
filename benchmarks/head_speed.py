"""The softmax head's expected loss (unscented cross-entropy, ``eq:gpn_normal_unscented``),
forward and backward, against a ``Linear(50, 50) + tanh`` layer in one process, interleaved
round by round (median CPU time per call, one thread):

* ``points``  -- the algorithm before 2026-11-24: build the ``2N + 1`` sigma points of the
  features (``pyro_gpn.losses.unscented_points``, an ``[S, N, N]`` diagonal square root),
  map them through the readout and take ``logsumexp`` (written out here, as it was);
* ``logits``  -- ``backend("reference")``: the points' logits straight from the features
  (``unscented_logits``, ``O(S N C)``), then ``logsumexp``;
* ``fused``   -- ``backend("auto")`` on the CPU: one compiled pass per sample
  (``pyro_gpn.moments.cpu_unscented``);
* ``pred-logits`` / ``pred-fused`` -- the predictive objective's data term instead,
  ``-log sum_i w_i softmax(A_i)[t]`` (``unscented_log_predictive``), on the PyTorch path
  (``backend("reference")``: logits, log-softmax, log-sum-exp) and on the fused kernel.

Shapes: the paper's Letter head (S = 256, N = 15, C = 26), the digits CNN's flattened features
(S = 64, N = 64, C = 10) and the MNIST CNN's (S = 64, N = 784, C = 10).

    OMP_NUM_THREADS=1 python benchmarks/head_speed.py --rounds 30
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from pyro_gpn.losses import unscented_cross_entropy, unscented_log_predictive, unscented_points
from pyro_gpn.moments import Moments
from pyro_gpn.moments.backend import backend
from pyro_gpn.settings import validation

SHAPES = {"letter": (256, 15, 26), "digits-cnn": (64, 64, 10), "mnist-cnn": (64, 784, 10)}


def points_path(mean, var, weight, bias, target):
    """The pre-2026-11-24 expected cross-entropy: explicit points, then the readout."""
    points, w = unscented_points(Moments(mean, var=var, validate=False))
    logits = points @ weight + bias
    index = target.view(-1, 1, 1).expand(-1, logits.shape[1], 1)
    ce = torch.logsumexp(logits, -1) - logits.gather(-1, index).squeeze(-1)
    return (w[0] * ce[:, 0] + w[1] * ce[:, 1:].sum(-1)).mean()


def make(shape, seed=0):
    S, N, C = shape
    g = torch.Generator().manual_seed(seed)
    leaves = (
        torch.randn(S, N, generator=g),
        torch.rand(S, N, generator=g) + 0.01,
        0.3 * torch.randn(N, C, generator=g),
        torch.zeros(C),
    )
    leaves = [t.requires_grad_() for t in leaves]
    return leaves, torch.randint(0, C, (S,), generator=g)


def variants(shape):
    (mean, var, weight, bias), target = make(shape)
    lin, x = torch.nn.Linear(50, 50), torch.randn(shape[0], 50)

    def run(kind):
        def call():
            if kind == "tanh":
                lin(x).tanh().sum().backward()
                return
            if kind == "points":
                loss = points_path(mean, var, weight, bias, target)
            elif kind.startswith("pred-"):
                with backend("reference" if kind == "pred-logits" else "auto"):
                    features = Moments(mean, var=var)
                    loss = -unscented_log_predictive(features, target, weight, bias).mean()
            else:
                with backend("reference" if kind == "logits" else "auto"):
                    loss = unscented_cross_entropy(Moments(mean, var=var), target, weight, bias)
            loss.backward()

        return call

    kinds = ("tanh", "points", "logits", "fused", "pred-logits", "pred-fused")
    return {k: run(k) for k in kinds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=10, help="calls per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{platform.machine()}, torch {torch.__version__}, 1 thread, load {os.getloadavg()}")
    with validation(False):
        for name, shape in SHAPES.items():
            runs = variants(shape)
            for call in runs.values():
                call()  # compile / warm up
            times = {k: [] for k in runs}
            for _ in range(args.rounds):
                for k, call in runs.items():
                    t = time.process_time()
                    for _ in range(args.calls):
                        call()
                    times[k].append((time.process_time() - t) / args.calls)
            base = statistics.median(times["tanh"])
            print(f"{name} S, N, C = {shape}")
            for k, ts in times.items():
                med = statistics.median(ts)
                print(f"  {k:11s} {med * 1e3:8.3f} ms  x {med / base:7.2f} tanh")
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
