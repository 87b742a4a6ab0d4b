"""Where NUTS spends its time on a non-parametric GPN: cost per gradient, tree depth, step size
and the effective sample size of every latent site (behind ``docs/results/nuts.md``).

Example::

    OMP_NUM_THREADS=1 python -m benchmarks.nuts_profile --sizes 1 4 1 --n-train 20 --n-test 10 \\
        --samples 40 --warmup 40 --init-steps 200 --max-tree-depth 8 --no-collapse
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from benchmarks.nuts_common import add_sampler_args, convergence, sampler_kwargs, settings_of
from pyro_gpn.data import synthetic_1d
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
    add_sampler_args(parser, chains=1, draws=100)
    parser.add_argument("--no-collapse", action="store_true", help="collapse=False")
    parser.add_argument("--centred", action="store_true", help="whiten=False")
    args = parser.parse_args(argv)

    data = synthetic_1d(args.n_train, args.n_test, seed=0)
    x, y, x_test = data.x_train.double(), data.y_train.double(), data.x_test.double()
    model = NonParametricGPN(args.sizes, collapse=not args.no_collapse, whiten=not args.centred)
    cost = gradient_cost_ms(model, x, y)
    cpu = time.process_time()
    result = run_nuts(model, x, y, x_test, **sampler_kwargs(args))
    cpu = time.process_time() - cpu
    import arviz as az

    ess = az.ess(result.to_arviz().posterior)
    report = {
        "settings": settings_of(args),
        "grad_ms": round(cost, 2),
        "cpu_s": round(cpu, 1),
        "chain_cpu_s": result.chain_cpu_s,
        **convergence(result, [f"sigma{len(args.sizes) - 1}"]),
        "min_ess_per_site": {
            k: round(float(np.nanmin(v.values)), 1) for k, v in ess.data_vars.items()
        },
    }
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
