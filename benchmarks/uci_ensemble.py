"""Five Bayesian GPNs against one, from the ``ens5`` cells of ``benchmarks/uci.py`` (issue 15).

Each ``*_ens5`` cell fits five networks of a set's chosen column (model seeds ``seed + 1000 k``;
member 0 is the column's own network) and scores their equal-weight mixture; it also keeps
member 0's own test and validation metrics (``single``). This prints, per set, on the splits
run:

* the choice (validation rows only): mixture minus single, mean ± standard error, splits won;
  the rule, fixed before any cell ran: adopt the mixture where the mean gain is positive and
  larger than its standard error;
* the test rows (never used for the choice): the same difference, the mixture's test
  log-likelihood and 90 % coverage;
* the check: member 0's test log-likelihood minus the recorded cell of the column without
  ``_ens5`` (zero up to round-off if the fit is reproduced).

A set run only as a calibrated mixture (``*_ens5_mixcal``) enters with that mixture at its own
scale 1, which such a cell records beside the calibrated one.

With ``--calibration``, the ``*_ens5_mixcal`` cells instead (section 20): the mixture's own
predictive scale fitted on the validation rows (``fit_predictive_scale(ensemble, ...)``) --
the scales, the cross-fitted validation gain (the scale fitted on one half of the validation
rows scores the other; the rule, fixed before any cell ran: adopt where its mean is positive and
larger than its standard error), the test coverage and log-likelihood at scale 1 and with the
scale, and the check that the cell's mixture at scale 1 reproduces the recorded ``_ens5`` cell.

Usage::

    python benchmarks/uci_ensemble.py [--calibration]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIXCAL = "_mixcal"
SETS = ("boston", "concrete", "energy", "kin8nm", "naval", "power", "protein", "wine", "yacht")


def _mean_se(values: list[float], fmt: str = "+.3f") -> str:
    mean = statistics.mean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return f"{mean:{fmt}} ± {se:.3f}"


def _uncalibrated(cell: dict) -> dict:
    """The mixture of an ensemble cell at its own scale 1: ``{"test": metrics, "val":
    log-likelihood}`` (a ``mixcal`` cell records them in its ``mixture_calibration``; its
    cross-fitted uncalibrated score is the row-weighted mean over both halves, the whole
    validation rows' log-likelihood)."""
    facts = cell.get("mixture_calibration")
    if facts is None:
        return {"test": cell["test"], "val": cell["val"]["log_lik"]}
    return {
        "test": facts["test_uncalibrated"],
        "val": facts["val_crossfit"]["log_lik_uncalibrated"],
    }


def ensemble_table(runs: Path) -> str:
    """The markdown table of the module docstring."""
    head = (
        "| set | column | splits | validation: mixture − single (won) | adopt | "
        "test: mixture − single (won) | test log-lik single → mixture | coverage single → "
        "mixture | member 0 − recorded (max abs) |"
    )
    lines = [head, "|" + " --- |" * 9]
    for name in SETS:
        columns = [p.name.split("__")[0] for p in sorted(runs.glob(f"*_ens5*__{name}__00.json"))]
        plain = [c for c in columns if MIXCAL not in c]
        for column in plain or columns:  # a calibrated column where no plain one was run
            cells = [json.loads(p.read_text()) for p in sorted(runs.glob(f"{column}__{name}__*"))]
            mixture = [_uncalibrated(c) for c in cells]
            val = [m["val"] - c["single"]["val"]["log_lik"] for m, c in zip(mixture, cells)]
            test = [
                m["test"]["log_lik"] - c["single"]["test"]["log_lik"]
                for m, c in zip(mixture, cells)
            ]
            mean, se = statistics.mean(val), statistics.stdev(val) / math.sqrt(len(val))
            adopt = "yes" if mean > 0 and mean > se else "no"
            base = column.replace("_ens5", "").replace(MIXCAL, "")
            checks = []
            for c in cells:
                recorded = runs / f"{base}__{name}__{c['split']:02d}.json"
                if recorded.exists():
                    old = json.loads(recorded.read_text())["test"]["log_lik"]
                    checks.append(abs(c["single"]["test"]["log_lik"] - old))
            single_ll = statistics.mean(c["single"]["test"]["log_lik"] for c in cells)
            mix_ll = statistics.mean(m["test"]["log_lik"] for m in mixture)
            single_cov = statistics.mean(c["single"]["test"]["coverage90"] for c in cells)
            mix_cov = statistics.mean(m["test"]["coverage90"] for m in mixture)
            lines.append(
                f"| {name} | `{column}` | {len(cells)} | {_mean_se(val)} "
                f"({sum(v > 0 for v in val)}/{len(val)}) | {adopt} | {_mean_se(test)} "
                f"({sum(t > 0 for t in test)}/{len(test)}) | {single_ll:.3f} → {mix_ll:.3f} | "
                f"{single_cov:.3f} → {mix_cov:.3f} | "
                f"{max(checks) if checks else float('nan'):.1e} ({len(checks)}) |"
            )
    return "\n".join(lines)


def _won(values: list[float]) -> str:
    return f"{_mean_se(values)} ({sum(v > 0 for v in values)}/{len(values)})"


def calibration_table(runs: Path) -> str:
    """The markdown table of the ``*_ens5_mixcal`` cells (module docstring, ``--calibration``)."""
    head = (
        "| set | column | splits | scale: median (range) | validation gain, cross-fitted (won) "
        "| adopt | test coverage, 1 → s | test log-lik, 1 → s | test gain (won) | "
        "scale 1 − recorded mixture (max abs) |"
    )
    lines = [head, "|" + " --- |" * 10]
    for name in SETS:
        for path in sorted(runs.glob(f"*{MIXCAL}*__{name}__00.json")):
            column = path.name.split("__")[0]
            cells = [json.loads(p.read_text()) for p in sorted(runs.glob(f"{column}__{name}__*"))]
            facts = [c["mixture_calibration"] for c in cells]
            scales = [f["scale"][0] for f in facts]
            val = [
                f["val_crossfit"]["log_lik_calibrated"] - f["val_crossfit"]["log_lik_uncalibrated"]
                for f in facts
            ]
            mean = statistics.mean(val)
            se = statistics.stdev(val) / math.sqrt(len(val)) if len(val) > 1 else float("inf")
            raw = [f["test_uncalibrated"] for f in facts]
            test = [c["test"] for c in cells]
            gain = [t["log_lik"] - r["log_lik"] for t, r in zip(test, raw, strict=True)]
            checks = []
            for c, r in zip(cells, raw, strict=True):
                recorded = runs / f"{column.replace(MIXCAL, '')}__{name}__{c['split']:02d}.json"
                if recorded.exists():
                    old = json.loads(recorded.read_text())["test"]["log_lik"]
                    checks.append(abs(r["log_lik"] - old))
            lines.append(
                f"| {name} | `{column}` | {len(cells)} | {statistics.median(scales):.2f} "
                f"({min(scales):.2f}–{max(scales):.2f}) | {_won(val)} | "
                f"{'yes' if mean > 0 and mean > se else 'no'} | "
                f"{statistics.mean(r['coverage90'] for r in raw):.3f} → "
                f"{statistics.mean(t['coverage90'] for t in test):.3f} | "
                f"{statistics.mean(r['log_lik'] for r in raw):.3f} → "
                f"{statistics.mean(t['log_lik'] for t in test):.3f} | {_won(gain)} | "
                f"{max(checks) if checks else float('nan'):.1e} ({len(checks)}) |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=ROOT / "docs/results/uci_runs")
    parser.add_argument(
        "--calibration", action="store_true", help="the mixtures' predictive scales instead"
    )
    args = parser.parse_args(argv)
    print(calibration_table(args.runs) if args.calibration else ensemble_table(args.runs))


if __name__ == "__main__":
    sys.exit(main())
