"""What Pyro's parameter machinery costs in a Bayesian GPN training step (issue 15's time per
epoch): the step of ``uci_timing.py`` (``VariationalGPN([D, W, 1])``, the predictive objective,
Adam with foreach, batch 512) with ``PyroModule.__getattr__`` as Pyro has it, against the same
step with a ``PyroParam`` read as the plain constrained transform of its tensor (no
``pyro.param`` effect), in alternating blocks of 40 steps after 300 untimed ones, process-CPU
milliseconds per step::

    PYRO_GPN_UCI_DIR=../shared/datasets OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 \
        python benchmarks/pyro_param_overhead.py boston 50 variational
"""

import os
import statistics
import sys
import time
from pathlib import Path

import pyro
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pyro.nn.module import PyroModule  # noqa: E402
from torch.distributions import transform_to  # noqa: E402

from pyro_gpn.data.uci_regression import load_uci_regression  # noqa: E402
from pyro_gpn.inference.closed_form import predictive_log_likelihood  # noqa: E402
from pyro_gpn.models import VariationalGPN  # noqa: E402

torch.set_num_threads(1)
pyro.settings.set(module_local_params=True)
name = sys.argv[1]
width = int(sys.argv[2])
weights = sys.argv[3]
data = load_uci_regression(
    name, os.environ.get("PYRO_GPN_UCI_DIR", "../shared/datasets"), split=0, download=False
)
x, y = data.x_train, data.y_train
n = x.shape[0]
batch = min(512, n)
torch.manual_seed(0)
m = VariationalGPN([data.num_features, width, 1], weights=weights, num_data=n)
opt = torch.optim.Adam(m.parameters(), lr=0.05, foreach=True)


def step():
    idx = torch.randperm(n)[:batch]
    loss = -predictive_log_likelihood(m, x[idx], y[idx]) / n
    opt.zero_grad()
    loss.backward()
    opt.step()


orig = PyroModule.__getattr__


def fast(self, name):
    d = self.__dict__
    pp = d.get("_pyro_params")
    if pp is not None and name in pp:
        constraint, _ = pp[name]
        u = self._parameters[name + "_unconstrained"]
        return transform_to(constraint)(u)
    return orig(self, name)


for _ in range(300):
    step()
res = {"orig": [], "fast": []}
for _ in range(7):
    for k in res:
        PyroModule.__getattr__ = orig if k == "orig" else fast
        t = time.process_time()
        for _ in range(40):
            step()
        res[k].append((time.process_time() - t) / 40 * 1e3)
PyroModule.__getattr__ = orig
for k, v in res.items():
    print(k, f"ms/step median {statistics.median(v):.3f}", [f"{a:.2f}" for a in v])
