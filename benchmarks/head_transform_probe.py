"""Where should the softmax head's sigma points live? A probe on trained GPN CNNs.

The softmax head averages ``softmax(x W + b)`` over Gaussian features ``x ~ N(mu, diag(var))``.
The library's unscented transform (``SoftmaxHead.predict``) places ``2 N + 1`` sigma points in
the space of the ``N`` features; the paper's ``eq:unscented_s`` and ``DESIGN.md`` place
``2 C + 1`` points in the space of the ``C`` logits, whose Gaussian ``N(mu W + b, W^T diag(var)
W)`` is exactly the features' image. Both match the logits' first two moments; they differ in
how far out the points sit. This script trains the digits CNNs of ``benchmarks/conv_rnn.py``
and scores the same features' predictive four ways, against Monte Carlo over the logits'
Gaussian (the reference: unbiased, its standard error printed):

* ``features-ut``: the library's predictive (feature-space points, ``kappa = 0``);
* ``logits-ut``: logit-space points, ``kappa = 0`` (weights ``1 / 2C``);
* ``logits-ut3``: logit-space points, the paper's ``kappa = 3 - C`` (a negative centre weight,
  the average clamped at zero);
* ``mc``: ``--draws`` Monte Carlo draws of the logits.

Metrics on the validation and test images: NLL, ECE (15 bins), confidence gap (mean top
probability minus accuracy), and the largest absolute error of each transform's probabilities
against Monte Carlo.

    OMP_NUM_THREADS=1 python benchmarks/head_transform_probe.py --seeds 0 1 2 --epochs 200 \
        --objective closed_form --json docs/results/conv_rnn_runs/head_transform_probe.jsonl

(``--objective closed_form``: the variational CNN's objective when the recorded rows ran; the
library's default is now the predictive one.)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conv_rnn import _append, digits_data, gpn_cnn, probability_metrics, train  # noqa: E402


def logit_moments(model, x):
    """Mean ``[S, C]`` and covariance ``[S, C, C]`` of the logits (float64)."""
    feats = model.hidden(x)
    w = model.head.weight.to(torch.float64)
    b = model.head.bias.to(torch.float64)
    mu = feats.mean.to(torch.float64) @ w + b
    var = feats.variance.to(torch.float64)
    cov = torch.einsum("nc,sn,nd->scd", w, var, w)
    return mu, cov


def logit_ut(mu, cov, kappa):
    """Softmax averaged over the ``2 C + 1`` sigma points of ``N(mu, cov)``."""
    C = mu.shape[-1]
    jitter = 1e-12 * torch.eye(C, dtype=mu.dtype)
    L = torch.linalg.cholesky(cov + jitter)  # [S, C, C]
    d = math.sqrt(C + kappa) * L.mT  # rows: the points' offsets
    pts = torch.cat([mu[:, None], mu[:, None] + d, mu[:, None] - d], 1)
    p = pts.softmax(-1)
    w0 = kappa / (C + kappa)
    ws = 1.0 / (2 * (C + kappa))
    probs = w0 * p[:, 0] + ws * p[:, 1:].sum(1)
    return probs.clamp_min(0)


def logit_mc(mu, cov, draws, seed):
    g = torch.Generator().manual_seed(seed)
    C = mu.shape[-1]
    L = torch.linalg.cholesky(cov + 1e-12 * torch.eye(C, dtype=mu.dtype))
    acc = torch.zeros_like(mu)
    acc2 = torch.zeros_like(mu)
    chunk = 500
    for lo in range(0, draws, chunk):
        n = min(chunk, draws - lo)
        z = torch.randn(n, *mu.shape, generator=g, dtype=mu.dtype)
        p = (mu + torch.einsum("scd,ksd->ksc", L, z)).softmax(-1)
        acc += p.sum(0)
        acc2 += p.square().sum(0)
    mean = acc / draws
    se = ((acc2 / draws - mean.square()).clamp_min(0) / draws).sqrt()
    return mean, se


def metrics(probs, y):
    """:func:`conv_rnn.probability_metrics` under this probe's keys."""
    keys = {
        "test_error": "error",
        "test_nll": "nll",
        "test_ece": "ece",
        "test_confidence_gap": "gap",
    }
    return {keys[k]: v for k, v in probability_metrics(probs, y).items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--models", nargs="+", default=["vgpn", "gpn"])
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--draws", type=int, default=20000)
    ap.add_argument("--objective", default=None, choices=("closed_form", "predictive"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    train_set, val_set, test_set, shape, _ = digits_data()
    for seed in args.seeds:
        for name in args.models:
            torch.manual_seed(seed)
            n = train_set[0].shape[0]
            model = gpn_cnn(shape, (8, 16), 10, name == "vgpn", n, args.objective)
            _, timing = train(model, train_set, val_set, args.epochs, 3e-3, 64, 5, seed)
            model.eval()
            for part, (x, y) in (("val", val_set), ("test", test_set)):
                with torch.no_grad():
                    lib = model.predict(x).probs.to(torch.float64)
                    mu, cov = logit_moments(model, x)
                    mc, se = logit_mc(mu, cov, args.draws, seed)
                    variants = {
                        "features-ut": lib,
                        "logits-ut": logit_ut(mu, cov, 0.0),
                        "logits-ut3": logit_ut(mu, cov, 3.0 - mu.shape[-1]),
                        "mc": mc,
                    }
                for key, probs in variants.items():
                    row = {"model": name, "seed": seed, "part": part, "transform": key}
                    row["objective"] = model.objective
                    row |= metrics(probs, y)
                    row["max_abs_vs_mc"] = float((probs - mc).abs().max())
                    row["mc_se_max"] = float(se.max())
                    row["epochs"] = timing["epochs"]
                    print(json.dumps(row), flush=True)
                    _append(args.json, row)


if __name__ == "__main__":
    main()
