"""Why a Bayesian GPN cell's 90 % intervals over- or under-cover: a diagnosis on validation rows.

Refits the cell ``(model, set, split)`` of ``benchmarks/uci.py`` (same data, seed and
configuration) and reads its predictive distribution on the split's **validation rows only**:

* ``coverage``: the share inside the central 90 % interval (as the benchmark's ``coverage90``);
* ``E[z^2]`` and the kurtosis of ``z = (y - mean) / sd`` (the mixture's mean and sd): a
  Gaussian has kurtosis 3, residuals spread uniformly over an interval 1.8;
* the scale ``s`` of the predictive spread (every component's variance times ``s^2``, the
  ``sigma``-scaling of Laves et al. 2020) that maximises the validation log-likelihood
  (``s_ll``, a grid of 401 log-spaced values in ``[1/8, 8]``) and the one whose interval covers
  90 % (``s_90``), with the validation log-likelihood at ``s = 1``, ``s_ll`` and ``s_90``;
* the targets' recording resolution ``Delta`` (the smallest gap between distinct training
  targets, original units) and the validation RMSE against ``Delta / sqrt(12)``, the standard
  deviation of rounding to that grid: where the RMSE is near it, the residuals are mostly the
  rounding of the targets, spread uniformly, and a Gaussian fitted to them covers more than 90 %
  (``1.645 / sqrt(12) = 0.475`` of the grid step either side: 95 % of a uniform residual).

A diagnosis, never a choice: test rows are not read. ``docs/results/uci.md`` section 17 (naval).
Usage::

    OMP_NUM_THREADS=1 python benchmarks/uci_calibration.py naval bgpn_long_warm1500 \\
        --splits 0 1 2 3 4 8
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyro  # noqa: E402
import torch  # noqa: E402

from benchmarks.uci import (  # noqa: E402
    DATA_DIR,
    bgpn_config,
    fit_bgpn,
    metrics_of,
    quantisation_noise_std,
)

#: the scales ``s`` searched (log-spaced, ``s = 1`` included)
SCALES = torch.logspace(math.log10(1 / 8), math.log10(8), 401, dtype=torch.float64)


def calibration(name: str, split: int, model: str, seed: int = 0) -> dict:
    """The statistics of the module docstring for one cell (validation rows)."""
    from pyro_gpn.data.uci_regression import load_uci_regression

    data = load_uci_regression(name, DATA_DIR, split=split, seed=seed, download=False)
    pyro.clear_param_store()
    fit = fit_bgpn(data, bgpn_config(model, name), seed + split)
    mean, var, weights = (t.double() for t in fit["predict"](data.x_val))
    y, y_std = data.y_val.reshape(-1).double(), float(data.y_std)
    mix_mean = (weights[:, None] * mean).sum(0)
    mix_var = (weights[:, None] * (var + mean.square())).sum(0) - mix_mean.square()
    z = (y - mix_mean) / mix_var.sqrt()
    scored = [metrics_of(mean, var * float(s) ** 2, y, y_std, weights) for s in SCALES]
    lls = torch.tensor([m["log_lik"] for m in scored])
    covers = torch.tensor([m["coverage90"] for m in scored])
    at_one = scored[int((SCALES - 1).abs().argmin())]
    i_ll = int(lls.argmax())
    i_90 = int((covers - 0.9).abs().argmin())
    resolution = quantisation_noise_std(data.y_train) * math.sqrt(12.0) * y_std
    return {
        "set": name,
        "split": split,
        "model": model,
        "num_val": int(y.shape[0]),
        "coverage": at_one["coverage90"],
        "mean_z2": float(z.square().mean()),
        "kurtosis": float(z.pow(4).mean() / z.square().mean().square()),
        "s_ll": float(SCALES[i_ll]),
        "s_90": float(SCALES[i_90]),
        "coverage_s_90": float(covers[i_90]),
        "val_ll": at_one["log_lik"],
        "val_ll_s_ll": float(lls[i_ll]),
        "val_ll_s_90": float(lls[i_90]),
        "rmse": at_one["rmse"],
        "resolution": resolution,
        "rmse_over_rounding_sd": at_one["rmse"] / (resolution / math.sqrt(12.0)),
    }


def _mean_se(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:+.3f}"
    se = statistics.stdev(values) / math.sqrt(len(values))
    return f"{statistics.mean(values):+.3f} ± {se:.3f} ({sum(v > 0 for v in values)}/{len(values)})"


def cells_table(runs: Path = ROOT / "docs/results/uci_runs") -> str:
    """Markdown: for each set, the calibrated chosen column's cells (``calibrated(CHOSEN[set])``
    of ``benchmarks/uci.py``, recorded by its ``calibration_facts``): the splits, the fitted
    scales (median and range), the cross-fitted validation gain of the scale (the figure the
    choice uses; mean ± s.e., splits won) and, on the test rows of the same fits, the 90 %
    coverage and the log-likelihood at scale 1 and with the scale, and their paired
    difference."""
    from benchmarks.uci import CHOSEN, calibrated

    lines = [
        "| set | column | splits | scale: median (range) | validation gain, cross-fitted "
        "| test coverage, 1 → s | test log-lik, 1 → s | test gain |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, chosen in CHOSEN.items():
        model = calibrated(chosen)
        cells = [json.loads(p.read_text()) for p in sorted(runs.glob(f"{model}__{name}__*.json"))]
        if not cells:
            lines.append(f"| {name} | `{model}` | – | | not run | | | |")
            continue
        scales = [c["calibration"]["scale"][0] for c in cells]
        val = [
            c["calibration"]["val_crossfit"]["log_lik_calibrated"]
            - c["calibration"]["val_crossfit"]["log_lik_uncalibrated"]
            for c in cells
        ]
        raw = [c["calibration"]["test_uncalibrated"] for c in cells]
        test = [c["test"] for c in cells]
        gain = [t["log_lik"] - r["log_lik"] for t, r in zip(test, raw, strict=True)]
        lines.append(
            f"| {name} | `{model}` | {len(cells)} | {statistics.median(scales):.2f} "
            f"({min(scales):.2f}–{max(scales):.2f}) | {_mean_se(val)} | "
            f"{statistics.mean(r['coverage90'] for r in raw):.3f} → "
            f"{statistics.mean(t['coverage90'] for t in test):.3f} | "
            f"{statistics.mean(r['log_lik'] for r in raw):.3f} → "
            f"{statistics.mean(t['log_lik'] for t in test):.3f} | {_mean_se(gain)} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("set", nargs="?")
    p.add_argument("model", nargs="?", help="a Bayesian GPN column of benchmarks/uci.py")
    p.add_argument("--splits", nargs="+", type=int, default=[0])
    p.add_argument("--out", default=None, help="append one JSON line per split here")
    p.add_argument(
        "--cells",
        action="store_true",
        help="print the calibrated chosen columns' recorded cells (cells_table) and exit",
    )
    a = p.parse_args(argv)
    if a.cells:
        print(cells_table())
        return 0
    if not (a.set and a.model):
        p.error("give SET and MODEL (or --cells)")
    torch.set_num_threads(1)
    print(
        "| split | coverage | E[z^2] | kurtosis | s_ll | s_90 | val ll (s=1 ; s_ll ; s_90) "
        "| RMSE / (Delta / sqrt 12) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for split in a.splits:
        row = calibration(a.set, split, a.model)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        print(
            f"| {split} | {row['coverage']:.3f} | {row['mean_z2']:.2f} | {row['kurtosis']:.2f} "
            f"| {row['s_ll']:.2f} | {row['s_90']:.2f} | {row['val_ll']:.3f} ; "
            f"{row['val_ll_s_ll']:.3f} ; {row['val_ll_s_90']:.3f} | "
            f"{row['rmse_over_rounding_sd']:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
