"""Why is the closed-form variational GPN overconfident on UCI boston / concrete? (issue 15)

Every variant is measured on the *validation* hold-out of the fixed training split (the 10 %
that :func:`pyro_gpn.data.load_uci_regression` holds out); the test rows are never read. A
variant that stops early picks its step on a second, inner 10 % of the remaining training rows,
so the validation rows stay untouched by every choice. Writes one JSON per (variant, set, split)
under ``--out`` (skips finished cells, atomic writes) and prints a table.

The models are the library's (:class:`~pyro_gpn.models.VariationalGPN` with
``weights="point"`` or ``"variational"``, :func:`~pyro_gpn.inference.fit_vgpn`). The ``map``
(a Gaussian prior on point weights) and ``floor`` (a noise floor) variants of
``docs/results/uci.md`` ran with the prototype ``pyro_gpn/_proto_bayes.py`` (commit c372e8e),
which the library's ``weights="variational"`` replaced; they are not in this script any more.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/uci_diagnose.py --sets boston concrete --splits 0 1 2 \\
        --variants issue es vi vi_es
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.uci import DATA_DIR, metrics_of  # noqa: E402
from pyro_gpn.data.splits import holdout_split  # noqa: E402
from pyro_gpn.data.uci_regression import load_uci_regression  # noqa: E402
from pyro_gpn.inference import fit_vgpn  # noqa: E402
from pyro_gpn.models import VariationalGPN  # noqa: E402

#: the issue's configuration: whitened, identity start, lr 0.05 -> 0.005, 2000 full-batch steps
BASE = dict(
    weights="point",
    whiten=True,
    targets_init="identity",
    q_cov="full",
    noise_std_init=0.1,
    prior_scale=1.0,
    lr=5e-2,
    lr_decay=0.1,
    steps=2000,
    early_stopping=False,
    patience=8,
)
VARIANTS: dict[str, dict] = {
    "issue": {},
    "es": {"early_stopping": True},
    "vi": {"weights": "variational"},
    "vi_es": {"weights": "variational", "early_stopping": True},
    "vi_p05": {"weights": "variational", "prior_scale": 0.5},
    "vi_p2": {"weights": "variational", "prior_scale": 2.0},
    "noise05": {"noise_std_init": 0.5},
    "diag": {"q_cov": "diag"},
    "nowhiten": {"whiten": False},
    "random": {"targets_init": "random"},
    "steps500": {"steps": 500},
    "lr01": {"lr": 1e-2},
    "vi_lr01": {"weights": "variational", "lr": 1e-2},
    "vi_steps4000": {"weights": "variational", "steps": 4000},
    "vi_noise05": {"weights": "variational", "noise_std_init": 0.5},
}


def run_cell(variant: str, name: str, split: int) -> dict:
    cfg = {**BASE, **VARIANTS[variant]}
    data = load_uci_regression(name, DATA_DIR, split=split, download=False)
    x, y = data.x_train, data.y_train
    x_stop = y_stop = None
    if cfg["early_stopping"]:
        keep, inner = holdout_split(x.shape[0], 0.1, 1000 + split)
        keep, inner = torch.as_tensor(keep), torch.as_tensor(inner)
        x, y, x_stop, y_stop = x[keep], y[keep], x[inner], y[inner]
    torch.manual_seed(split)
    model = VariationalGPN(
        [data.num_features, 50, 1],
        head="gaussian",
        weights=cfg["weights"],
        weight_prior_scale=cfg["prior_scale"],
        whiten=cfg["whiten"],
        targets_init=cfg["targets_init"],
        q_cov=cfg["q_cov"],
        noise_std_init=cfg["noise_std_init"],
    )
    fit = fit_vgpn(
        model,
        x,
        y,
        x_stop,
        y_stop,
        val_fraction=0.0 if x_stop is None else None,
        num_steps=cfg["steps"],
        lr=cfg["lr"],
        lr_decay=cfg["lr_decay"],
        batch_size=None,
        patience=cfg["patience"],
        seed=split,
        elbo="closed_form",  # the objective of every recorded diagnosis
    )

    def predictive(inputs):
        with torch.no_grad():
            out = model(inputs)
        return out.mean.reshape(1, -1), out.variance.reshape(1, -1)

    res = metrics_of(*predictive(data.x_val), data.y_val, float(data.y_std))
    res_train = metrics_of(*predictive(x), y, float(data.y_std))
    extra = {}
    noise_var = model.head.noise_std.detach().square()
    with torch.no_grad():
        feats = model.hidden(data.x_val)
        extra["val_epistemic_var"] = float(feats.variance.mean())
        extra["val_noise_var"] = float(noise_var)
        if cfg["weights"] == "point":  # the model's exact predictive by Monte Carlo
            torch.manual_seed(0)
            draws = model.sample_predictive(data.x_val, num_samples=1000)["layer1.response"]
            draws = draws.reshape(draws.shape[0], -1)
            extra["val_mc"] = metrics_of(
                draws, noise_var.expand_as(draws), data.y_val, float(data.y_std)
            )
        acts = x @ model.layers[0].weight
        outside = float((acts.abs() > 2).double().mean())
    return {
        "variant": variant,
        "config": cfg,
        "set": name,
        "split": split,
        "val": res,
        "train": res_train,
        "noise_std": float(noise_var.sqrt()),
        "hidden_noise_mean": float(model.layers[0].noise_std.mean()),
        "frac_acts_outside_grid": outside,
        "steps": fit.num_steps,
        "best_step": fit.best_step,
        "wall_s": fit.wall_time,
        **extra,
        "stop_curve": fit.curve,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", nargs="+", default=["boston", "concrete", "energy", "wine"])
    p.add_argument("--splits", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--variants", nargs="+", default=["issue", "es", "vi"])
    p.add_argument("--out", default=str(ROOT / "docs/results/uci_diagnose_runs"))
    p.add_argument("--markdown", action="store_true", help="print the table of uci.md and exit")
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.markdown:
        print(markdown(out))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for split in a.splits:
        for name in a.sets:
            for variant in a.variants:
                if variant not in VARIANTS:
                    raise SystemExit(f"unknown variant {variant!r}; one of {sorted(VARIANTS)}")
                path = out / f"{variant}__{name}__{split}.json"
                if path.exists():
                    continue
                t0 = time.perf_counter()
                print(f"[{time.strftime('%H:%M:%S')}] {variant} {name} {split} ...", flush=True)
                res = run_cell(variant, name, split)
                res["cell_s"] = time.perf_counter() - t0
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(res, indent=1))
                os.replace(tmp, path)
                v = res["val"]
                print(
                    f"    val ll {v['log_lik']:.3f} rmse {v['rmse']:.3f} "
                    f"cov90 {v['coverage90']:.2f}"
                    f" | train ll {res['train']['log_lik']:.3f} noise {res['noise_std']:.3f}"
                    f" best_step {res['best_step']} {res['cell_s']:.0f}s",
                    flush=True,
                )
    summarise(out)
    return 0


def summarise(out: Path) -> None:
    rows: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(out.glob("*.json")):
        r = json.loads(path.read_text())
        rows.setdefault((r["variant"], r["set"]), []).append(r)
    print(f"{'variant':14s} {'set':9s} n  val_ll        cov90        noise")
    for (variant, name), rs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ll = np.array([r["val"]["log_lik"] for r in rs])
        cov = np.array([r["val"]["coverage90"] for r in rs])
        nz = np.array([r["noise_std"] for r in rs])
        se = lambda v: v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else float("nan")  # noqa: E731
        print(
            f"{variant:14s} {name:9s} {len(rs)}  {ll.mean():6.3f}±{se(ll):.3f}  "
            f"{cov.mean():.2f}±{se(cov):.2f}  {nz.mean():.3f}"
        )


def markdown(out: Path) -> str:
    """The diagnosis table of ``docs/results/uci.md`` (validation, mean ± s.e. over splits)."""
    rows: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(out.glob("*.json")):
        r = json.loads(path.read_text())
        rows.setdefault((r["variant"], r["set"]), []).append(r)

    def ms(v, d=2):
        v = np.asarray(v, dtype=float)
        if len(v) == 1:
            return f"{v[0]:.{d}f}"
        return f"{v.mean():.{d}f} ± {v.std(ddof=1) / math.sqrt(len(v)):.{d}f}"

    def steps(rs):
        return "/".join(
            f"{r['steps']} ({r['best_step']})" if r["config"]["early_stopping"] else str(r["steps"])
            for r in rs
        )

    lines = [
        "| variant | set | splits | val log-lik | val RMSE | val 90 % cov. | train log-lik "
        "| noise σ (std.) | hidden σ | MC − closed-form val log-lik | steps (best) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    order = ["issue", "es", "map", "vi", "vi_es"]
    for name in ["boston", "concrete", "energy", "wine", "yacht"]:
        variants = order + sorted({k[0] for k in rows} - set(order))
        for variant in variants:
            rs = rows.get((variant, name))
            if not rs:
                continue
            mc = [r["val_mc"]["log_lik"] - r["val"]["log_lik"] for r in rs if "val_mc" in r]
            cells = [
                variant,
                name,
                ",".join(str(r["split"]) for r in rs),
                ms([r["val"]["log_lik"] for r in rs]),
                ms([r["val"]["rmse"] for r in rs]),
                ms([r["val"]["coverage90"] for r in rs]),
                ms([r["train"]["log_lik"] for r in rs]),
                ms([r["noise_std"] for r in rs], 3),
                ms([r["hidden_noise_mean"] for r in rs], 3),
                ms(mc, 3) if mc else "–",
                steps(rs),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
