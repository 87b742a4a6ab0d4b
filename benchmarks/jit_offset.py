"""The JIT-traced NUTS potential against the eager one (``docs/results/nuts.md``, "The traced
potential's constant offset"): their difference and largest gradient difference at the traced
point and at three points away from it, for ``NonParametricGPN([1, 1])`` and ``[1, 2, 1]``
(float64 models) on ``sine_data(9, 2)``, with torch's default dtype float32 (the default) and
float64::

    python benchmarks/jit_offset.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from pyro.infer.mcmc.util import initialize_model  # noqa: E402
from pyro.ops.integrator import potential_grad  # noqa: E402

from pyro_gpn.models import NonParametricGPN  # noqa: E402
from tests.inference.test_mcmc import sine_data  # noqa: E402


def offsets(sizes: list[int]) -> list[tuple[float, float]]:
    """``(jit - eager potential, max |gradient difference|)`` at the traced point, then at
    three points moved by standard normal draws (the test's)."""
    x, y, _ = sine_data(9, 2)
    model = NonParametricGPN(sizes)
    (init, jitted), (_, eager) = (
        initialize_model(model.model, (x, y, None), jit_compile=jit, skip_jit_warnings=True)[:2]
        for jit in (True, False)
    )
    g = torch.Generator().manual_seed(3)
    points = [init] + [
        {k: v + torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in init.items()}
        for _ in range(3)
    ]
    rows = []
    for point in points:
        (grad_j, value_j), (grad_e, value_e) = (potential_grad(f, point) for f in (jitted, eager))
        grad_diff = max(float((grad_j[k] - grad_e[k]).abs().max()) for k in grad_e)
        rows.append((float(value_j - value_e), grad_diff))
    return rows


def main() -> None:
    for default in (torch.float32, torch.float64):
        torch.set_default_dtype(default)
        for sizes in ([1, 1], [1, 2, 1]):
            for k, (value, grad) in enumerate(offsets(sizes)):
                where = "traced point" if k == 0 else f"point {k}"
                print(
                    f"default {default}, {sizes}, {where}: potential {value:+.3e}, grad {grad:.1e}"
                )
    torch.set_default_dtype(torch.float32)


if __name__ == "__main__":
    main()
