"""Variants of the Bayesian GPN's schedule and model, scored on validation rows only (issue 15).

Each variant changes the benchmark's Bayesian GPN (``VariationalGPN([D, 50, 1])``, 100 units on
protein, with the recommendations, ``pyro_gpn.recommended.VGPN``, fitted by ``fit_vgpn``) in one
respect: the step budget, the learning rate, the initial noise, point weights (everywhere, or
``q(W)`` in the first layer only: ``qw1``, in the last only: ``qw2``), the prior scale of ``W``
or its empirical-Bayes value (``eb``), the head (``hetero``: input-dependent noise; ``flNN``:
its noise std floored at ``0.NN``; ``t4``: Student-t noise with 4 degrees of freedom) or the
capacity (``deep``: two hidden GPN layers, ``wide``: one of twice the width). It is fitted
on the training rows of a split and scored on its validation rows only (the 10 % of the
training split that ``load_uci_regression`` holds out, the benchmark's validation set): best
validation log-likelihood (the restored state's, original units), its step, the learned noise,
the validation curve, process CPU time. Test rows are never touched. One JSON line per
(variant, split) into ``--out``; finished lines are skipped.

First written for naval (the large-set schedule, ``s1000``: 1000 steps of 512 from lr 0.05, left
the learned output noise at 0.57-0.86 standardised units and the test log-likelihood at
3.21 +- 0.29); ``--set`` runs any set, where ``default`` is the recommendation itself. Usage::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/uci_variants.py --splits 0 \\
        --out docs/results/uci_runs/naval_budget.jsonl
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/uci_variants.py --set boston \\
        --splits 0 1 2 --variants default eb
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.uci import (  # noqa: E402
    DATA_DIR,
    bgpn_sizes,
    noise_std_of,
    quantisation_noise_std,
)
from benchmarks.uci_demo_budget import resumable_grid  # noqa: E402

#: variants: name -> (fit_vgpn keywords, model keywords); ``s1000`` is the benchmark's schedule
VARIANTS: dict[str, tuple[dict, dict]] = {
    "s1000": ({"lr": 0.05, "num_steps": 1000}, {}),
    "lr10_s1000": ({"lr": 0.1, "num_steps": 1000}, {}),
    "lr01_s1000": ({"lr": 0.01, "lr_decay": 1.0, "num_steps": 1000}, {}),
    "noise001_s1000": ({"lr": 0.05, "num_steps": 1000}, {"noise_std_init": 0.01}),
    "point_s1000": ({"lr": 0.05, "num_steps": 1000}, {"weights": "point"}),
    "s3000": ({"lr": 0.05, "num_steps": 3000}, {}),
    "lr10_s3000": ({"lr": 0.1, "num_steps": 3000}, {}),
    "s5000": ({"lr": 0.05, "num_steps": 5000}, {}),
    "s10000": ({"lr": 0.05, "num_steps": 10000}, {}),
    "point_s3000": ({"lr": 0.05, "num_steps": 3000}, {"weights": "point"}),
    "b2048_s3000": ({"lr": 0.05, "num_steps": 3000, "batch_size": 2048}, {}),
    "lr02_s3000": ({"lr": 0.02, "num_steps": 3000}, {}),
    "lr02_s6000": ({"lr": 0.02, "num_steps": 6000}, {}),
    "lr01c_s3000": ({"lr": 0.01, "lr_decay": 1.0, "num_steps": 3000}, {}),
    # the small sets' schedule (the recommendation, VGPN) and one change each (--set boston)
    "default": ({}, {}),
    "lr02": ({"lr": 0.02}, {}),
    "lr02_s4000": ({"lr": 0.02, "num_steps": 4000}, {}),
    "prior05": ({}, {"weight_prior_scale": 0.5}),
    "prior2": ({}, {"weight_prior_scale": 2.0}),
    # the empirical-Bayes prior variance of W (VariationalGPNLayer's weight_prior_scale)
    "eb": ({}, {"weight_prior_scale": "empirical"}),
    # input-dependent noise (pyro_gpn.heads.HeteroscedasticGaussianHead: layers D -> 50 -> 2)
    "hetero": ({}, {"head": "heteroscedastic"}),
    "hetero_s1000": ({"lr": 0.05, "num_steps": 1000}, {"head": "heteroscedastic"}),
    "hetero_lr02_s6000": ({"lr": 0.02, "num_steps": 6000}, {"head": "heteroscedastic"}),
    # capacity (``hidden``: hidden GPN layers in units of the set's width, 50 / protein 100;
    # ``benchmarks.uci.bgpn_sizes``): two hidden layers [D, 50, 50, 1], or one twice as wide
    # [D, 100, 1]; the small sets' schedule, boston's chosen lr 0.02, the large sets' s1000
    "deep": ({}, {"hidden": (1, 1)}),
    "wide": ({}, {"hidden": (2,)}),
    "hetero_deep": ({}, {"hidden": (1, 1), "head": "heteroscedastic"}),
    "deep_lr02": ({"lr": 0.02}, {"hidden": (1, 1)}),
    "wide_lr02": ({"lr": 0.02}, {"hidden": (2,)}),
    "deep_s1000": ({"lr": 0.05, "num_steps": 1000}, {"hidden": (1, 1)}),
    "wide_s1000": ({"lr": 0.05, "num_steps": 1000}, {"hidden": (2,)}),
    "deep_s3000": ({"lr": 0.05, "num_steps": 3000}, {"hidden": (1, 1)}),
    # session 2026-11-25: the two-layer net with point weights (its q(W) runs ended
    # noise-dominated, uci.md section 7) and the chosen wide net on a longer budget (kin8nm)
    "deep_point_pll_s3000": (
        {"lr": 0.05, "num_steps": 3000, "elbo": "predictive"},
        {"hidden": (1, 1), "weights": "point"},
    ),
    "wide_point_pll_s3000": (
        {"lr": 0.05, "num_steps": 3000, "elbo": "predictive"},
        {"hidden": (2,), "weights": "point"},
    ),
    # the predictive log-likelihood objective instead of the ELBO (fit_vgpn(elbo="predictive"),
    # PPGPR; docs/results/uci.md section 10), with either head
    "pll": ({"elbo": "predictive"}, {}),
    "hetero_pll": ({"elbo": "predictive"}, {"head": "heteroscedastic"}),
    "lr02_pll": ({"lr": 0.02, "elbo": "predictive"}, {}),
    "pll_s1000": ({"lr": 0.05, "num_steps": 1000, "elbo": "predictive"}, {}),
    "hetero_pll_s1000": (
        {"lr": 0.05, "num_steps": 1000, "elbo": "predictive"},
        {"head": "heteroscedastic"},
    ),
    "wide_pll_s1000": ({"lr": 0.05, "num_steps": 1000, "elbo": "predictive"}, {"hidden": (2,)}),
    "pll_s3000": ({"lr": 0.05, "num_steps": 3000, "elbo": "predictive"}, {}),
    "pll_lr02_s6000": ({"lr": 0.02, "num_steps": 6000, "elbo": "predictive"}, {}),
    # naval's schedule (bgpn_long) with a patience of 40 evaluations (1000 steps) instead of 12:
    # on some splits the fit stopped at its first plateau, noise-dominated (uci.md section 14)
    "lr02_s6000_p40": ({"lr": 0.02, "num_steps": 6000, "patience": 40}, {}),
    # naval's schedule with the noise held for the first N steps (fit_vgpn's noise_warmup)
    "lr02_s6000_p40_nw250": (
        {"lr": 0.02, "num_steps": 6000, "patience": 40, "noise_warmup": 250},
        {},
    ),
    "qw2_lr02_s6000_p40": (
        {"lr": 0.02, "num_steps": 6000, "patience": 40},
        {"weights": ("point", "variational")},
    ),
    "qw2_lr02_s6000_p40_nw500": (
        {"lr": 0.02, "num_steps": 6000, "patience": 40, "noise_warmup": 500},
        {"weights": ("point", "variational")},
    ),
    "lr02_s6000_p40_nw1500": (
        {"lr": 0.02, "num_steps": 6000, "patience": 40, "noise_warmup": 1500},
        {},
    ),
    # the warm-up on the other contested sets' chosen columns
    "lr02_nw500": ({"lr": 0.02, "noise_warmup": 500}, {}),
    "hetero_qw2_s4000_nw500": (
        {"num_steps": 4000, "noise_warmup": 500},
        {"head": "heteroscedastic", "weights": ("point", "variational")},
    ),
    "wide_point_pll_s2000_nw500": (
        {"lr": 0.05, "num_steps": 2000, "elbo": "predictive", "noise_warmup": 500},
        {"hidden": (2,), "weights": "point"},
    ),
    "pll_lr02_s6000_p40_nw500": (
        {"lr": 0.02, "num_steps": 6000, "patience": 40, "noise_warmup": 500, "elbo": "predictive"},
        {},
    ),
    "lr02_s6000_p40_nw500": (
        {"lr": 0.02, "num_steps": 6000, "patience": 40, "noise_warmup": 500},
        {},
    ),
    # session 2026-11-24 (evening): point weights (the first layer's q(W) sat on its prior,
    # section 10), a slower rate on wine, longer or wider fits on kin8nm and protein
    "point": ({}, {"weights": "point"}),
    "point_pll": ({"elbo": "predictive"}, {"weights": "point"}),
    "point_lr02": ({"lr": 0.02}, {"weights": "point"}),
    "hetero_lr02": ({"lr": 0.02}, {"head": "heteroscedastic"}),
    "hetero_point": ({}, {"head": "heteroscedastic", "weights": "point"}),
    "hetero_point_pll": ({"elbo": "predictive"}, {"head": "heteroscedastic", "weights": "point"}),
    "hetero_point_lr02": ({"lr": 0.02}, {"head": "heteroscedastic", "weights": "point"}),
    # yacht's chosen network with kin8nm's smaller step (section 22)
    "hetero_point_pll_lr02_s4000_p40": (
        {"elbo": "predictive", "lr": 0.02, "num_steps": 4000, "patience": 40},
        {"head": "heteroscedastic", "weights": "point"},
    ),
    "wide_pll_s2000": ({"lr": 0.05, "num_steps": 2000, "elbo": "predictive"}, {"hidden": (2,)}),
    "wide_pll_s3000": ({"lr": 0.05, "num_steps": 3000, "elbo": "predictive"}, {"hidden": (2,)}),
    "deep_pll_s3000": ({"lr": 0.05, "num_steps": 3000, "elbo": "predictive"}, {"hidden": (1, 1)}),
    "wide_point_pll_s2000": (
        {"lr": 0.05, "num_steps": 2000, "elbo": "predictive"},
        {"hidden": (2,), "weights": "point"},
    ),
    "hetero_point_pll_s1000": (
        {"lr": 0.05, "num_steps": 1000, "elbo": "predictive"},
        {"head": "heteroscedastic", "weights": "point"},
    ),
    # session 2026-11-25: a guard against point weights' overconfidence (uci.md section 13):
    # q(W) in the first layer only, point weights above it (VariationalGPN's per-layer weights)
    "hetero_qw1": ({}, {"head": "heteroscedastic", "weights": ("variational", "point")}),
    "hetero_qw1_pll": (
        {"elbo": "predictive"},
        {"head": "heteroscedastic", "weights": ("variational", "point")},
    ),
    # ... or q(W) in the last layer only (the hidden units' mixing), point weights below it
    "hetero_qw2": ({}, {"head": "heteroscedastic", "weights": ("point", "variational")}),
    "hetero_qw2_pll": (
        {"elbo": "predictive"},
        {"head": "heteroscedastic", "weights": ("point", "variational")},
    ),
    # energy's chosen network with kin8nm's smaller step (section 22)
    "hetero_qw2_pll_lr02_s4000_p40": (
        {"elbo": "predictive", "lr": 0.02, "num_steps": 4000, "patience": 40},
        {"head": "heteroscedastic", "weights": ("point", "variational")},
    ),
    "hetero_qw2_pll_s1000": (
        {"lr": 0.05, "num_steps": 1000, "elbo": "predictive"},
        {"head": "heteroscedastic", "weights": ("point", "variational")},
    ),
    # power's fits were still improving at step 1000 (uci.md section 15); kin8nm's chosen wide
    # net with q(W) in its last layer
    "hetero_point_pll_s3000": (
        {"lr": 0.05, "num_steps": 3000, "elbo": "predictive"},
        {"head": "heteroscedastic", "weights": "point"},
    ),
    "hetero_qw2_pll_s3000": (
        {"lr": 0.05, "num_steps": 3000, "elbo": "predictive"},
        {"head": "heteroscedastic", "weights": ("point", "variational")},
    ),
    # concrete's qw2 fits ran to or near their 2000-step budget (section 15)
    "hetero_qw2_s4000": (
        {"num_steps": 4000},
        {"head": "heteroscedastic", "weights": ("point", "variational")},
    ),
    # concrete's chosen network with kin8nm's smaller step (section 22)
    "hetero_qw2_lr02_s8000_p40": (
        {"lr": 0.02, "num_steps": 8000, "patience": 40},
        {"head": "heteroscedastic", "weights": ("point", "variational")},
    ),
    "hetero_qw2_lr10_s4000": (
        {"lr": 0.1, "num_steps": 4000},
        {"head": "heteroscedastic", "weights": ("point", "variational")},
    ),
    "hetero_qw2_lr02_s4000_p40": (
        {"lr": 0.02, "num_steps": 4000, "patience": 40},
        {"head": "heteroscedastic", "weights": ("point", "variational")},
    ),
    "hetero_qw2_p40": (
        {"patience": 40},
        {"head": "heteroscedastic", "weights": ("point", "variational")},
    ),
    # kin8nm's wide point-weight fits stopped on their patience before 3000 steps (section 15)
    "wide_point_pll_s3000_p40": (
        {"lr": 0.05, "num_steps": 3000, "elbo": "predictive", "patience": 40},
        {"hidden": (2,), "weights": "point"},
    ),
    # protein's chosen wide_pll_s3000 stopped at 1700-2650 steps on patience 12 (section 16)
    "wide_pll_s3000_p40": (
        {"lr": 0.05, "num_steps": 3000, "elbo": "predictive", "patience": 40},
        {"hidden": (2,)},
    ),
    "wide_pll_s6000_p40": (
        {"lr": 0.05, "num_steps": 6000, "elbo": "predictive", "patience": 40},
        {"hidden": (2,)},
    ),
    # kin8nm's single fits spread widely over model seeds (the five networks of the ens5 cells:
    # validation 0.91-1.30 on split 0); a smaller and a larger learning rate (section 22)
    "wide_point_pll_lr10_s2000": (
        {"lr": 0.1, "num_steps": 2000, "elbo": "predictive"},
        {"hidden": (2,), "weights": "point"},
    ),
    "wide_point_pll_lr02_s4000_p40": (
        {"lr": 0.02, "num_steps": 4000, "elbo": "predictive", "patience": 40},
        {"hidden": (2,), "weights": "point"},
    ),
    # protein's chosen network with kin8nm's smaller step (section 22)
    "wide_pll_lr02_s8000_p40": (
        {"lr": 0.02, "num_steps": 8000, "elbo": "predictive", "patience": 40},
        {"hidden": (2,)},
    ),
    "wide_qw2_pll_s3000": (
        {"lr": 0.05, "num_steps": 3000, "elbo": "predictive"},
        {"hidden": (2,), "weights": ("point", "variational")},
    ),
    "wide_qw2_pll_s2000": (
        {"lr": 0.05, "num_steps": 2000, "elbo": "predictive"},
        {"hidden": (2,), "weights": ("point", "variational")},
    ),
    # ... and a floor under the heteroscedastic head's noise (HeteroscedasticGaussianHead's
    # noise_floor, standardised units: the noise std never falls below it)
    "hetero_point_fl05": ({}, {"head": "heteroscedastic", "weights": "point", "noise_floor": 0.05}),
    "hetero_point_fl10": ({}, {"head": "heteroscedastic", "weights": "point", "noise_floor": 0.1}),
    "hetero_point_pll_fl01": (
        {"elbo": "predictive"},
        {"head": "heteroscedastic", "weights": "point", "noise_floor": 0.01},
    ),
    # q(W) in the last layer with a floor (wine's discrete targets: the noise collapsed to 0.003)
    "hetero_qw2_fl01": (
        {},
        {"head": "heteroscedastic", "weights": ("point", "variational"), "noise_floor": 0.01},
    ),
    "hetero_qw2_fl05": (
        {},
        {"head": "heteroscedastic", "weights": ("point", "variational"), "noise_floor": 0.05},
    ),
    # session 2026-11-25 (morning): a floor at the targets' quantisation, Delta / sqrt(12) (the
    # variance of rounding to a grid of step Delta, Sheppard's correction; benchmarks.uci's
    # quantisation_noise_std), and q(W) in the last layer with the homoscedastic head (wine)
    "hetero_qw2_flq": (
        {},
        {
            "head": "heteroscedastic",
            "weights": ("point", "variational"),
            "noise_floor": "quantisation",
        },
    ),
    "qw2": ({}, {"weights": ("point", "variational")}),
    # session 2026-11-28: Student-t noise (pyro_gpn.heads.StudentTHead, nu = 4): boston's and
    # concrete's worst test rows are targets 6-12 noise scales from the mean (boston's censored
    # prices of 50), which a Gaussian prices at r^2 / 2 nats
    "lr02_t4": ({"lr": 0.02}, {"head": "student_t", "df": 4.0}),
    "lr02_t4_pll": ({"lr": 0.02, "elbo": "predictive"}, {"head": "student_t", "df": 4.0}),
    "qw2_t4_s4000": (
        {"num_steps": 4000},
        {"head": "student_t", "df": 4.0, "weights": ("point", "variational")},
    ),
    "qw2_t4_s4000_pll": (
        {"num_steps": 4000, "elbo": "predictive"},
        {"head": "student_t", "df": 4.0, "weights": ("point", "variational")},
    ),
    # the heteroscedastic head with Student-t noise (HeteroscedasticGaussianHead(df=4))
    "hetero_qw2_t4": (
        {},
        {"head": "heteroscedastic", "df": 4.0, "weights": ("point", "variational")},
    ),
    "hetero_qw2_t4_s4000": (
        {"num_steps": 4000},
        {"head": "heteroscedastic", "df": 4.0, "weights": ("point", "variational")},
    ),
    "qw2_t4": ({}, {"head": "student_t", "df": 4.0, "weights": ("point", "variational")}),
    "hetero_deep_s1000": (
        {"lr": 0.05, "num_steps": 1000},
        {"hidden": (1, 1), "head": "heteroscedastic"},
    ),
}


def run(
    variant: str, split: int, seed: int = 0, name: str = "naval", model_seed_offset: int = 0
) -> dict:
    """Fit ``variant`` on split ``split`` of set ``name`` and score it on the validation rows
    (module docstring). ``seed`` seeds the validation hold-out, the model (``seed + split``)
    and the mini-batches; ``model_seed_offset`` moves the model's seed alone (its
    initialisation), holding the data and the mini-batch draws
    (``benchmarks/uci_seed_spread.py``)."""
    from pyro_gpn.data.uci_regression import load_uci_regression
    from pyro_gpn.heads import GaussianHead, HeteroscedasticGaussianHead, StudentTHead
    from pyro_gpn.inference import fit_vgpn
    from pyro_gpn.models import VariationalGPN
    from pyro_gpn.recommended import VGPN

    fit_kw, model_kw = dict(VARIANTS[variant][0]), dict(VARIANTS[variant][1])
    fit_kw.setdefault("elbo", "closed_form")  # the objective every variant before "pll" used
    data = load_uci_regression(name, DATA_DIR, split=split, seed=seed)
    torch.manual_seed(seed + split + model_seed_offset)  # the benchmark's model seed
    noise_init = model_kw.pop("noise_std_init", 0.1)
    floor = model_kw.pop("noise_floor", 0.0)
    if floor == "quantisation":
        floor = quantisation_noise_std(data.y_train)
    kind, df = model_kw.pop("head", "gaussian"), model_kw.pop("df", None)
    if kind == "heteroscedastic":
        head = HeteroscedasticGaussianHead(1, noise_init, noise_floor=floor, df=df)
    elif kind == "student_t":
        head = StudentTHead(1, df=df, noise_scale_init=noise_init)
    else:
        head = GaussianHead(1, noise_init)
    sizes = bgpn_sizes(name, data.num_features, model_kw.pop("hidden", (1,)))
    model = VariationalGPN(sizes, head=head, **model_kw)
    c0, t0 = time.process_time(), time.perf_counter()
    fit = fit_vgpn(
        model,
        data.x_train,
        data.y_train,
        data.x_val,
        data.y_val,
        batch_size=fit_kw.pop("batch_size", VGPN.batch_for(data.x_train.shape[0])),
        eval_every=VGPN.eval_every,
        patience=fit_kw.pop("patience", VGPN.patience),
        seed=seed + split,
        **fit_kw,
    )
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    shift = math.log(float(data.y_std))
    return {
        "variant": variant,
        "set": name,
        "split": split,
        **({"model_seed_offset": model_seed_offset} if model_seed_offset else {}),
        **VARIANTS[variant][0],
        **VARIANTS[variant][1],
        "sizes": sizes,
        "val_log_lik": fit.best_val_log_lik - shift,
        "best_step": fit.best_step,
        "steps": fit.num_steps,
        "stopped_early": fit.stopped_early,
        "noise_std": noise_std_of(model.head),
        "curve": [(s, round(v - shift, 4)) for s, v in fit.curve[::4]],
        "cpu_s": cpu,
        "wall_s": wall,
        "load_avg_1m_end": os.getloadavg()[0],
    }


def compare(pairs: list[str], runs: Path = ROOT / "docs/results/uci_runs") -> str:
    """Markdown: for each ``SET:A:B``, variant ``B`` against variant ``A`` on the validation rows
    of the splits both ran (``<SET>_budget.jsonl``): mean validation log-likelihoods, their
    paired difference ``B - A`` with its standard error and the splits ``B`` won, the learned
    noise and the best steps."""
    lines = [
        "| set | A | B | splits | A | B | B - A (splits won) | noise std, A ; B "
        "| best step, A ; B |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for pair in pairs:
        name, a, b = pair.split(":")
        rows: dict[str, dict[int, dict]] = {}
        for line in (runs / f"{name}_budget.jsonl").read_text().splitlines():
            row = json.loads(line)
            rows.setdefault(row["variant"], {})[row["split"]] = row
        splits = sorted(set(rows.get(a, {})) & set(rows.get(b, {})))
        if not splits:
            lines.append(f"| {name} | `{a}` | `{b}` | – | | | not run | | |")
            continue
        va = [rows[a][i]["val_log_lik"] for i in splits]
        vb = [rows[b][i]["val_log_lik"] for i in splits]
        diff = [y - x for x, y in zip(va, vb, strict=True)]
        mean = sum(diff) / len(diff)
        se = statistics.stdev(diff) / math.sqrt(len(diff)) if len(diff) > 1 else float("nan")

        def facts(v, key, fmt, rows=rows, splits=splits):
            return "/".join(format(rows[v][i][key], fmt) for i in splits)

        lines.append(
            f"| {name} | `{a}` | `{b}` | {','.join(map(str, splits))} | "
            f"{sum(va) / len(va):.3f} | {sum(vb) / len(vb):.3f} | {mean:+.3f} ± {se:.3f} "
            f"({sum(d > 0 for d in diff)}/{len(diff)}) | {facts(a, 'noise_std', '.3f')} ; "
            f"{facts(b, 'noise_std', '.3f')} | {facts(a, 'best_step', 'd')} ; "
            f"{facts(b, 'best_step', 'd')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--splits", nargs="+", type=int, default=[0])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--set", default="naval", help="the UCI set (its validation rows only)")
    p.add_argument("--out", default=None, help="default: uci_runs/SET_budget.jsonl")
    p.add_argument(
        "--compare",
        nargs="+",
        metavar="SET:A:B",
        help="print variant B against variant A on the recorded validation rows and exit",
    )
    a = p.parse_args(argv)
    if a.compare:
        print(compare(a.compare))
        return 0
    torch.set_num_threads(1)
    out = Path(a.out or ROOT / f"docs/results/uci_runs/{a.set}_budget.jsonl")
    resumable_grid(out, "variant", a.variants, a.splits, functools.partial(run, name=a.set))
    return 0


if __name__ == "__main__":
    sys.exit(main())
