"""The worst test rows of any Bayesian GPN cell: a diagnosis, never a choice (issue 15).

Refits the cell ``(model, set, split)`` of ``benchmarks/uci.py`` (same data, seed and
configuration) and prints its test log-likelihood (mean and median over rows, original units),
the spread of its predictive standard deviation, and its worst rows: log density, target and
predictive mean (standardised), predictive sd and ``z = (y - mean) / sd``. For a column with a
Gaussian predictive this is where the r^2 / 2 cost of a far row shows (docs/results/uci.md
section 24: boston split 7). Usage::

    PYRO_GPN_UCI_DIR=../shared/datasets OMP_NUM_THREADS=1 python benchmarks/uci_test_rows.py \\
        boston 7 bgpn_long
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.uci import DATA_DIR, bgpn_config, fit_bgpn  # noqa: E402


def worst_test_rows(name: str, split: int, model: str, num_rows: int = 6, seed: int = 0) -> str:
    """The report (module docstring) of one cell, as text."""
    from pyro_gpn.data.uci_regression import load_uci_regression
    from pyro_gpn.losses import gaussian_mixture_log_density

    data = load_uci_regression(name, DATA_DIR, split=split, seed=seed, download=False)
    fit = fit_bgpn(data, bgpn_config(model, name), seed + split)
    mean, var, *weights = fit["predict"](data.x_test)
    weights = weights[0] if weights else mean.new_ones(1)
    k = weights.shape[0]
    mean, var = mean.reshape(k, -1, 1).double(), var.reshape(k, -1, 1).double()
    y = data.y_test.reshape(-1, 1).double()
    w = weights.double()
    log_density = gaussian_mixture_log_density(w, mean, var, y) - math.log(float(data.y_std))
    centre = torch.einsum("k,ksd->sd", w, mean).reshape(-1)
    sd = (torch.einsum("k,ksd->sd", w, var + mean.square()).reshape(-1) - centre.square()).sqrt()
    z = (y.reshape(-1) - centre) / sd
    q = sd.quantile(torch.tensor([0.1, 0.5, 0.9], dtype=sd.dtype))
    lines = [
        f"{model} {name} split {split}: test log-likelihood mean {float(log_density.mean()):.3f}, "
        f"median {float(log_density.median()):.3f}; predictive sd (standardised) 10/50/90 %: "
        + "/".join(f"{float(v):.3f}" for v in q)
    ]
    for i in log_density.argsort()[:num_rows].tolist():
        lines.append(
            f"  row {i}: log density {float(log_density[i]):8.2f}  y {float(y[i]):6.2f}  "
            f"mean {float(centre[i]):6.2f}  sd {float(sd[i]):.3f}  z {float(z[i]):6.2f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("set")
    p.add_argument("split", type=int)
    p.add_argument("models", nargs="+")
    p.add_argument("--rows", type=int, default=6)
    a = p.parse_args(argv)
    for model in a.models:
        print(worst_test_rows(a.set, a.split, model, a.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
