"""Paired comparison of UCI benchmark models on the splits that all of them ran.

Reads the cell files of ``benchmarks/uci.py`` (``docs/results/uci_runs/MODEL__SET__SS.json``)
and prints, per set, the test log-likelihood of each model (mean ± standard error over the
common splits), the first model's paired difference to each other model (mean ± standard error,
splits won) and the 90 % interval coverages: a markdown table. Usage::

    python benchmarks/uci_paired.py --models bgpn clt ensemble mcdrop --long naval=bgpn_long
    python benchmarks/uci_paired.py --models chosen dgp mcdrop --chosen
    python benchmarks/uci_paired.py --models dgp_t4 dgp --rows val
    python benchmarks/uci_paired.py --models bgpn_auto chosen dgp_chosen bgpn_pll
    python benchmarks/uci_paired.py --choices bgpn_auto
    python benchmarks/uci_paired.py --rules bgpn_stack

``--chosen``: the first model stands for each set's chosen Bayesian GPN column
(``benchmarks.uci.CHOSEN``, chosen on validation rows; with ``--ensembles`` its five-network
mixture where adopted, ``benchmarks.uci.ENSEMBLES``), ``--long`` entries on top. Without it, a
first model ``bgpn`` stands for ``bgpn_long`` on naval. A model named ``dgp_chosen`` is each
set's chosen deep GP column (``benchmarks.uci.DGP_CHOSEN``), a later model named ``chosen``
each set's chosen Bayesian GPN column. ``--choices MODEL``: how often each candidate won a
split of a column that records its choice (``bgpn_auto``). ``--rules MODEL``: the test
metrics of every rule of choosing or mixing the candidates, rebuilt from the per-row densities a
``bgpn_stack`` cell records (:func:`rule_metrics`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = ("boston", "concrete", "energy", "kin8nm", "naval", "power", "protein", "wine", "yacht")


#: the pseudo-column of section 29's library rule (a stacked mixture left unscaled) on the
#: ``bgpn_stack`` cells (:func:`library_metrics`; test rows only); the library's rule since
#: section 30 is the ``bgpn_select`` column's own
LIBRARY = "bgpn_stack_library"


def _cells(runs: Path, model: str, name: str, rows: str = "test") -> dict[int, dict]:
    """``{split: metrics}`` of one column on one set: its ``rows`` (``"test"`` or ``"val"``);
    :data:`LIBRARY`: :func:`library_metrics` of the ``bgpn_stack`` cells; ``MODEL:RULE`` (e.g.
    ``bgpn_stack:best``): :func:`rule_metrics` of a rule of :data:`RULES` on ``MODEL``'s cells
    (both test rows only)."""
    out = {}
    cells_of, rule = (model.split(":", 1) + [None])[:2] if ":" in model else (model, None)
    if model == LIBRARY:
        cells_of = "bgpn_stack"
    if (model == LIBRARY or rule) and rows != "test":
        raise SystemExit(f"{model} has test metrics only")
    if rule is not None and rule not in RULES:
        raise SystemExit(f"{model}: the rule must be one of {', '.join(RULES)}")
    for path in sorted(runs.glob(f"{cells_of}__{name}__*.json")):
        cell = json.loads(path.read_text())
        split = int(cell["split"])
        if model == LIBRARY:
            out[split] = library_metrics(cell, partial(_log_y_std, name, split))
        elif rule is not None:
            out[split] = rule_metrics(cell, rule, _log_y_std(name, split))
        else:
            out[split] = cell[rows]
    return out


def _log_y_std(name: str, split: int) -> float:
    """:func:`benchmarks.uci.log_target_std` (imported on use, as :func:`chosen_columns`)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.uci import log_target_std

    return log_target_std(name, split)


def _mean_se(values: list[float], digits: int = 2) -> str:
    """``mean ± standard error`` of ``values`` with ``digits`` decimals (the mean alone for one
    value)."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return f"{mean:.{digits}f}"
    se = statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def paired_table(
    runs: Path,
    models: list[str],
    substitute: dict[str, str],
    rows: str = "test",
    columns: dict[str, dict[str, str]] | None = None,
    sets: tuple[str, ...] = SETS,
) -> str:
    """The markdown table (module docstring) of the ``rows`` (``"test"``; ``"val"``: the
    validation rows, where choices are made); ``substitute`` maps a set to the cell name that
    stands for ``models[0]`` there (e.g. naval's ``bgpn_long``), ``columns`` a model name to
    such a map of its own (e.g. ``dgp_chosen``); one row per set of ``sets`` with cells."""
    columns = {**(columns or {}), models[0]: substitute}
    first, others = models[0], models[1:]
    head = ["set", "splits", *models]
    head += [f"{first} − {m} (won)" for m in others]
    head += [f"cov. 90 % {m}" for m in models]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name in sets:
        cells = {m: _cells(runs, columns.get(m, {}).get(name, m), name, rows) for m in models}
        splits = sorted(set.intersection(*(set(c) for c in cells.values())))
        if not splits:
            continue
        ll = {m: [cells[m][s]["log_lik"] for s in splits] for m in models}
        row = [name, str(len(splits))] + [_mean_se(ll[m]) for m in models]
        for m in others:
            diff = [a - b for a, b in zip(ll[first], ll[m], strict=True)]
            row.append(f"{_mean_se(diff)} ({sum(d > 0 for d in diff)}/{len(diff)})")
        for m in models:
            cov = statistics.mean(cells[m][s]["coverage90"] for s in splits)
            row.append(f"{cov:.2f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def choices_table(runs: Path, model: str = "bgpn_auto") -> str:
    """How often each candidate won a split of column ``model`` (a cell that records its
    choice, ``chosen``: ``bgpn_auto``, :func:`pyro_gpn.inference.select_vgpn`), and on how many
    splits its predictive scale was fitted, and the median process CPU seconds of a cell (all
    the candidates' fits): a markdown table, one row per set."""
    lines = [
        "| set | splits | chosen (splits) | calibrated | CPU s per cell (median) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in SETS:
        cells = [
            json.loads(path.read_text()) for path in sorted(runs.glob(f"{model}__{name}__*.json"))
        ]
        if not cells:
            continue
        counts: dict[str, int] = {}
        for cell in cells:
            if "chosen" not in cell:
                raise SystemExit(
                    f"--choices {model}: its cells record no choice ('chosen'); a column that "
                    "chooses among candidates (bgpn_auto) does"
                )
            counts[cell["chosen"]] = counts.get(cell["chosen"], 0) + 1
        listed = ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        calibrated = sum(bool(cell.get("calibrated")) for cell in cells)
        cpu = [cell["cell_cpu_s"] for cell in cells if "cell_cpu_s" in cell]
        median = f"{statistics.median(cpu):.0f}" if cpu else "–"
        lines.append(f"| {name} | {len(cells)} | {listed} | {calibrated} | {median} |")
    return "\n".join(lines)


RULES = ("best", "one_se", "equal", "stack", "auto")


def _rule_weights(cell: dict, rule: str) -> dict[str, float]:
    """The mixture weights over the candidates that ``rule`` gives from a cell's validation
    rows: ``best`` (the highest mean validation log density), ``one_se`` (a paired
    one-standard-error rule: the first candidate in the portfolio's order, the recommendation
    first, whose mean is within one standard error of the per-row difference to the best's, as
    ``loo``'s ``se_diff``; after Breiman et al. 1984, who prefer the simplest model within one
    standard error of the best's own estimate), ``equal`` (every candidate, equal
    weights), ``stack`` (``select_vgpn``'s own rule,
    :func:`pyro_gpn.inference.selection.stacked_weights`) and ``auto`` (``stack`` where the
    cell's cross-fitted stacked score is higher, else ``best``)."""
    import torch

    from pyro_gpn.inference.selection import stacked_weights

    rows = cell["candidate_rows"]
    names = list(rows)
    val = torch.tensor([rows[n]["val_log_density"] for n in names], dtype=torch.float64).T
    means = val.mean(0)
    best = int(means.argmax())
    if rule == "best":
        return {names[best]: 1.0}
    if rule == "one_se":
        for k, name in enumerate(names):
            diff = val[:, best] - val[:, k]
            if diff.shape[0] > 1 and float(diff.mean()) <= float(
                diff.std() / math.sqrt(diff.shape[0])
            ):
                return {name: 1.0}
        return {names[best]: 1.0}  # one row: no standard error
    if rule == "equal":
        return {n: 1.0 / len(names) for n in names}
    if rule == "auto":
        crossfit_best, crossfit_stacked = cell["combine_crossfit_std"]
        rule = "stack" if crossfit_stacked > crossfit_best else "best"
        return _rule_weights(cell, rule)
    if rule == "stack":
        return stacked_weights(names, val)
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def rule_metrics(cell: dict, rule: str, log_y_std: float) -> dict[str, float]:
    """A rule's test ``log_lik`` (original units: the standardised mean log density less
    ``log_y_std``) and ``coverage90`` (rows whose mixture distribution function
    ``sum_k w_k F_k(y)`` lies in ``[0.05, 0.95]``: exactly the rows inside the mixture's central
    90 % interval), from a cell's ``candidate_rows`` (uncalibrated candidates)."""
    import torch

    weights = _rule_weights(cell, rule)
    rows = cell["candidate_rows"]
    dens = torch.tensor([rows[n]["test_log_density"] for n in weights], dtype=torch.float64)
    log_w = torch.tensor([math.log(w) for w in weights.values()], dtype=torch.float64)
    log_lik = float(torch.logsumexp(dens + log_w[:, None], 0).mean()) - log_y_std
    cdf = sum(
        w * torch.tensor(rows[n]["test_cdf"], dtype=torch.float64) for n, w in weights.items()
    )
    return {
        "log_lik": log_lik,
        "coverage90": float(((cdf >= 0.05) & (cdf <= 0.95)).double().mean()),
    }


def library_metrics(cell: dict, log_y_std: Callable[[], float]) -> dict[str, float]:
    """What :func:`pyro_gpn.inference.select_vgpn` returned by section 29's rule for a
    ``bgpn_stack`` cell's networks: the stacked mixture left unscaled where it holds two or more
    networks, the cell's own metrics where it kept one network (calibrated or not by the same
    rule as then) or calibrated nothing. Cells run before that rule calibrated some mixtures;
    the ``stack`` rule rebuilds them unscaled (the same networks, checked, and the same mean, so
    the cell's RMSE). ``log_y_std()`` is called only for a rebuild (it may load the data set).
    Since ``docs/results/uci.md`` section 30 the library fits a mixture's scale where a
    cross-fit with the stacking inside gains, which the recorded rows cannot rebuild: the
    ``bgpn_select`` cells follow that rule."""
    if len(cell["weights"]) == 1 or not cell["calibrated"]:
        return cell["test"]
    if set(_rule_weights(cell, "stack")) != set(cell["weights"]):
        raise SystemExit(
            f"{cell.get('set')} split {cell.get('split')}: today's stacking keeps "
            f"{sorted(_rule_weights(cell, 'stack'))}, the cell kept {sorted(cell['weights'])}: "
            "its metrics cannot be rebuilt from the recorded rows"
        )
    return {**rule_metrics(cell, "stack", log_y_std()), "rmse": cell["test"]["rmse"]}


def rules_table(runs: Path, model: str = "bgpn_stack", log_y_std=None) -> str:
    """Per set, the test log-likelihood (mean ± standard error over the splits) and mean 90 %
    coverage of every rule of :data:`RULES` (:func:`rule_metrics`), then those of the cell
    itself (``stack`` with the calibration of the code it ran: for ``bgpn_select`` the
    library's rule today), of section 29's rule (``s29``, :func:`library_metrics`), and the
    mean cross-fitted validation
    log-likelihood (standardised) of choosing and of stacking that ``auto`` decides by:
    a markdown table. ``log_y_std(set, split)`` gives the split's ``log y_std`` (``None``: from
    the data set, :func:`benchmarks.uci.log_target_std`)."""
    log_y_std = log_y_std or _log_y_std
    keys = (*RULES, "cell", "s29")
    head = ["set", "splits", *keys, *(f"cov. {k}" for k in keys)]
    head += ["val. crossfit best", "val. crossfit stack"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name in SETS:
        cells = [
            json.loads(path.read_text()) for path in sorted(runs.glob(f"{model}__{name}__*.json"))
        ]
        if not cells:
            continue
        if any("candidate_rows" not in cell for cell in cells):
            raise SystemExit(f"--rules {model}: its cells record no candidate_rows (bgpn_stack)")
        metrics = {
            rule: [rule_metrics(c, rule, log_y_std(name, int(c["split"]))) for c in cells]
            for rule in RULES
        }
        metrics["cell"] = [c["test"] for c in cells]
        metrics["s29"] = [
            library_metrics(c, partial(log_y_std, name, int(c["split"]))) for c in cells
        ]
        row = [name, str(len(cells))]
        row += [_mean_se([m["log_lik"] for m in metrics[k]]) for k in keys]
        row += [f"{statistics.mean(m['coverage90'] for m in metrics[k]):.2f}" for k in keys]
        for part in (0, 1):
            row.append(f"{statistics.mean(c['combine_crossfit_std'][part] for c in cells):.3f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def chosen_columns(ensembles: bool = False) -> dict[str, str]:
    """:func:`benchmarks.uci.chosen_columns` (imported on use: the module needs the checkout
    on the path)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.uci import chosen_columns as columns

    return columns(ensembles)


def dgp_chosen_columns() -> dict[str, str]:
    """:func:`benchmarks.uci.dgp_chosen_columns` (imported on use, as :func:`chosen_columns`)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.uci import dgp_chosen_columns as columns

    return columns()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bgpn", "clt", "ensemble", "mcdrop"])
    parser.add_argument("--runs", default=str(ROOT / "docs/results/uci_runs"))
    parser.add_argument("--long", nargs="*", default=None, help="SET=CELL: the first model there")
    parser.add_argument(
        "--chosen", action="store_true", help="the first model is each set's chosen column"
    )
    parser.add_argument(
        "--ensembles",
        action="store_true",
        help="with --chosen: the five-network mixture where validation adopted it",
    )
    parser.add_argument(
        "--rows",
        choices=("test", "val"),
        default="test",
        help="val: the validation rows' metrics (for choosing between columns)",
    )
    parser.add_argument(
        "--choices",
        metavar="MODEL",
        default=None,
        help="print how often each candidate won a split of MODEL (e.g. bgpn_auto) instead",
    )
    parser.add_argument(
        "--rules",
        metavar="MODEL",
        default=None,
        help="print every rule of choosing or mixing the candidates of MODEL (bgpn_stack) instead",
    )
    args = parser.parse_args(argv)
    if args.rules:
        print(rules_table(Path(args.runs), args.rules))
        return
    if args.choices:
        print(choices_table(Path(args.runs), args.choices))
        return
    if args.chosen:
        substitute = chosen_columns(args.ensembles)
    else:
        substitute = {"naval": "bgpn_long"} if args.models[0] == "bgpn" else {}
    substitute.update(item.split("=", 1) for item in args.long or [])
    columns = {"dgp_chosen": dgp_chosen_columns()} if "dgp_chosen" in args.models else {}
    if "chosen" in args.models[1:]:
        columns["chosen"] = chosen_columns()
    print(paired_table(Path(args.runs), args.models, substitute, args.rows, columns))


if __name__ == "__main__":
    main()
