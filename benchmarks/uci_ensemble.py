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

Usage::

    python benchmarks/uci_ensemble.py
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = ("boston", "concrete", "energy", "kin8nm", "naval", "power", "protein", "wine", "yacht")


def _mean_se(values: list[float], fmt: str = "+.3f") -> str:
    mean = statistics.mean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return f"{mean:{fmt}} ± {se:.3f}"


def ensemble_table(runs: Path) -> str:
    """The markdown table of the module docstring."""
    head = (
        "| set | column | splits | validation: mixture − single (won) | adopt | "
        "test: mixture − single (won) | test log-lik single → mixture | coverage single → "
        "mixture | member 0 − recorded (max abs) |"
    )
    lines = [head, "|" + " --- |" * 9]
    for name in SETS:
        for path in sorted(runs.glob(f"*_ens5*__{name}__00.json")):
            column = path.name.split("__")[0]
            cells = [json.loads(p.read_text()) for p in sorted(runs.glob(f"{column}__{name}__*"))]
            val = [c["val"]["log_lik"] - c["single"]["val"]["log_lik"] for c in cells]
            test = [c["test"]["log_lik"] - c["single"]["test"]["log_lik"] for c in cells]
            mean, se = statistics.mean(val), statistics.stdev(val) / math.sqrt(len(val))
            adopt = "yes" if mean > 0 and mean > se else "no"
            base = column.replace("_ens5", "")
            checks = []
            for c in cells:
                recorded = runs / f"{base}__{name}__{c['split']:02d}.json"
                if recorded.exists():
                    old = json.loads(recorded.read_text())["test"]["log_lik"]
                    checks.append(abs(c["single"]["test"]["log_lik"] - old))
            single_ll = statistics.mean(c["single"]["test"]["log_lik"] for c in cells)
            mix_ll = statistics.mean(c["test"]["log_lik"] for c in cells)
            single_cov = statistics.mean(c["single"]["test"]["coverage90"] for c in cells)
            mix_cov = statistics.mean(c["test"]["coverage90"] for c in cells)
            lines.append(
                f"| {name} | `{column}` | {len(cells)} | {_mean_se(val)} "
                f"({sum(v > 0 for v in val)}/{len(val)}) | {adopt} | {_mean_se(test)} "
                f"({sum(t > 0 for t in test)}/{len(test)}) | {single_ll:.3f} → {mix_ll:.3f} | "
                f"{single_cov:.3f} → {mix_cov:.3f} | "
                f"{max(checks) if checks else float('nan'):.1e} ({len(checks)}) |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=ROOT / "docs/results/uci_runs")
    args = parser.parse_args(argv)
    print(ensemble_table(args.runs))


if __name__ == "__main__":
    sys.exit(main())
