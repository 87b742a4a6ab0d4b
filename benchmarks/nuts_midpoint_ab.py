"""The sampled-targets potential's gradient cost with ``clt_layer_moments`` as of an older
revision (``--old-rev``, loaded from git) against the current one, alternating in one process
(process CPU ms per gradient, JIT on, as NUTS runs it), and the two potentials and gradients
compared at the same point (behind ``docs/results/nuts.md``).

Example::

    OMP_NUM_THREADS=1 python -m benchmarks.nuts_midpoint_ab --run sampled-u --dataset kin8nm \\
        --max-train 1000 --sizes 8 4 1 --old-rev b223fee
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.nuts_common import add_problem_args, build_problem

MODULE = "pyro_gpn/models/sampled_targets.py"


def _old_layer_moments(rev: str):
    """``clt_layer_moments`` of ``MODULE`` at git revision ``rev``."""
    source = subprocess.run(
        ["git", "show", f"{rev}:{MODULE}"], check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "sampled_targets_old.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("pyro_gpn.models._sampled_targets_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.clt_layer_moments


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_problem_args(parser)
    parser.add_argument("--old-rev", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from pyro.infer.mcmc.util import initialize_model
    from pyro.ops.integrator import potential_grad

    model, x, y, *_ = build_problem(args)
    old_fn = _old_layer_moments(args.old_rev)

    class OldModel(type(model)):
        def output_moments(self, x, params):
            mean, var = x, torch.zeros_like(x)
            for w, u, sigma in params:
                mean, var = old_fn(
                    mean, var, w, self.inducing_points, u, self.lengthscale, self.jitter, sigma
                )
            return mean, var

    old_model = OldModel.__new__(OldModel)
    old_model.__dict__.update(model.__dict__)
    fns, inits = {}, {}
    for name, m in (("old", old_model), ("new", model)):
        torch.manual_seed(args.seed)
        inits[name], fns[name], _, _ = initialize_model(
            m.model, (x, y, None), jit_compile=True, skip_jit_warnings=True
        )
    init = inits["new"]
    (g_old, e_old), (g_new, e_new) = (potential_grad(fns[k], init) for k in ("old", "new"))
    times: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(args.rounds):
        for name in ("old", "new"):
            start = time.process_time()
            for _ in range(args.repeats):
                potential_grad(fns[name], init)
            times[name].append(round((time.process_time() - start) / args.repeats * 1e3, 3))
    report = {
        "old_rev": args.old_rev,
        "rows": len(x),
        "sizes": args.sizes,
        "old_ms": times["old"],
        "new_ms": times["new"],
        "old_over_new_excluding_first_round": round(
            sum(times["old"][1:]) / max(sum(times["new"][1:]), 1e-9), 3
        ),
        "potential_old_minus_new": float(e_old - e_new),
        "grad_max_abs_diff": max(float((g_old[k] - g_new[k]).abs().max()) for k in g_new),
        "grad_max_abs": max(float(g_new[k].abs().max()) for k in g_new),
    }
    print(json.dumps(report, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
