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


def _adopt(gains: list[float]) -> str:
    """The rule fixed before any cell ran: adopt where the mean gain is positive and larger
    than its standard error."""
    mean = statistics.mean(gains)
    se = statistics.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else float("inf")
    return "yes" if mean > 0 and mean > se else "no"


def _won(values: list[float]) -> str:
    return f"{_mean_se(values)} ({sum(v > 0 for v in values)}/{len(values)})"


def _reproduced(runs: Path, column: str, name: str, cells: list, log_liks: list) -> str:
    """The largest gap between each cell's ``log_liks`` entry and the recorded test
    log-likelihood of column ``column`` on the same split, and how many were recorded."""
    gaps = []
    for cell, value in zip(cells, log_liks, strict=True):
        recorded = runs / f"{column}__{name}__{cell['split']:02d}.json"
        if recorded.exists():
            gaps.append(abs(value - json.loads(recorded.read_text())["test"]["log_lik"]))
    return f"{max(gaps) if gaps else float('nan'):.1e} ({len(gaps)})"


def _cells(runs: Path, column: str, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(runs.glob(f"{column}__{name}__*"))]


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
        # a calibrated column enters where its plain twin was not run
        for column in (
            c for c in columns if MIXCAL not in c or c.replace(MIXCAL, "") not in columns
        ):
            cells = _cells(runs, column, name)
            mixture = [_uncalibrated(c) for c in cells]
            val = [m["val"] - c["single"]["val"]["log_lik"] for m, c in zip(mixture, cells)]
            test = [
                m["test"]["log_lik"] - c["single"]["test"]["log_lik"]
                for m, c in zip(mixture, cells)
            ]
            base = column.replace("_ens5", "").replace(MIXCAL, "")
            singles = [c["single"]["test"]["log_lik"] for c in cells]
            single_ll = statistics.mean(c["single"]["test"]["log_lik"] for c in cells)
            mix_ll = statistics.mean(m["test"]["log_lik"] for m in mixture)
            single_cov = statistics.mean(c["single"]["test"]["coverage90"] for c in cells)
            mix_cov = statistics.mean(m["test"]["coverage90"] for m in mixture)
            lines.append(
                f"| {name} | `{column}` | {len(cells)} | {_won(val)} | {_adopt(val)} | "
                f"{_won(test)} | {single_ll:.3f} → {mix_ll:.3f} | "
                f"{single_cov:.3f} → {mix_cov:.3f} | "
                f"{_reproduced(runs, base, name, cells, singles)} |"
            )
    return "\n".join(lines)


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
            cells = _cells(runs, column, name)
            facts = [c["mixture_calibration"] for c in cells]
            scales = [f["scale"][0] for f in facts]
            val = [
                f["val_crossfit"]["log_lik_calibrated"] - f["val_crossfit"]["log_lik_uncalibrated"]
                for f in facts
            ]
            raw = [f["test_uncalibrated"] for f in facts]
            test = [c["test"] for c in cells]
            gain = [t["log_lik"] - r["log_lik"] for t, r in zip(test, raw, strict=True)]
            raw_ll = [r["log_lik"] for r in raw]
            lines.append(
                f"| {name} | `{column}` | {len(cells)} | {statistics.median(scales):.2f} "
                f"({min(scales):.2f}–{max(scales):.2f}) | {_won(val)} | {_adopt(val)} | "
                f"{statistics.mean(r['coverage90'] for r in raw):.3f} → "
                f"{statistics.mean(t['coverage90'] for t in test):.3f} | "
                f"{statistics.mean(r['log_lik'] for r in raw):.3f} → "
                f"{statistics.mean(t['log_lik'] for t in test):.3f} | {_won(gain)} | "
                f"{_reproduced(runs, column.replace(MIXCAL, ''), name, cells, raw_ll)} |"
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
