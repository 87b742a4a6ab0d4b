"""The paper's missing Bayesian classification section (issue 15, Build 5).

The closed-form variational GPN (:class:`pyro_gpn.models.VariationalGPN` with
``head="softmax"``, the library's recommendations :data:`pyro_gpn.recommended.VGPN`: whitened
``q(U)``, identity start, variational ``W``) on the paper's networks (Letter 16x30x15x26, Adult
108x30x15x2, Connect-4 126x30x15x3; and ``mnist-test-only`` 784x30x15x10, the reduced MNIST of
``docs/results/mnist_reduced.md``), trained by :func:`pyro_gpn.inference.fit_vgpn` on the
paper grid's data (``pyro_gpn.data.load_dataset(name, seed=0)``: features in [0, 1] with the
training min/max, the same 10 % validation hold-out for every seed, the official test rows) and
stopped on the validation log-likelihood. Reported: train / validation / test error (argmax of
the closed-form predictive class probabilities) and test NLL (the mean of ``-log p(y | x)``
under those probabilities, nats), beside the maximum-likelihood GPN rows of
``docs/results/paper_table.md``.

One JSON per (set, seed) cell under ``--out`` (default
``docs/results/bayes_classification_runs``), written atomically; finished cells are skipped.
Each records the command, the machine, the load average at its start and end, wall and process
CPU seconds. Usage::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bayes_classification.py \\
        --sets letter adult connect4 --seeds 0 1 2 3 4
    python benchmarks/bayes_classification.py --summary
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from benchmarks.uci import DATA_DIR  # noqa: E402
from pyro_gpn.recommended import VGPN  # noqa: E402

SETS = ("letter", "adult", "connect4", "mnist-test-only")
#: the training objectives of ``fit_vgpn`` offered by ``--elbo``; the tag of a cell trained on
#: the predictive log-likelihood ends with ``PLL`` (as ``benchmarks/uci.py``'s ``_pll`` twins)
OBJECTIVES = ("closed_form", "predictive")
PLL = "-pll"
#: the tag of a cell whose predictive is temperature-scaled on the validation rows
#: (``--calibrate``) ends with CAL; the calibrated maximum-likelihood reruns are ``ML_CAL``
CAL = "-cal"
ML_CAL = "ml-cal"
#: the paper's hidden widths (``PAPER_HIDDEN`` of the grid)
HIDDEN = (30, 15)


def class_metrics(probs: Tensor, y: Tensor) -> dict[str, float]:
    """Error of the argmax and mean negative log-probability (nats) of labels ``y`` ``[S]``
    under class probabilities ``probs`` ``[S, C]``."""
    if probs.dim() != 2 or y.shape != probs.shape[:1]:
        raise ValueError(
            f"probs must be [S, C] and y [S], got {tuple(probs.shape)} and {tuple(y.shape)}"
        )
    y = y.long()
    picked = probs.gather(1, y.reshape(-1, 1)).reshape(-1).clamp_min(1e-300)
    return {
        "error": float((probs.argmax(1) != y).double().mean()),
        "nll": float(-picked.double().log().mean()),
    }


def predict_probs(model, x: Tensor, batch: int = 4096) -> Tensor:
    """Closed-form predictive class probabilities ``[S, C]``, in batches (memory only)."""
    with torch.no_grad():
        return torch.cat([model.predict(x[i : i + batch]).mean for i in range(0, len(x), batch)])


def temperature_facts(model, data) -> dict:
    """What the temperature of a calibrated classifier (fitted on all validation rows, as
    ``fit_vgpn(calibrate=True)`` does) changes, for the choice and its check: the
    ``temperature``; ``val_crossfit``, the validation NLL of
    :func:`pyro_gpn.inference.crossfitted_scores` (the figure a choice may use); and the test
    metrics at temperature 1 (``test_*_uncalibrated``). The head keeps its temperature."""
    from pyro_gpn.inference import crossfitted_scores

    raw, calibrated = crossfitted_scores(
        model, data.x_val, data.y_val, lambda x, y: class_metrics(predict_probs(model, x), y)["nll"]
    )
    temperature = model.head.predictive_scale
    fitted = temperature.clone()
    try:
        temperature.fill_(1.0)
        test = class_metrics(predict_probs(model, data.x_test), data.y_test)
    finally:
        temperature.copy_(fitted)
    return {
        "temperature": float(fitted),
        "val_crossfit": {"nll_uncalibrated": raw, "nll_calibrated": calibrated},
        "test_error_uncalibrated": test["error"],
        "test_nll_uncalibrated": test["nll"],
    }


def overrides(config: dict) -> dict:
    """The settings of ``config`` that differ from the library's recommendations
    (:data:`pyro_gpn.recommended.VGPN`; the batch size: its rule for large data)."""
    from pyro_gpn.recommended import VGPN

    defaults = {**VGPN.as_dict(), "batch_size": VGPN.large_batch_size}
    return {k: v for k, v in config.items() if defaults.get(k, object()) != v}


def run_cell(name: str, seed: int, config: dict, tag: str = "bgpn") -> dict:
    """Train one Bayesian GPN on ``name`` with ``seed`` and return its record."""
    from pyro_gpn.data import load_dataset
    from pyro_gpn.inference import fit_vgpn
    from pyro_gpn.models import VariationalGPN

    data = load_dataset(name, data_dir=DATA_DIR, seed=0)
    sizes = [data.num_features, *HIDDEN, data.num_classes]
    load_start = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    layer_kwargs = {}
    if config.get("weight_prior_scale") is not None:
        layer_kwargs["weight_prior_scale"] = config["weight_prior_scale"]
    model = VariationalGPN(sizes, head="softmax", **layer_kwargs)
    fit = fit_vgpn(
        model,
        data.x_train,
        data.y_train,
        data.x_val,
        data.y_val,
        num_steps=config["num_steps"],
        lr=config["lr"],
        lr_decay=config["lr_decay"],
        batch_size=config["batch_size"],
        eval_every=config["eval_every"],
        patience=config["patience"],
        seed=seed,
        # the paper's ELBO unless the cell says otherwise: every cell recorded before the
        # option existed was trained on it (its config has no "elbo")
        elbo=config.get("elbo", "closed_form"),
        calibrate=bool(config.get("calibrate", False)),
        log=lambda line: print(f"    [{time.strftime('%H:%M:%S')}] {line}", flush=True),
    )
    fit_wall, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    calibration = temperature_facts(model, data) if config.get("calibrate") else {}
    parts = {}
    for split in ("train", "val", "test"):
        x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
        parts[split] = class_metrics(predict_probs(model, x), y)
    return {
        "tag": tag,
        "set": name,
        "seed": seed,
        "sizes": sizes,
        "layer_sizes": "x".join(map(str, sizes)),
        # the library's defaults (pyro_gpn.recommended.VGPN) but for the settings that differ
        # (cells before 2026-11-28 said "library defaults" whatever their settings)
        "model": "VariationalGPN(head='softmax'), the library's defaults but for: "
        + (", ".join(f"{k}={v}" for k, v in sorted(overrides(config).items())) or "none"),
        **{f"{s}_{k}": v for s, m in parts.items() for k, v in m.items()},
        **calibration,
        "num_steps": fit.num_steps,
        "best_step": fit.best_step,
        "stopped_early": fit.stopped_early,
        "best_val_log_lik": fit.best_val_log_lik,
        "epochs": fit.num_steps * config["batch_size"] / fit.num_train,
        "curve": fit.curve,
        "config": config,
        "fit_wall_s": fit_wall,
        "fit_cpu_s": fit_cpu,
        "step_s": fit.wall_time / max(fit.num_steps, 1),
        "cell_s": time.perf_counter() - t0,
        "cell_cpu_s": time.process_time() - c0,
        "load_avg_1m_start": load_start,
        "load_avg_1m_end": os.getloadavg()[0],
        "command": " ".join(["python benchmarks/bayes_classification.py", *sys.argv[1:]]),
        "machine": f"{platform.node()}, {os.cpu_count()}-core CPU, no GPU, "
        f"{torch.get_num_threads()} torch thread(s)",
        "torch": torch.__version__,
        "data": getattr(data, "description", ""),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


#: the maximum-likelihood GPN row rerun per set by ``--ml`` (the best ML GPN row of
#: paper_table.md on validation error)
ML_ROW = {
    "letter": ("gpn-meanvar", "random", "none"),
    "adult": ("gpn-meanvar", "identity", "none"),
    "connect4": ("gpn-meanvar", "random", "layer"),
    # the reduced MNIST's GPN row (benchmarks/mnist_reduced.py: the grid's protocol, random
    # targets, nothing shared)
    "mnist-test-only": ("gpn-meanvar", "random", "none"),
}


def run_ml_cell(name: str, seed: int, work_dir: Path, calibrate: bool = False) -> dict:
    """Rerun one maximum-likelihood GPN cell of the paper grid with its own protocol
    (:func:`pyro_gpn.experiments.paper.run_cell`, checkpoints under ``work_dir``), reload its
    best-validation parameters and add the test NLL of its closed-form predictive class
    probabilities (the run files in paper_runs/ record errors only); with ``calibrate``, at
    the temperature fitted on the validation rows (:func:`temperature_facts`)."""
    from pyro_gpn import io as pio
    from pyro_gpn.data import load_dataset
    from pyro_gpn.experiments.paper import GridCell, RunSettings, run_cell
    from pyro_gpn.experiments.runs import build_model
    from pyro_gpn.inference.trainer import BEST_MODEL_NAME

    model_name, init, share = ML_ROW[name]
    cell = GridCell(name, model_name, init, share, seed)
    load_start = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    record = run_cell(
        cell,
        work_dir / "runs",
        RunSettings(data_dir=DATA_DIR),
        work_dir,
        command=" ".join(["python benchmarks/bayes_classification.py", *sys.argv[1:]]),
    )
    data = load_dataset(name, data_dir=DATA_DIR, seed=0)
    model = build_model("gpn", record["sizes"], "softmax", mode="meanvar", init=init, share=share)
    path = work_dir / cell.run_id / BEST_MODEL_NAME
    model.load_state_dict(pio.load_torch(path, require_checksum=False))
    model.eval()
    calibration = {}
    if calibrate:
        from pyro_gpn.inference import fit_predictive_scale

        fit_predictive_scale(model, data.x_val, data.y_val)
        calibration = temperature_facts(model, data)
    for split in ("train", "val", "test"):
        x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
        for key, value in class_metrics(predict_probs(model, x), y).items():
            record[f"{split}_{key}_probs" if key == "error" else f"{split}_{key}"] = value
    return {
        **record,
        **calibration,
        "tag": ML_CAL if calibrate else "ml",
        "set": name,
        "cell_s": time.perf_counter() - t0,
        "cell_cpu_s": time.process_time() - c0,
        "load_avg_1m_start": load_start,
        "load_avg_1m_end": os.getloadavg()[0],
    }


def _atomic_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=float))
    os.replace(tmp, path)


def _ml_rows(paper_runs: Path, name: str) -> dict[str, list[dict]]:
    """The maximum-likelihood GPN run files of ``name`` in ``paper_runs``, by row
    (``model, init, share``)."""
    rows: dict[str, list[dict]] = {}
    for path in sorted(paper_runs.glob(f"{name}__gpn-*__seed*.json")):
        run = json.loads(path.read_text())
        rows.setdefault(f"{run['model']}, {run['init']}, {run['share']}", []).append(run)
    return rows


def _ms(vals, d: int = 4) -> str:
    v = np.asarray(vals, dtype=float)
    if len(v) == 0:
        return "–"
    if len(v) == 1:
        return f"{v[0]:.{d}f}"
    return f"{v.mean():.{d}f} ± {v.std(ddof=1):.{d}f}"


def _signed_ms(vals) -> str:
    """``+mean ± sample std`` (4 decimals; the mean alone for one value)."""
    v = np.asarray(vals, dtype=float)
    return f"{v.mean():+.4f}" + (f" ± {v.std(ddof=1):.4f}" if len(v) > 1 else "")


def summary(out: Path, paper_runs: Path) -> str:
    """Markdown: the Bayesian GPN's errors and NLL per tag (mean ± sample std over the seeds
    listed, as paper_table.md) beside the maximum-likelihood GPN rows' errors."""
    cells = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    tags = sorted({c.get("tag", "bgpn") for c in cells})
    lines = [
        "| set | model | train err | val err | test err | test NLL | seeds | s per fit "
        "(CPU, load) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in SETS:
        for row, rs in _ml_rows(paper_runs, name).items():
            lines.append(
                f"| {name} | ML GPN ({row}) | "
                + " | ".join(_ms([r[f"{s}_error"] for r in rs]) for s in ("train", "val", "test"))
                + f" | not recorded | {','.join(str(r['seed']) for r in rs)} | "
                f"{np.median([r['train_time_s'] for r in rs]):.0f} (wall) |"
            )
        for tag in tags:
            cs = [c for c in cells if c["set"] == name and c.get("tag", "bgpn") == tag]
            if not cs:
                continue
            cs.sort(key=lambda c: c["seed"])
            cpu = np.median([c["cell_cpu_s"] for c in cs])
            load = np.median([c["load_avg_1m_end"] for c in cs])
            label = (
                f"ML GPN rerun ({', '.join(ML_ROW[name])})"
                if tag == "ml"
                else f"ML GPN rerun, temperature-scaled ({', '.join(ML_ROW[name])})"
                if tag == ML_CAL
                else f"Bayesian GPN ({tag})"
            )
            lines.append(
                f"| {name} | {label} | "
                + " | ".join(_ms([c[f"{s}_error"] for c in cs]) for s in ("train", "val", "test"))
                + f" | {_ms([c['test_nll'] for c in cs], 3)} | "
                f"{','.join(str(c['seed']) for c in cs)} | {cpu:.0f} (load {load:.1f}) |"
            )
    return "\n".join(lines)


def paired_table(out: Path, tags: list[str], against: str = "ml") -> str:
    """Markdown: each Bayesian GPN tag in ``tags`` against the maximum-likelihood rerun
    (``against``: the ``ml`` cells of ``--ml``, or ``ml-cal`` of ``--ml --calibrate``) seed by
    seed, on the seeds that have both: test error and test NLL of each (the error of the argmax
    of the predictive class probabilities of both), the Bayesian-minus-ML differences, and a
    last row per tag with the mean ± sample std of the differences and on how many seeds the
    Bayesian figure is lower."""
    cells = {}
    for path in sorted(out.glob("*.json")):
        c = json.loads(path.read_text())
        cells[(c.get("tag", "bgpn"), c["set"], c["seed"])] = c
    lines = [
        "| set | Bayesian tag | seed | test err (Bayes / ML) | test NLL (Bayes / ML) "
        "| err diff | NLL diff |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for tag in tags:
        for name in SETS:
            seeds = sorted(
                s for t, n, s in cells if t == tag and n == name and (against, n, s) in cells
            )
            if not seeds:
                continue
            diffs = []
            for seed in seeds:
                b, m = cells[(tag, name, seed)], cells[(against, name, seed)]
                d = (b["test_error"] - m["test_error_probs"], b["test_nll"] - m["test_nll"])
                diffs.append(d)
                lines.append(
                    f"| {name} | {tag} | {seed} | {b['test_error']:.4f} / "
                    f"{m['test_error_probs']:.4f} | {b['test_nll']:.4f} / {m['test_nll']:.4f} "
                    f"| {d[0]:+.4f} | {d[1]:+.4f} |"
                )
            de, dn = np.asarray(diffs).T
            lines.append(
                f"| {name} | {tag} | {len(seeds)} paired | lower on {(de < 0).sum()} of "
                f"{len(seeds)} | lower on {(dn < 0).sum()} of {len(seeds)} | "
                f"{_signed_ms(de)} | {_signed_ms(dn)} |"
            )
    return "\n".join(lines)


def validation_table(out: Path, seed: int = 0) -> str:
    """Markdown: every Bayesian GPN configuration (tag) run on ``seed``, per set, with the
    quantities the schedule is chosen by (validation log-likelihood, the stopping criterion;
    validation and training error for reading) and its cost. No test figure is shown."""
    cells = [json.loads(p.read_text()) for p in sorted(out.glob(f"*__seed{seed}.json"))]
    lines = [
        "| set | tag | batch | steps (epochs) | lr | best step / run | val log-lik | val err "
        "| train err | CPU s (load) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in SETS:
        cs = [c for c in cells if c["set"] == name and c.get("tag", "bgpn") not in ("ml", ML_CAL)]
        for c in sorted(cs, key=lambda c: -c["best_val_log_lik"]):
            cfg = c["config"]
            lines.append(
                f"| {name} | {c.get('tag', 'bgpn')} | {cfg['batch_size']} | {cfg['num_steps']} "
                f"({c['epochs'] * cfg['num_steps'] / c['num_steps']:.0f}) "
                f"| {cfg['lr']:g} | {c['best_step']} / {c['num_steps']} | "
                f"{c['best_val_log_lik']:.3f} | {c['val_error']:.4f} | {c['train_error']:.4f} | "
                f"{c['cell_cpu_s']:.0f} ({c['load_avg_1m_end']:.1f}) |"
            )
    return "\n".join(lines)


def _prior_scale(text: str) -> float | str:
    """``--weight-prior-scale``: a positive finite number or ``"empirical"``."""
    from pyro_gpn.layers.variational import EMPIRICAL

    if text == EMPIRICAL:
        return EMPIRICAL
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (np.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"--weight-prior-scale must be a positive number or '{EMPIRICAL}', got {text!r}"
        )
    return value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", nargs="+", default=list(SETS[:3]), choices=SETS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--num-steps", type=int, default=VGPN.num_steps)
    p.add_argument("--lr", type=float, default=VGPN.lr)
    p.add_argument("--lr-decay", type=float, default=VGPN.lr_decay)
    p.add_argument("--batch-size", type=int, default=VGPN.large_batch_size)
    p.add_argument("--eval-every", type=int, default=VGPN.eval_every)
    p.add_argument("--patience", type=int, default=VGPN.patience)
    p.add_argument(
        "--weight-prior-scale",
        type=_prior_scale,
        default=None,
        help="prior std of W times sqrt(fan_in), a positive number or 'empirical' (the "
        "empirical-Bayes prior variance of each layer; default: the recommendation)",
    )
    p.add_argument(
        "--elbo",
        choices=OBJECTIVES,
        default="closed_form",
        help="fit_vgpn's objective: the paper's closed-form ELBO (default, every cell recorded "
        "before this option) or the predictive log-likelihood (PPGPR; the tag must end with "
        f"'{PLL}')",
    )
    p.add_argument("--tag", default="bgpn", help="names the cells of this configuration")
    p.add_argument(
        "--ml",
        action="store_true",
        help="rerun the maximum-likelihood GPN rows (ML_ROW) with the paper protocol for their "
        "test NLL (tag 'ml')",
    )
    p.add_argument("--work-dir", default="/tmp/pyro-gpn-bayes-ml", help="--ml checkpoints")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="fit the predictive's temperature on the validation rows after the fit "
        f"(fit_vgpn(calibrate=True); with --ml the reruns too, tag '{ML_CAL}'); the test "
        f"metrics at temperature 1 are kept beside (the tag must end with '{CAL}')",
    )
    p.add_argument("--out", default=str(ROOT / "docs/results/bayes_classification_runs"))
    p.add_argument("--paper-runs", default=str(ROOT / "docs/results/paper_runs"))
    p.add_argument("--summary", action="store_true", help="print the table and exit")
    p.add_argument(
        "--paired",
        nargs="+",
        metavar="TAG",
        default=None,
        help="print each Bayesian tag against the --ml reruns seed by seed and exit",
    )
    p.add_argument(
        "--against",
        default="ml",
        choices=("ml", ML_CAL),
        help="--paired: the maximum-likelihood cells to compare with",
    )
    p.add_argument(
        "--validation",
        type=int,
        default=None,
        metavar="SEED",
        help="print the validation rows of every configuration run on SEED and exit",
    )
    a = p.parse_args(argv)
    if not a.ml and (a.elbo == "predictive") != a.tag.removesuffix(CAL).endswith(PLL):
        p.error(
            f"--tag must end with '{PLL}' exactly when --elbo is 'predictive' (got --tag "
            f"{a.tag!r}, --elbo {a.elbo!r}): a cell's tag names its objective"
        )
    if not a.ml and a.calibrate != a.tag.endswith(CAL):
        p.error(f"--tag must end with '{CAL}' exactly when --calibrate is given (got {a.tag!r})")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.summary:
        print(summary(out, Path(a.paper_runs)))
        return 0
    if a.paired is not None:
        print(paired_table(out, a.paired, a.against))
        return 0
    if a.validation is not None:
        print(validation_table(out, a.validation))
        return 0
    config = {
        "num_steps": a.num_steps,
        "lr": a.lr,
        "lr_decay": a.lr_decay,
        "batch_size": a.batch_size,
        "eval_every": a.eval_every,
        "patience": a.patience,
        "elbo": a.elbo,
    }
    if a.calibrate:
        config["calibrate"] = True
    if a.weight_prior_scale is not None:
        config["weight_prior_scale"] = a.weight_prior_scale
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"# {platform.node()} torch {torch.__version__} config {config}", flush=True)
    for seed in a.seeds:
        for name in a.sets:
            tag = (ML_CAL if a.calibrate else "ml") if a.ml else a.tag
            path = out / f"{tag}__{name}__seed{seed}.json"
            if path.exists():
                continue
            print(
                f"[{time.strftime('%H:%M:%S')}] {name} seed {seed} (load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
            if a.ml:
                cell = run_ml_cell(name, seed, Path(a.work_dir), a.calibrate)
            else:
                cell = run_cell(name, seed, config, a.tag)
            _atomic_json(path, cell)
            print(
                f"    test error {cell['test_error']:.4f} NLL {cell['test_nll']:.4f} | val "
                f"{cell['val_error']:.4f} | best {cell.get('best_step', cell.get('best_epoch'))} | "
                f"{cell['cell_s']:.0f} s wall, {cell['cell_cpu_s']:.0f} s CPU",
                flush=True,
            )
    print(summary(out, Path(a.paper_runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
