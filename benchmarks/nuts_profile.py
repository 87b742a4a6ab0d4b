"""Where NUTS spends its time on a non-parametric GPN: cost per gradient, tree depth, step size
and the effective sample size of every latent site (behind ``docs/results/nuts.md``).

Example::

    OMP_NUM_THREADS=1 python benchmarks/nuts_profile.py --sizes 1 4 1 --n-train 20 --n-test 10 \\
        --samples 40 --warmup 40 --init-steps 200 --max-tree-depth 8 --no-collapse
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from pyro_gpn.data import synthetic_1d
from pyro_gpn.diagnostics import max_rhat, min_ess
from pyro_gpn.inference.mcmc import run_nuts
from pyro_gpn.models.nonparametric import NonParametricGPN


def gradient_cost_ms(model, x, y, repeats: int = 100, jit: bool = True) -> float:
    """Process CPU milliseconds per potential-energy gradient at a prior draw."""
    from pyro.infer.mcmc.util import initialize_model
    from pyro.ops.integrator import potential_grad

    init, potential_fn, _, _ = initialize_model(
        model.model, (x, y, None), jit_compile=jit, skip_jit_warnings=True
    )
    potential_grad(potential_fn, init)
    start = time.process_time()
    for _ in range(repeats):
        potential_grad(potential_fn, init)
    return (time.process_time() - start) / repeats * 1e3


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 1])
    parser.add_argument("--n-train", type=int, default=60)
    parser.add_argument("--n-test", type=int, default=100)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--chains", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", default="fit")
    parser.add_argument("--metric", default="dense-block")
    parser.add_argument("--max-tree-depth", type=int, default=10)
    parser.add_argument("--target-accept", type=float, default=0.8)
    parser.add_argument("--init-steps", type=int, default=500)
    parser.add_argument("--no-collapse", action="store_true", help="collapse=False")
    args = parser.parse_args(argv)

    data = synthetic_1d(args.n_train, args.n_test, seed=0)
    x, y, x_test = data.x_train.double(), data.y_train.double(), data.x_test.double()
    model = NonParametricGPN(args.sizes, collapse=not args.no_collapse)
    cost = gradient_cost_ms(model, x, y)
    cpu = time.process_time()
    result = run_nuts(
        model,
        x,
        y,
        x_test,
        num_samples=args.samples,
        warmup_steps=args.warmup,
        num_chains=args.chains,
        seed=args.seed,
        init=args.init,
        metric=args.metric,
        max_tree_depth=args.max_tree_depth,
        target_accept_prob=args.target_accept,
        init_steps=args.init_steps,
    )
    cpu = time.process_time() - cpu
    idata = result.to_arviz()
    import arviz as az

    ess = az.ess(idata.posterior)
    per_site = {k: round(float(np.nanmin(v.values)), 1) for k, v in ess.data_vars.items()}
    stats = result.sample_stats
    steps = np.concatenate([s["n_steps"] for s in stats])
    depth = np.concatenate([s["tree_depth"] for s in stats])
    last = f"sigma{len(args.sizes) - 1}"
    report = {
        "settings": vars(args),
        "grad_ms": round(cost, 2),
        "init_s": round(result.init_time_s, 1),
        "wall_s": round(result.wall_time_s, 1),
        "cpu_s": round(cpu, 1),
        "step_size": [round(s["step_size"][-1], 4) for s in stats],
        "mean_steps": round(float(steps.mean()), 1),
        "tree_depth_hist": np.bincount(depth).tolist(),
        "divergences": int(result.num_divergences),
        "min_ess_per_site": per_site,
        "ess_pred": round(min_ess(idata, ["y_test"], group="posterior_predictive"), 1),
        "ess_noise": round(min_ess(idata, [last]), 1),
    }
    if args.chains > 1:
        report["rhat_pred"] = round(max_rhat(idata, ["y_test"], group="posterior_predictive"), 3)
        report["rhat_noise"] = round(max_rhat(idata, [last]), 3)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
