"""The library's default Bayesian GPN on a regression set it was never developed on.

Every default of the Bayesian GPN (:func:`pyro_gpn.inference.select_vgpn` and its portfolio,
:data:`pyro_gpn.recommended.VGPN_PORTFOLIO`) was chosen on the validation rows of the nine UCI
sets of ``benchmarks/uci.py``. Whether the uncertainty it reports holds on data nobody tuned on
is the question this script answers, on sets that played no part in any of those choices:

* ``diabetes``: scikit-learn's diabetes data (Efron et al. 2004; 442 patients, 10 inputs, the
  disease progression one year on; shipped inside scikit-learn, so no download).

The protocol is the UCI benchmark's (Hernandez-Lobato & Adams 2015): 20 random splits, 90 %
training and 10 % test rows (split ``k``'s test rows: the first 10 %, rounded, of the row
permutation drawn by ``numpy.random.default_rng(k)``), inputs and target standardised with the
training statistics, 10 % of the training rows held out for every choice (the same
:meth:`~pyro_gpn.data.RegressionData.from_arrays` as the UCI sets), metrics in original units.
The models are ``benchmarks/uci.py``'s, fitted and scored by the same
:func:`benchmarks.uci.score_cell`: the library's default ``bgpn_select``, GPyTorch's 2-layer
deep GP with Gaussian (``dgp``) and Student-t noise (``dgp_t4``; the summary's ``dgp_chosen``
is the one of the two with the higher mean validation log-likelihood over the splits: a
simpler form of ``uci.md`` section 22's rule, :func:`dgp_chosen`) and MC dropout (``mcdrop``);
beside them, as a floor that needs no
tuning, scikit-learn's Bayesian linear regression (``blr``, ``BayesianRidge`` on the training
rows, its Gaussian predictive with the learned noise). Usage::

    PYRO_GPN_UCI_DIR=../shared/datasets python benchmarks/heldout.py --splits 0 1 2
    python benchmarks/heldout.py --summary

Cells are written atomically to ``docs/results/heldout_runs/MODEL__SET__SS.json`` as each
finishes; a rerun skips the cells that exist (after reading them back), so an interrupted run
resumes where it stopped. Results: ``docs/results/heldout.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.uci import _atomic_json, _bounded_int, metrics_of, score_cell  # noqa: E402
from benchmarks.uci_paired import _mean_se, paired_table  # noqa: E402

#: the held-out sets
SETS = ("diabetes",)
#: random train / test splits per set, and the share of test rows
NUM_SPLITS, TEST_FRACTION = 20, 0.1
#: the models fitted on each split (``benchmarks/uci.py``'s names)
MODELS = ("bgpn_select", "dgp", "dgp_t4", "mcdrop", "blr")
#: where the cells are written
RUNS = ROOT / "docs/results/heldout_runs"


def _diabetes() -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes(scaled=False)
    return bunch.data, bunch.target, tuple(bunch.feature_names)


#: ``name -> () -> (x [S, D], y [S], feature names)``
LOADERS: dict[str, Callable[[], tuple[np.ndarray, np.ndarray, tuple[str, ...]]]] = {
    "diabetes": _diabetes,
}


def split_rows(num_rows: int, split: int) -> tuple[np.ndarray, np.ndarray]:
    """Training and test rows of split ``split`` (module docstring), both sorted."""
    order = np.random.default_rng(split).permutation(num_rows)
    num_test = round(TEST_FRACTION * num_rows)
    return np.sort(order[num_test:]), np.sort(order[:num_test])


def load_heldout(name: str, split: int, seed: int = 0):
    """Split ``split`` of held-out set ``name`` as a :class:`~pyro_gpn.data.RegressionData`
    (validation hold-out seeded by ``seed``)."""
    from pyro_gpn.data.dataset import RegressionData

    if name not in LOADERS:
        raise ValueError(f"name must be one of {sorted(LOADERS)}, got {name!r}")
    if not 0 <= split < NUM_SPLITS:
        raise ValueError(f"split must lie in [0, {NUM_SPLITS}), got {split}")
    x, y, features = LOADERS[name]()
    train, test = split_rows(len(y), split)
    return RegressionData.from_arrays(
        name,
        np.asarray(x, dtype=np.float64),
        np.asarray(y, dtype=np.float64),
        train,
        test,
        feature_names=features,
        description=f"held-out regression set {name!r}, random split {split} of {NUM_SPLITS} "
        f"({len(train)} train / {len(test)} test rows)",
        seed=seed,
    )


def bayesian_linear_cell(data, split: int, seed: int = 0) -> dict:
    """The ``blr`` cell: scikit-learn's ``BayesianRidge`` fitted on the training rows, scored
    by :func:`benchmarks.uci.metrics_of` like every other model (its predictive standard
    deviation includes the learned noise)."""
    import torch
    from sklearn.linear_model import BayesianRidge

    t0, c0 = time.perf_counter(), time.process_time()
    model = BayesianRidge().fit(data.x_train.double().numpy(), data.y_train.double().numpy()[:, 0])
    total, cpu = time.perf_counter() - t0, time.process_time() - c0

    def score(x, y):
        mean, std = model.predict(x.double().numpy(), return_std=True)
        mean, var = torch.as_tensor(mean)[None], torch.as_tensor(std)[None] ** 2  # [1, S]
        return metrics_of(mean, var, y.double(), float(data.y_std))

    return {
        "model": "blr",
        "set": data.name,
        "split": split,
        "seed": seed,
        "num_train": int(data.x_train.shape[0]),
        "test": score(data.x_test, data.y_test),
        "val": score(data.x_val, data.y_val),
        "cell_s": total,
        "cell_cpu_s": cpu,
        "noise_std": float(model.alpha_**-0.5),
    }


def _read_cell(path: Path) -> dict | None:
    """A finished cell, or ``None`` where the file is missing or does not read back whole (it
    is then run again)."""
    try:
        cell = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return cell if isinstance(cell, dict) and {"test", "val"} <= set(cell) else None


def run(sets: Sequence[str], splits: Sequence[int], models: Sequence[str], out: Path,
        seed: int = 0, command: str = "") -> int:  # fmt: skip
    """Fit and score every missing cell, in split order; returns the number fitted."""
    out.mkdir(parents=True, exist_ok=True)
    fitted = 0
    for split in splits:
        for name in sets:
            data = None
            for model in models:
                path = out / f"{model}__{name}__{split:02d}.json"
                if _read_cell(path) is not None:
                    continue
                print(
                    f"[{time.strftime('%H:%M:%S')}] {model} {name} split {split} "
                    f"(load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
                if data is None:
                    data = load_heldout(name, split, seed)
                if model == "blr":
                    cell = bayesian_linear_cell(data, split, seed)
                else:
                    cell = score_cell(model, data, split, seed)
                cell["command"] = command
                cell["load_avg_1m_end"] = os.getloadavg()[0]
                _atomic_json(path, cell)
                fitted += 1
                test = cell["test"]
                print(
                    f"    test log-lik {test['log_lik']:.3f}, RMSE {test['rmse']:.3f}, "
                    f"coverage {test['coverage90']:.3f}; {cell['cell_cpu_s']:.0f} CPU s",
                    flush=True,
                )
    return fitted


def _validation_means(out: Path, name: str) -> dict[str, float]:
    """Mean validation log-likelihood of ``dgp`` and ``dgp_t4`` over the splits both ran
    (empty where they share none)."""
    val = {}
    for model in ("dgp", "dgp_t4"):
        cells = (_read_cell(p) for p in out.glob(f"{model}__{name}__*.json"))
        val[model] = {c["split"]: c["val"]["log_lik"] for c in cells if c is not None}
    common = sorted(set(val["dgp"]) & set(val["dgp_t4"]))
    return {m: statistics.mean(val[m][s] for s in common) for m in val} if common else {}


def dgp_chosen(out: Path, name: str) -> str:
    """``dgp`` or ``dgp_t4``: the higher mean validation log-likelihood over the splits both
    ran (``dgp`` where they share none). A simpler rule than ``uci.md`` section 22's (Student-t
    adopted where its paired validation gain exceeds its standard error); the two agree
    wherever Gaussian noise has the higher mean."""
    means = _validation_means(out, name)
    return max(means, key=means.get) if means else "dgp"


def summary(out: Path) -> str:
    """The paired table of ``benchmarks/uci_paired.py`` over the held-out sets: the default
    against the chosen deep GP and MC dropout, on the splits all of them ran."""
    chosen = {name: dgp_chosen(out, name) for name in SETS}
    table = paired_table(
        out, ["bgpn_select", "dgp_chosen", "mcdrop", "blr"], {}, columns={"dgp_chosen": chosen},
        sets=SETS,
    )  # fmt: skip
    picks = ", ".join(
        f"{name}: {model} (mean validation log-lik "
        + ", ".join(f"{m} {v:.3f}" for m, v in _validation_means(out, name).items())
        + ")"
        for name, model in chosen.items()
    )
    return f"{table}\n\n(the deep GP chosen on validation rows: {picks})\n\n{details(out)}"


def _paired_rmse(out: Path, name: str) -> list[str]:
    """The default's test RMSE minus each other model's, paired on their common splits: mean ±
    standard error (splits where the default's is higher)."""
    rmse = {}
    for model in MODELS:
        cells = (_read_cell(p) for p in out.glob(f"{model}__{name}__*.json"))
        rmse[model] = {c["split"]: c["test"]["rmse"] for c in cells if c is not None}
    lines = []
    for model in MODELS[1:]:
        common = sorted(set(rmse["bgpn_select"]) & set(rmse[model]))
        if len(common) < 2:
            continue
        diff = [rmse["bgpn_select"][k] - rmse[model][k] for k in common]
        lines.append(
            f"RMSE bgpn_select − {model}: {_mean_se(diff, 2)} "
            f"(higher on {sum(d > 0 for d in diff)}/{len(diff)})"
        )
    return lines


def details(out: Path) -> str:
    """Per set and model, over every cell it has: test log-likelihood, RMSE and 90 % coverage
    (mean ± standard error over the splits), median CPU seconds per cell; for the default,
    each candidate's mean stacking weight and median validation log-likelihood (standardised
    units)."""
    lines = []
    for name in SETS:
        lines += [
            f"**{name}** (every cell)",
            "",
            "| model | splits | test log-lik | RMSE | coverage 90 % | CPU s per cell (median) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for model in MODELS:
            cells = [_read_cell(p) for p in sorted(out.glob(f"{model}__{name}__*.json"))]
            cells = [c for c in cells if c is not None]
            if not cells:
                continue
            test = [c["test"] for c in cells]
            lines.append(
                f"| {model} | {len(cells)} | {_mean_se([t['log_lik'] for t in test], 3)} | "
                f"{_mean_se([t['rmse'] for t in test], 1)} | "
                f"{_mean_se([t['coverage90'] for t in test], 3)} | "
                f"{statistics.median(c['cell_cpu_s'] for c in cells):.0f} |"
            )
        lines += ["", *_paired_rmse(out, name)]
        stacks = [_read_cell(p) for p in sorted(out.glob(f"bgpn_select__{name}__*.json"))]
        stacks = [c for c in stacks if c is not None and "weights" in c]
        if stacks:
            lines += [
                "",
                "| candidate | mean stacking weight | validation log-lik, median (range) |",
            ]
            lines.append("| --- | --- | --- |")
            for cand in stacks[0]["candidate_val_log_lik_std"]:
                weight = statistics.mean(c["weights"].get(cand, 0.0) for c in stacks)
                vals = [c["candidate_val_log_lik_std"][cand] for c in stacks]
                lines.append(
                    f"| {cand} | {weight:.3f} | {statistics.median(vals):.2f} "
                    f"({min(vals):.2f} to {max(vals):.2f}) |"
                )
            used = sorted(sum(w > 0 for w in c["weights"].values()) for c in stacks)
            lines += [
                "",
                f"candidates with weight, per split: {used[0]}-{used[-1]} "
                f"(median {statistics.median(used):g})",
            ]
            scaled = sum(any(v != 1.0 for v in c["predictive_scale"]) for c in stacks)
            lines += [
                "",
                f"mixtures scaled (predictive scale other than 1): {scaled} of {len(stacks)}",
            ]
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    p.add_argument(
        "--splits",
        nargs="+",
        type=_bounded_int(0, NUM_SPLITS - 1),
        default=list(range(NUM_SPLITS)),
    )
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--seed", type=_bounded_int(0, 2**32 - 1), default=0)
    p.add_argument("--out", default=str(RUNS))
    p.add_argument("--summary", action="store_true", help="print the paired table and exit")
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.summary:
        print(summary(out))
        return 0
    command = " ".join(["python benchmarks/heldout.py", *(argv or sys.argv[1:])])
    run(a.sets, a.splits, a.models, out, a.seed, command)
    print(summary(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
