"""Print the max |parameter difference| between 2 gloo processes and 1 process after 50 steps.

The same runs as ``tests/inference/test_distributed.py`` (which asserts <= 1e-5), printing the
measured difference for ``docs/results/conv_rnn.md``::

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/ddp_check.py
"""

import tempfile

import torch
import torch.multiprocessing as mp

from pyro_gpn.inference.distributed import DistContext, fit_distributed
from tests.inference.test_distributed import _config, _data, _free_port, _model, _worker

if __name__ == "__main__":
    torch.set_num_threads(1)
    for kind in ("dense", "conv"):
        out = tempfile.mkdtemp() + "/state"
        mp.spawn(_worker, args=(2, _free_port(), kind, out), nprocs=2, join=True)
        model = _model(kind)
        x, y = _data()
        fit_distributed(model, (x, y), (x, y), _config(), DistContext())
        ranks = [torch.load(f"{out}.{r}") for r in range(2)]
        diff = max(
            float((rank["state"][k] - v).abs().max())
            for rank in ranks
            for k, v in model.state_dict().items()
        )
        print(f"{kind}: 50 steps, max abs parameter difference {diff:.3g}", flush=True)
