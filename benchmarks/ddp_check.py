"""Print the max |parameter difference| between 2 gloo processes and 1 process.

The same runs as ``tests/inference/test_distributed.py`` (which asserts <= 1e-5): the unchanged
:class:`~pyro_gpn.inference.Trainer` (52 steps, dense GPN and GPN CNN) and
:func:`~pyro_gpn.inference.fit_svi` with the closed-form ELBO (50 steps), printing the measured
difference for ``docs/results/conv_rnn.md``::

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/ddp_check.py
"""

import tempfile
from pathlib import Path

import torch

from tests.inference.test_distributed import _max_difference, _spawn, _svi_alone, _train

if __name__ == "__main__":
    torch.set_num_threads(1)
    for job in ("dense", "conv", "svi"):
        ranks = _spawn(job, Path(tempfile.mkdtemp()))
        state = (_svi_alone() if job == "svi" else _train(job))[0]
        diff = max(_max_difference(rank[0], state) for rank in ranks)
        kind = "fit_svi, closed-form ELBO" if job == "svi" else f"Trainer, {job}"
        print(f"{kind}: max abs parameter difference 2 processes vs 1: {diff:.3g}", flush=True)
