"""Count host-device synchronisations per training step (issue 12, item 5).

On a GPU every conversion of a tensor to a Python value (``bool(t)``, ``float(t)``, ``int(t)``,
``t.item()``, ``t.tolist()``) waits for the device. This script patches those methods of
``torch.Tensor`` to count them, runs a few training steps of each route on the CPU and prints the
mean count per step. (Syncs inside ATen, e.g. the error check of ``torch.linalg.cholesky``, are
not seen; the count is of the library's own Python-level syncs.)

    python benchmarks/count_syncs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyro
import torch

# the counter lives with the tests (tests/syncs.py, no pyro_gpn import there): put only that
# directory on the path, so that `import pyro_gpn` still finds the version under test
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from syncs import count_syncs  # noqa: E402


def _data(head: str, n: int = 64):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, 4, generator=gen)
    y = torch.randn(n, 1, generator=gen) if head == "gaussian" else torch.randint(0, 3, (n,))
    return x, y


def trainer_step(head: str, mode: str, steps: int = 8) -> float:
    """Syncs per optimiser step inside :class:`~pyro_gpn.inference.Trainer`'s epoch loop."""
    from pyro_gpn import GPNNet
    from pyro_gpn.inference import TrainConfig, Trainer

    torch.manual_seed(0)
    net = GPNNet([4, 5, 1] if head == "gaussian" else [4, 5, 3], mode=mode, head=head)
    x, y = _data(head)
    trainer = Trainer(net, TrainConfig(batch_size=x.shape[0] // steps, progress=False))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    run = trainer._train_epoch
    with count_syncs() as counter:
        run(optimizer, generator, x, y, 1, 0)
    return counter["n"] / steps


def svi_step(route: str, steps: int = 8) -> float:
    """Syncs per step of :func:`~pyro_gpn.inference.fit_svi` (batch of 16 of 64)."""
    from pyro_gpn.inference import ClosedFormELBO, fit_svi
    from pyro_gpn.models import ParametricGPN, VariationalGPN

    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = _data("gaussian")
    if route == "parametric":
        model = ParametricGPN([4, 5, 1], head="gaussian")
        loss = "trace"
    else:
        model = VariationalGPN([4, 5, 1], head="gaussian", num_data=x.shape[0])
        loss = "trace" if route == "vgpn-trace" else ClosedFormELBO(model)
    fit_svi(
        model.model, model.guide, x, y, loss=loss, num_steps=1, progress=False, batch_size=16
    )  # warm-up: parameters registered
    with count_syncs() as counter:
        fit_svi(
            model.model,
            model.guide,
            x,
            y,
            loss=loss,
            num_steps=steps,
            progress=False,
            batch_size=16,
            clear_param_store=False,
        )
    return counter["n"] / steps


def main() -> None:
    rows = [
        ("Trainer, GPNNet gaussian meanvar", trainer_step("gaussian", "meanvar")),
        ("Trainer, GPNNet softmax meanvar", trainer_step("softmax", "meanvar")),
        ("Trainer, GPNNet softmax cov", trainer_step("softmax", "cov")),
        ("fit_svi, ParametricGPN Trace_ELBO", svi_step("parametric")),
        ("fit_svi, VariationalGPN Trace_ELBO", svi_step("vgpn-trace")),
        ("fit_svi, VariationalGPN ClosedFormELBO", svi_step("vgpn-closed")),
    ]
    print("| route | syncs per step |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value:g} |")


if __name__ == "__main__":
    main()
