"""Time per epoch of the closed-form variational GPN (the Bayesian GPN of a UCI fit) now and at
an older revision, side by side in one process (issue 13: "a UCI variational fit at least 5x
faster than today", time per epoch, same settings).

Variants, each a training step (negative closed-form ELBO per row, backward, Adam) of a
``[D, 50, 1]`` network on the training rows of split 0 of a UCI set, full batch or
mini-batches of ``--batch``:

* ``point`` -- ``VariationalGPN([D, 50, 1], whiten=True, targets_init="identity",
  weights="point")``: the configuration that both revisions can build (the older one had
  point-estimated weights only);
* ``point@REV`` -- the same network (point weights; a revision without the option had only
  them) built by the package at git revision ``REV`` (extracted
  by ``benchmarks/layer_speed.py``'s ``load_baseline``, imported as ``pyro_gpn_base``);
* ``default`` -- ``VariationalGPN([D, 50, 1])`` at today's recommended defaults (variational
  weights), and ``default@REV`` the same at ``REV``;
* ``tanh`` -- the tanh MLP ``[D, 50, 1]`` of the same width (squared error).

``--letter`` times the paper's Letter network instead (issue 13: "a Letter GPN grid run at
least 5x faster"): ``GPNNet([16, 30, 15, 26])`` (meanvar, softmax head, identity start: the grid's
``gpn-meanvar identity`` rows; loss and target-variance penalty, Adam 1e-3) now (``gpn``) and
at ``REV`` (``gpn@REV``), against ``tanh`` (the same sizes, cross-entropy), on a batch of 128
(the grid's) of Letter-shaped random inputs; "per epoch" is then per step.

Every variant's Adam runs with ``foreach=True``, as ``fit_vgpn`` and ``Trainer`` do (since
2026-11-28; the figures in ``docs/results/layer_speed.md`` before that used the loop form).
``--objective predictive`` trains on the library's default objective
(:func:`~pyro_gpn.inference.predictive_log_likelihood`) instead of the closed-form ELBO, ``--lr``
sets Adam's rate (``pyro_gpn.recommended.VGPN.lr`` is 0.05).

Variants run in alternating blocks of ``--block`` steps, ``--repeats`` times, one thread; the
report gives the median process-CPU and wall seconds per epoch and their ratios. A network's
step depends on its state (rows whose activations are narrow against the lengthscale take the
Gauss-Hermite path of the row kernels, more of them as a fit goes on): ``--warm N`` first trains
every variant for ``N`` untimed steps of its own fit (the same settings, data and mini-batches),
so that the timing sees the states a fit spends its steps in::

    OMP_NUM_THREADS=1 python benchmarks/vgpn_step.py --sets boston kin8nm --baseline 813ddd5
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyro  # noqa: E402
import torch  # noqa: E402

from benchmarks.layer_speed import load_baseline  # noqa: E402
from benchmarks.uci import DATA_DIR  # noqa: E402
from pyro_gpn.data.uci_regression import load_uci_regression  # noqa: E402
from pyro_gpn.inference import closed_form  # noqa: E402
from pyro_gpn.models import VariationalGPN  # noqa: E402


def steps_of(
    name: str,
    batch: int,
    baseline: str | None,
    objective: str = "closed_form",
    lr: float = 1e-2,
) -> tuple[dict, int]:
    """The variants' step functions on set ``name`` and the steps per epoch."""
    data = load_uci_regression(name, DATA_DIR, split=0, download=False)
    x, y = data.x_train, data.y_train
    n, d = x.shape
    batch = n if batch <= 0 else min(batch, n)
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randperm(n, generator=generator)[:batch] for _ in range(64)]
    options = {"whiten": True, "targets_init": "identity", "num_data": n}
    elbo_name = "predictive_log_likelihood" if objective == "predictive" else "closed_form_elbo"
    elbo = getattr(closed_form, elbo_name)

    def seeded(build):
        # every network from the same seed: a revision's network starts where today's does
        # (a step's cost depends on the state a fit reaches)
        torch.manual_seed(0)
        return build()

    models = {
        "point": (seeded(lambda: VariationalGPN([d, 50, 1], weights="point", **options)), elbo),
        "default": (seeded(lambda: VariationalGPN([d, 50, 1], num_data=n)), elbo),
    }
    if baseline:
        base = load_baseline(baseline)
        import pyro_gpn_base.inference.closed_form as base_closed_form

        base_elbo = getattr(base_closed_form, elbo_name)
        try:  # point weights where the revision has the option (it had no other before)
            base_point = seeded(
                lambda: base.models.VariationalGPN([d, 50, 1], weights="point", **options)
            )
        except TypeError:
            base_point = seeded(lambda: base.models.VariationalGPN([d, 50, 1], **options))
        models[f"point@{baseline}"] = (base_point, base_elbo)
        models[f"default@{baseline}"] = (
            seeded(lambda: base.models.VariationalGPN([d, 50, 1], num_data=n)),
            base_elbo,
        )
    steps = {}
    for key, (model, elbo) in models.items():
        opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)

        def step(i, model=model, elbo=elbo, opt=opt):
            idx = batches[i % len(batches)]
            loss = -elbo(model, x[idx], y[idx]) / n
            opt.zero_grad()
            loss.backward()
            opt.step()

        steps[key] = step
    mlp = torch.nn.Sequential(torch.nn.Linear(d, 50), torch.nn.Tanh(), torch.nn.Linear(50, 1))
    mlp_opt = torch.optim.Adam(mlp.parameters(), lr=1e-2)

    def tanh_step(i):
        idx = batches[i % len(batches)]
        loss = (mlp(x[idx]) - y[idx]).square().mean()
        mlp_opt.zero_grad()
        loss.backward()
        mlp_opt.step()

    steps["tanh"] = tanh_step
    return steps, math.ceil(n / batch)


def letter_steps(baseline: str | None) -> tuple[dict, int]:
    """The Letter network's step functions (module docstring) and 1 step per "epoch"."""
    from pyro_gpn import GPNNet

    torch.manual_seed(0)
    x, y = torch.randn(128, 16), torch.randint(0, 26, (128,))
    nets = {"gpn": GPNNet([16, 30, 15, 26], targets_init="identity")}
    if baseline:
        base = load_baseline(baseline)
        nets[f"gpn@{baseline}"] = base.GPNNet([16, 30, 15, 26], targets_init="identity")
    steps = {}
    for key, net in nets.items():
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)

        def step(i, net=net, opt=opt):
            loss = net.loss(x, y) + net.penalty()
            opt.zero_grad()
            loss.backward()
            opt.step()

        steps[key] = step
    tanh = torch.nn.Sequential(
        torch.nn.Linear(16, 30), torch.nn.Tanh(), torch.nn.Linear(30, 15), torch.nn.Tanh()
    )
    tanh.append(torch.nn.Linear(15, 26))
    tanh_opt = torch.optim.Adam(tanh.parameters(), lr=1e-3)

    def tanh_step(i):
        loss = torch.nn.functional.cross_entropy(tanh(x), y)
        tanh_opt.zero_grad()
        loss.backward()
        tanh_opt.step()

    steps["tanh"] = tanh_step
    return steps, 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["boston", "kin8nm"])
    parser.add_argument("--batch", type=int, default=512, help="mini-batch (0: full batch)")
    parser.add_argument("--baseline", default=None, help="also time the package at this rev")
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--letter", action="store_true", help="the Letter network instead")
    parser.add_argument(
        "--warm", type=int, default=0, help="untimed training steps of every variant first"
    )
    parser.add_argument(
        "--profile", default=None, help="profile 10 steps of this variant (torch.profiler)"
    )
    parser.add_argument("--objective", default="closed_form", choices=["closed_form", "predictive"])
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam's rate of the GPN variants")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    # every network keeps its own parameters (not pyro's global store, which would hand the
    # second network of the same structure the first one's values)
    pyro.settings.set(module_local_params=True)
    print(f"load {os.getloadavg()}, torch {torch.__version__}, one thread")
    for name in ["letter"] if args.letter else args.sets:
        if args.letter:
            steps, per_epoch = letter_steps(args.baseline)
        else:
            steps, per_epoch = steps_of(name, args.batch, args.baseline, args.objective, args.lr)
        for step in steps.values():  # warm up: compile / load the kernels, then --warm steps
            for i in range(max(3, args.warm)):
                step(i)
        cpu = {k: [] for k in steps}
        wall = {k: [] for k in steps}
        for _ in range(args.repeats):
            for key, step in steps.items():
                t, w = time.process_time(), time.perf_counter()
                for i in range(args.block):
                    step(i)
                cpu[key].append((time.process_time() - t) / args.block * per_epoch)
                wall[key].append((time.perf_counter() - w) / args.block * per_epoch)
        batch = 128 if args.letter else (args.batch or "full")
        print(f"{name}: {per_epoch} steps per epoch (batch {batch}), after {args.warm} steps")
        if args.profile:
            from torch.profiler import profile

            with profile() as prof:
                for i in range(10):
                    steps[args.profile](i)
            events = prof.key_averages()
            print(events.table(sort_by="self_cpu_time_total", row_limit=15))
            calls = sum(e.count for e in events if e.key.startswith("aten::")) / 10
            print(f"  {calls:.0f} aten operator calls per step (nested calls included)")
        base = statistics.median(cpu["tanh"])
        for key in steps:
            c, w = statistics.median(cpu[key]), statistics.median(wall[key])
            line = f"  {key:16s} CPU {c:8.4f} s/epoch ({c / base:6.1f}x tanh), wall {w:8.4f} s"
            for new in ("gpn",) if args.letter else ("point", "default"):
                if args.baseline and key == f"{new}@{args.baseline}":
                    line += f"  | old / new: {c / statistics.median(cpu[new]):.2f}x CPU"
            print(line, flush=True)
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
