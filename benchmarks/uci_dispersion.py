"""How far a Bayesian GPN's predictive spread is from its errors, on one UCI split (issue 15).

Fits one Bayesian GPN column of ``benchmarks/uci.py`` (its configuration, :func:`bgpn_config`;
the training rows, validation stopping) and reports, on the validation and the test rows:

* ``z2``: the mean squared standardised error ``(y - E[y])^2 / Var[y]`` of the predictive
  mixture (1 for a calibrated predictive, below 1 for a too-wide one);
* the log-likelihood and 90 % coverage with every component variance scaled by ``tau``
  (``tau < 1`` narrows the predictive; the diagnosis only -- no model here is recalibrated);
* per layer with a variational ``q(W)``: the mean standard deviation of ``q(W)``, the prior's
  (``weight_prior_scale / sqrt(fan_in)``) and the mean ``|E[W]|``;
* the same scores with ``q(W)`` collapsed onto its mean (how much of the spread ``q(W)`` adds).

One JSON line per run into ``--out`` (appended). Usage::

    OMP_NUM_THREADS=1 python benchmarks/uci_dispersion.py --set yacht --split 0 \\
        --model bgpn_het --out docs/results/uci_runs/dispersion.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.uci import (  # noqa: E402
    BGPN_MODELS,
    DATA_DIR,
    MODELS,
    PLL,
    bgpn_config,
    fit_bgpn,
    metrics_of,
)

#: predictive variance scales reported
TAUS = (0.25, 0.5, 0.75, 1.0)


def dispersion(model, x, y, y_std: float) -> dict:
    """``z2`` and the scaled-variance scores of ``model``'s predictive mixture on ``(x, y)``
    (standardised rows; log-likelihoods in original units)."""
    with torch.no_grad():
        weights, mean, var = model.head.predictive_mixture(model.hidden(x))
    mean, var = mean.reshape(mean.shape[0], -1), var.reshape(var.shape[0], -1)
    mix_mean = (weights[:, None] * mean).sum(0)
    total = (weights[:, None] * (var + (mean - mix_mean).square())).sum(0)
    z2 = float(((y.reshape(-1) - mix_mean).square() / total).mean())
    scaled = {}
    for tau in TAUS:
        m = metrics_of(mean, var * tau, y, y_std, weights)
        scaled[str(tau)] = {"log_lik": m["log_lik"], "coverage90": m["coverage90"]}
    return {"z2": z2, "scaled": scaled}


def run(name: str, split: int, model_name: str, seed: int = 0) -> dict:
    from pyro_gpn.data.uci_regression import load_uci_regression

    if model_name not in MODELS or model_name.removesuffix(PLL) not in BGPN_MODELS:
        raise ValueError(f"model must be a Bayesian GPN column of uci.py, got {model_name!r}")
    data = load_uci_regression(name, DATA_DIR, split=split, seed=seed, download=False)
    c0 = time.process_time()
    fit = fit_bgpn(data, bgpn_config(model_name, name), seed + split)
    net = fit["net"]
    y_std = float(data.y_std)
    parts = {"val": (data.x_val, data.y_val), "test": (data.x_test, data.y_test)}
    row = {
        "set": name,
        "split": split,
        "model": model_name,
        "best_step": fit["best_step"],
        "noise_std": fit["noise_std"],
        **{part: dispersion(net, x, y, y_std) for part, (x, y) in parts.items()},
        "layers": [],
    }
    for layer in net.layers:
        if getattr(layer, "variational_weights", False):
            scale = layer.weight_scale.detach()
            row["layers"].append(
                {
                    "q_std": float(scale.mean()),
                    "prior_std": float(torch.as_tensor(layer.weight_prior_std()).mean()),
                    "fan_in": int(scale.shape[0]),
                    "mean_abs": float(layer.weight.detach().abs().mean()),
                }
            )
            layer.weight_scale = scale * 1e-6
    row["collapsed_w"] = {part: dispersion(net, x, y, y_std) for part, (x, y) in parts.items()}
    row["cpu_s"] = time.process_time() - c0
    row["load_avg_1m_end"] = os.getloadavg()[0]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", required=True)
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--model", default="bgpn_het")
    p.add_argument("--out", default=None, help="append the JSON line here (default: print)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    row = run(a.set, a.split, a.model)
    line = json.dumps(row, default=float)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
