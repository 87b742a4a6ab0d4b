"""The heteroscedastic Student-t head's ELBO: accuracy and cost of its Gauss-Hermite nodes.

``HeteroscedasticGaussianHead(df=nu)`` takes ``E[-log t_nu(y - F | 0, sqrt(c^2 + e^G))]`` by
Gauss-Hermite quadrature over ``G`` (``pyro_gpn.heads._T_NODES_OVER_G``) and over ``F | G``
(``_T_NODES_GIVEN_G``). ``accuracy``: the largest relative error of that
expectation against a 128 x 48-node reference over 4,000 rows of hard regimes (``sd(G)`` up to
1.5, correlations up to 0.9, ``sd(F)`` up to the noise, targets up to 4 sd away) for several
node counts. ``time``: CPU ms per step of ``fit_vgpn(elbo="closed_form")`` on wine split 0
(``VariationalGPN([11, 50, 2])``, ``q(W)`` in the last layer), Gaussian noise against t noise at
those node counts, side by side in one process, two rounds (docs/results/uci.md section 24).
Usage::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/student_t_cost.py accuracy
    PYRO_GPN_UCI_DIR=../shared/datasets OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 \\
        python benchmarks/student_t_cost.py time
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import pyro_gpn.heads as heads  # noqa: E402


class _Nodes:
    """Set the head's node counts over ``G`` and ``F | G`` for a ``with`` block."""

    def __init__(self, g_nodes: int, f_nodes: int):
        self.counts = (g_nodes, f_nodes)

    def __enter__(self):
        self.saved = (heads._T_NODES_OVER_G, heads._T_NODES_GIVEN_G)
        heads._T_NODES_OVER_G, heads._T_NODES_GIVEN_G = self.counts

    def __exit__(self, *exc):
        heads._T_NODES_OVER_G, heads._T_NODES_GIVEN_G = self.saved


def _expected_nll(features, y, g_nodes: int, f_nodes: int) -> torch.Tensor:
    head = heads.HeteroscedasticGaussianHead(1, df=4.0, num_nodes=g_nodes, dtype=torch.float64)
    with torch.no_grad():
        head.noise_offset.fill_(-3.0)
        head.noise_slope.fill_(1.0)
    with _Nodes(g_nodes, f_nodes), torch.no_grad():
        return head.expected_nll(features, y, reduction="none")


def accuracy(rows: int = 4000, seed: int = 0) -> str:
    from pyro_gpn import Moments

    g = torch.Generator().manual_seed(seed)
    g_std = torch.rand(rows, generator=g) * 1.5 + 0.01
    corr = torch.rand(rows, generator=g) * 1.8 - 0.9
    var_f = (torch.rand(rows, generator=g) ** 2) * 0.05
    cross = corr * (var_f * g_std.square()).sqrt()
    cov = torch.stack(
        [torch.stack([var_f, cross], -1), torch.stack([cross, g_std.square()], -1)], -2
    ).double()
    mean = (torch.randn(rows, 2, generator=g) * 0.5).double()
    y = mean[:, :1] + (torch.randn(rows, 1, generator=g) * torch.rand(rows, 1, generator=g) * 2)
    features = Moments(mean, cov=cov)
    reference = _expected_nll(features, y.double(), 128, 48)
    lines = [
        "| nodes over G | nodes over F given G | largest relative error |",
        "| --- | --- | --- |",
    ]
    for g_nodes, f_nodes in ((64, 20), (16, 20), (64, 48), (32, 48), (24, 48), (16, 48), (8, 48)):
        value = _expected_nll(features, y.double(), g_nodes, f_nodes)
        error = ((value - reference).abs() / reference.abs().clamp_min(1)).max()
        lines.append(f"| {g_nodes} | {f_nodes} | {float(error):.1e} |")
    return "\n".join(lines)


def step_times(steps: int = 150, rounds: int = 2) -> str:
    import pyro

    from benchmarks.uci import DATA_DIR
    from pyro_gpn.data.uci_regression import load_uci_regression
    from pyro_gpn.inference import fit_vgpn
    from pyro_gpn.models import VariationalGPN

    data = load_uci_regression("wine", DATA_DIR, split=0, seed=0, download=False)
    lines = []
    for r in range(rounds):
        for df, g_nodes, f_nodes in ((None, 64, 20), (4.0, 64, 20), (4.0, 16, 20)):
            with _Nodes(g_nodes, f_nodes):
                pyro.clear_param_store()
                torch.manual_seed(0)
                head = heads.HeteroscedasticGaussianHead(1, df=df, num_nodes=g_nodes)
                model = VariationalGPN([11, 50, 1], head=head, weights=("point", "variational"))
                start = time.process_time()
                fit_vgpn(
                    model, data.x_train, data.y_train, num_steps=steps, lr=0.05,
                    val_fraction=0.0, seed=0, elbo="closed_form",
                )  # fmt: skip
                ms = (time.process_time() - start) / steps * 1000
            noise = "gaussian" if df is None else f"t{df:g} ({g_nodes} x {f_nodes} nodes)"
            lines.append(f"round {r}: {noise}: {ms:.1f} ms per step")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("accuracy", "time"))
    a = p.parse_args(argv)
    print(accuracy() if a.what == "accuracy" else step_times())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
