"""``benchmarks/deterministic_rows.py``: its inputs (deterministic activations, runs of equal
rows) and one forward and backward step."""

import pytest
import torch

from pyro_gpn.moments.backend import numba_available

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba is not installed")


def test_inputs_have_the_asked_runs_and_a_step_gives_every_gradient():
    from benchmarks.deterministic_rows import inputs, step
    from pyro_gpn.moments.cpu_kernels import cpu_response_meanvar

    distinct = inputs(64, 3, 0.0)
    assert (distinct[1] == 0).all()  # deterministic activations
    assert float((distinct[0][1:] == distinct[0][:-1]).double().mean()) == 0.0
    runs = inputs(256, 3, 1.0)
    # every block of 16 rows one activation per unit: 15 of 16 rows equal their predecessor
    assert float((runs[0][1:] == runs[0][:-1]).double().mean()) == pytest.approx(
        15 * 16 / 255, abs=1e-12
    )
    proj = [torch.ones(64, 3, dtype=torch.float64)] * 2
    out = step(cpu_response_meanvar, distinct, proj)
    assert len(out) == 6 and all(t is not None and torch.isfinite(t).all() for t in out)
