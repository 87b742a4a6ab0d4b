"""The worst test rows of a heteroscedastic Bayesian GPN cell: a diagnosis, never a choice.

Refits the cell ``(model, set, split)`` of ``benchmarks/uci.py`` (same data, seed and
configuration; ``MODEL:FLOOR`` adds ``noise_floor=FLOOR`` to its heteroscedastic head) and
prints its test log-likelihood (mean and median over rows, original units) and its worst rows:
the log density, target and predictive mean (standardised), ``sd(F)``, the noise std
``exp((E[G] + Var[G] / 2) / 2)`` (without a floor), the largest standardised input and the
distance to the nearest training row (against the median over the test rows); and, for each
layer with ``q(W)``, its mean standard deviation against the prior's. docs/results/uci.md
section 13 (wine split 8). Usage::

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/uci_worst_rows.py wine 8 bgpn_het_qw2 \\
        bgpn_het_point bgpn_het_qw2:0.01
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyro  # noqa: E402
import torch  # noqa: E402

from benchmarks.uci import DATA_DIR, bgpn_config, fit_bgpn  # noqa: E402


def worst_rows(name: str, split: int, model: str, num_rows: int = 4, seed: int = 0) -> str:
    """The report (module docstring) of one cell, as text."""
    from pyro_gpn.data.uci_regression import load_uci_regression

    column, _, floor = model.partition(":")
    config = bgpn_config(column, name)
    if config.get("head") != "heteroscedastic":
        raise ValueError(f"model must have the heteroscedastic head (het), got {model!r}")
    if floor:
        config["noise_floor"] = float(floor)
    data = load_uci_regression(name, DATA_DIR, split=split, seed=seed)
    pyro.clear_param_store()
    net = fit_bgpn(data, config, seed + split)["net"]
    with torch.no_grad():
        features = net.hidden(data.x_test)
        mean, var, g_mean, g_var, _ = net.head._moments(features)
        noise_std = (0.5 * (g_mean + g_var / 2)).exp()
        w, comp_mean, comp_var = net.head.predictive_mixture(features)
        y = data.y_test.reshape(1, -1, 1)
        comp = -0.5 * (math.log(2 * math.pi) + comp_var.log() + (y - comp_mean).square() / comp_var)
        ll = torch.logsumexp(comp + w.log().view(-1, 1, 1), 0).squeeze(-1)
        ll = ll - math.log(float(data.y_std))
        largest = data.x_test.abs().max(1).values
        nearest = torch.cdist(data.x_test, data.x_train).min(1).values
    lines = [
        f"{model} {name} split {split}: test ll {float(ll.mean()):.3f}, median "
        f"{float(ll.median()):.3f}"
    ]
    for i in ll.argsort()[:num_rows].tolist():
        lines.append(
            f"  row {i}: ll {float(ll[i]):.1f} y {float(data.y_test[i]):.2f} mean "
            f"{float(mean[i]):.2f} sd(F) {float(var[i].sqrt()):.3f} noise std "
            f"{float(noise_std[i]):.3f} max|x| {float(largest[i]):.1f} nearest "
            f"{float(nearest[i]):.2f} (median {float(nearest.median()):.2f})"
        )
    for l, layer in enumerate(net.layers):
        if layer.variational_weights:
            lines.append(
                f"  layer {l}: q(W) sd {float(layer.weight_scale.detach().mean()):.3f}, prior "
                f"sd {float(layer.weight_prior_std()):.3f}, mean |E[W]| "
                f"{float(layer.weight.detach().abs().mean()):.3f}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("set")
    p.add_argument("split", type=int)
    p.add_argument("models", nargs="+", help="bgpn_het* columns, optionally MODEL:FLOOR")
    p.add_argument("--rows", type=int, default=4)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    for model in a.models:
        print(worst_rows(a.set, a.split, model, a.rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
