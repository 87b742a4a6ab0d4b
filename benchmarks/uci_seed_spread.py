"""How far a Bayesian GPN variant's fit moves with the model's seed alone: validation rows only.

Fits each variant of ``benchmarks/uci_variants.py`` on one split of a UCI set with the model
seeds ``seed + split + 1000 k``, ``k = 0 .. K - 1`` (the initialisation; the data, the
validation hold-out and the mini-batch draws stay those of the benchmark's seed), scores it on
the validation rows and prints, per variant, the validation log-likelihoods, their mean and
standard deviation. A diagnosis of optimisation spread (``docs/results/uci.md`` section 22),
never a choice: choices are made on the validation rows of several splits by
``uci_variants.py``. One JSON line per (variant, seed) into ``--out``; finished lines are
skipped. Usage::

    PYRO_GPN_UCI_DIR=../shared/datasets OMP_NUM_THREADS=1 python benchmarks/uci_seed_spread.py \\
        --set kin8nm --split 0 --seeds 5 \\
        --variants wide_point_pll_s2000 wide_point_pll_lr02_s4000_p40
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.uci_variants import VARIANTS, run  # noqa: E402

#: the model seeds' spacing (as the ``ens5`` members' of ``benchmarks/uci.py``)
SEED_STEP = 1000


def summary(rows: list[dict]) -> str:
    """Markdown: per variant, the validation log-likelihood of each model seed, their mean and
    sample standard deviation, and the best steps."""
    lines = [
        "| variant | model seeds | validation log-likelihood | mean ± sd | best steps |",
        "| --- | --- | --- | --- | --- |",
    ]
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = sorted(
            (r for r in rows if r["variant"] == variant),
            key=lambda r: r.get("model_seed_offset", 0),
        )
        vals = [r["val_log_lik"] for r in mine]
        sd = statistics.stdev(vals) if len(vals) > 1 else float("nan")
        lines.append(
            f"| `{variant}` | {len(vals)} | {' / '.join(f'{v:.3f}' for v in vals)} | "
            f"{statistics.fmean(vals):.3f} ± {sd:.3f} | "
            f"{'/'.join(str(r['best_step']) for r in mine)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", default="kin8nm")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--seeds", type=int, default=5, help="model seeds per variant")
    p.add_argument("--variants", nargs="+", required=True, choices=list(VARIANTS))
    p.add_argument("--out", default=None, help="default: uci_runs/SET_seed_spread.jsonl")
    p.add_argument("--summary", action="store_true", help="print the table of --out and exit")
    a = p.parse_args(argv)
    if a.seeds < 1:
        p.error("--seeds must be at least 1")
    out = Path(a.out or ROOT / f"docs/results/uci_runs/{a.set}_seed_spread.jsonl")
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if not a.summary:
        torch.set_num_threads(1)
        done = {(r["variant"], r["split"], r.get("model_seed_offset", 0)) for r in rows}
        for k in range(a.seeds):
            for variant in a.variants:
                offset = SEED_STEP * k
                if (variant, a.split, offset) in done:
                    continue
                row = run(variant, a.split, 0, a.set, model_seed_offset=offset)
                row["model_seed_offset"] = offset
                row.pop("curve")
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                rows.append(row)
                print(
                    f"{variant} seed +{offset}: validation {row['val_log_lik']:.3f} "
                    f"(best step {row['best_step']}, {row['cpu_s']:.0f} CPU s)",
                    flush=True,
                )
    print(summary([r for r in rows if r["split"] == a.split and r["variant"] in a.variants]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
