"""The variational GPN's training step through ``fit_vgpn``, now against an older revision, side
by side in one process, with the numbers compared (the step-overhead work of issue 15: faster,
the same values).

Both packages build ``VariationalGPN([D, 50, 1])`` at the recommended defaults (variational
weights, whitened, identity start) with the same initial state, and train it with
:func:`~pyro_gpn.inference.fit_vgpn` on the same rows (the training rows of split 0 of a UCI
set) in alternating blocks of ``--block`` steps (no validation hold-out, so that no best state
is restored between blocks; each block is one ``fit_vgpn`` call with its own seed, the same for
both packages). The first ``--warm`` steps are untimed: the cost of a step depends on the state
(rows whose activations are narrow against the lengthscale take the Gauss-Hermite path of the
row kernels, and their share grows during a fit), so every block starts both networks from the
same state (the old package's network takes the new one's). Reports the median process-CPU
seconds per step of each package, their ratio, seconds per epoch, and the relative difference
of the two packages' losses at each block's first step (same state, same rows) and within the
blocks (where rounding differences grow: Adam's normalised steps amplify them)::

    OMP_NUM_THREADS=1 python benchmarks/profile_vgpn_fit.py --sets boston kin8nm --baseline HEAD

``--profile`` prints a ``cProfile`` of one block of the current package instead of timing (sorted
by the environment variable ``PROFILE_SORT``, default ``tottime``; ``cumtime`` for callers).
``--full`` runs one whole recommended fit per package instead (``fit_vgpn`` with every default:
the 10 % validation hold-out, validation stopping, the step budget and schedule; the new package
first), and reports its process-CPU seconds, steps, seconds per step and per epoch of the
training rows, and the best validation log-likelihood (rounding differences grow over a fit, so
the two fits agree only closely, not exactly). ``--trajectory N`` trains both packages from
the same initial state for ``N`` steps in one ``fit_vgpn`` call each (no hold-out, constant
rate; ``--lr-decay`` to decay it) and reports their CPU time per step and the first step at
which their losses differ by more than ``1e-9 ... 1e-2`` relative: where a rounding
difference first reaches a float32 loss, and how fast it grows.
"""

from __future__ import annotations

import argparse
import copy
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
from pyro_gpn.heads import HeteroscedasticGaussianHead  # noqa: E402
from pyro_gpn.inference.closed_form import fit_vgpn  # noqa: E402
from pyro_gpn.models import VariationalGPN  # noqa: E402
from pyro_gpn.recommended import VGPN  # noqa: E402


def build(
    package,
    d: int,
    n: int,
    head: str,
    state: dict | None,
    width: int = 50,
    weights: str = "variational",
):
    """``VariationalGPN([d, width, 1], weights=weights)`` of ``package`` (``None``: this
    checkout), loaded with ``state`` (the other package's initial state) when given."""
    if package is None:
        cls, het = VariationalGPN, HeteroscedasticGaussianHead
    else:
        cls, het = package.models.VariationalGPN, package.heads.HeteroscedasticGaussianHead
    model = cls(
        [d, width, 1],
        head=het(1) if head == "heteroscedastic" else head,
        num_data=n,
        weights=weights,
    )
    if state is not None:
        model.load_state_dict(state)
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["boston", "kin8nm"])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--baseline", default="HEAD", help="git revision to compare with")
    parser.add_argument("--elbo", default="predictive", choices=["predictive", "closed_form"])
    parser.add_argument("--head", default="gaussian", choices=["gaussian", "heteroscedastic"])
    parser.add_argument("--warm", type=int, default=0, help="untimed steps first")
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--lr-decay", type=float, default=1.0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--full", action="store_true", help="one whole recommended fit each")
    parser.add_argument("--trajectory", type=int, default=0, help="steps of one long run each")
    parser.add_argument("--width", type=int, default=50, help="hidden units")
    parser.add_argument(
        "--weights",
        default="variational",
        choices=["variational", "point"],
        help="point: deterministic first-layer activations (kin8nm's chosen network)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pyro.settings.set(module_local_params=True)
    base = load_baseline(args.baseline)
    import pyro_gpn_base.heads  # noqa: F401
    import pyro_gpn_base.inference.closed_form  # noqa: F401

    base_fit = base.inference.closed_form.fit_vgpn
    print(
        f"load {os.getloadavg()}, torch {torch.__version__}, one thread, elbo {args.elbo}, "
        f"head {args.head}, lr {args.lr}, baseline {args.baseline}, width {args.width}, "
        f"weights {args.weights}"
    )
    for name in args.sets:
        data = load_uci_regression(name, DATA_DIR, split=0, download=False)
        x, y = data.x_train, data.y_train
        n, d = x.shape
        torch.manual_seed(0)
        shape = {"width": args.width, "weights": args.weights}
        new = build(None, d, n, args.head, None, **shape)
        old = build(base, d, n, args.head, copy.deepcopy(new.state_dict()), **shape)
        variants = {"new": (new, fit_vgpn), f"@{args.baseline}": (old, base_fit)}
        options = dict(
            batch_size=args.batch, val_fraction=0, lr=args.lr, lr_decay=args.lr_decay,
            elbo=args.elbo, clear_param_store=False,
        )  # fmt: skip

        def run(key, steps, seed, variants=variants, x=x, y=y, options=options):
            model, fit = variants[key]
            t = time.process_time()
            out = fit(model, x, y, num_steps=steps, seed=seed, **options)
            return time.process_time() - t, out.losses

        def sync(new=new, old=old):  # the old package's network takes the new one's state
            old.load_state_dict(copy.deepcopy(new.state_dict()))

        if args.full:
            for key, (model, fit) in variants.items():
                t = time.process_time()
                out = fit(model, x, y, clear_param_store=False, elbo=args.elbo)
                seconds = time.process_time() - t
                per_step = seconds / out.num_steps
                epochs = out.num_steps * min(VGPN.batch_for(out.num_train) or n, n) / out.num_train
                print(f"{name} {key:10s}: {seconds:.1f} s CPU, {out.num_steps} steps "
                      f"({per_step * 1e3:.2f} ms/step, {seconds / epochs:.4f} s/epoch), best "
                      f"validation log-lik {out.best_val_log_lik:.4f} at step {out.best_step}",
                      flush=True)  # fmt: skip
            continue
        if args.trajectory:
            (ta, a), (tb, b) = (run(key, args.trajectory, 0) for key in variants)
            rel = [abs(p - q) / max(abs(q), 1e-300) for p, q in zip(a, b, strict=True)]
            print(f"{name}: CPU {ta / len(a) * 1e3:.2f} ms/step (new), {tb / len(b) * 1e3:.2f} "
                  f"(@{args.baseline}): {tb / ta:.3f}x")  # fmt: skip
            first = {
                t: next((i + 1 for i, r in enumerate(rel) if r > t), None)
                for t in (1e-9, 1e-7, 1e-5, 1e-3, 1e-2)
            }
            print(f"{name}: {args.trajectory} steps from the same state; first step with a "
                  f"relative loss difference above {first}")  # fmt: skip
            continue
        if args.warm:
            run("new", args.warm, 10_000)
            sync()
        if args.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            run("new", args.block, 1)
            prof.disable()
            stats = pstats.Stats(prof)
            stats.sort_stats(os.environ.get("PROFILE_SORT", "tottime")).print_stats(40)
            continue
        for key in variants:  # warm-up (kernel loading), untimed
            run(key, 1, 20_000)
        sync()
        cpu = {k: [] for k in variants}
        first, within = [], []
        for r in range(args.repeats):  # each block starts both networks from the same state
            losses = {}
            for key in variants:
                seconds, losses[key] = run(key, args.block, r)
                cpu[key].append(seconds / args.block)
            a, b = losses.values()
            diffs = [abs(p - q) / max(abs(q), 1e-300) for p, q in zip(a, b, strict=True)]
            first.append(diffs[0])
            within.append(max(diffs))
            sync()
        per_epoch = math.ceil(n / min(args.batch, n))
        med = {k: statistics.median(v) for k, v in cpu.items()}
        old_key = f"@{args.baseline}"
        ratios = [o / c for o, c in zip(cpu[old_key], cpu["new"], strict=True)]
        print(
            f"{name}: {n} rows, {per_epoch} steps per epoch (batch {min(args.batch, n)}), "
            f"{args.warm} warm steps, {args.repeats} x {args.block} timed steps"
        )
        for key, value in med.items():
            spread = f"{min(cpu[key]) * 1e3:.2f}-{max(cpu[key]) * 1e3:.2f}"
            print(
                f"  {key:14s} CPU {value * 1e3:7.3f} ms/step ({spread}), "
                f"{value * per_epoch:.4f} s/epoch"
            )
        print(
            f"  speed-up (old / new CPU per step): {med[old_key] / med['new']:.3f}x "
            f"(per block: {min(ratios):.3f}-{max(ratios):.3f}); relative loss difference "
            f"at each block's first step (same state) <= {max(first):.1e}, within the blocks "
            f"<= {max(within):.1e}",
            flush=True,
        )
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
