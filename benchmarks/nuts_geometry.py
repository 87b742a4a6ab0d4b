"""Why NUTS takes long trees on a model: the cost of one potential-energy gradient with and
without the JIT (side by side in one process), and the geometry of the posterior at each
chain's start -- the Hessian's spectrum, which sites its stiffest directions live on, and the
conditional posterior scale of every site against its prior scale (behind ``docs/results/nuts.md``).

Example::

    OMP_NUM_THREADS=1 python -m benchmarks.nuts_geometry --run sampled-u --dataset kin8nm \\
        --max-train 1000 --sizes 8 4 1 --init fit-prior-noise
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from benchmarks.nuts_common import add_problem_args, build_problem
from pyro_gpn.inference.nuts_setup import (
    fit_initial_params,
    noise_prior_medians,
    potential_hessians,
)


def gradient_costs_ms(model, x, y, *, repeats: int, rounds: int) -> dict:
    """Process CPU ms per potential-energy gradient, JIT and not, alternating ``rounds`` times
    (``repeats`` gradients each) at one prior draw; the JIT trace is checked to give the same
    potential and gradient as the eager one."""
    from pyro.infer.mcmc.util import initialize_model
    from pyro.ops.integrator import potential_grad

    fns = {}
    for jit in (True, False):
        init, fns[jit], _, _ = initialize_model(
            model.model, (x, y, None), jit_compile=jit, skip_jit_warnings=True
        )
    (g_jit, e_jit), (g_eager, e_eager) = (potential_grad(fns[j], init) for j in (True, False))
    max_diff = max(float((g_jit[k] - g_eager[k]).abs().max()) for k in g_jit)
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for jit in (True, False):
            start = time.process_time()
            for _ in range(repeats):
                potential_grad(fns[jit], init)
            times[jit].append((time.process_time() - start) / repeats * 1e3)
    return {
        "jit_ms": [round(t, 3) for t in times[True]],
        "eager_ms": [round(t, 3) for t in times[False]],
        "eager_over_jit": round(sum(times[False]) / sum(times[True]), 2),
        "jit_minus_eager_potential": float(e_jit - e_eager),
        "jit_minus_eager_grad_max": max_diff,
    }


def start_geometry(model, x, y, params: dict) -> list[dict]:
    """Per chain start: Hessian spectrum, the sites of its stiffest directions, and per site the
    conditional posterior scale ``1 / sqrt(H_ii)`` (median, min) -- where the posterior is much
    narrower than the prior (scale 1 for whitened targets and log noise), a unit or diagonal
    mass matrix needs tiny steps."""
    names = sorted(params)
    sizes = [params[k][0].numel() for k in names]
    out = []
    for hess in potential_hessians(model, x, y, None, params):
        evals, evecs = torch.linalg.eigh(hess)
        top = evecs[:, -5:].square().sum(-1).split(sizes)  # the five stiffest directions
        scale = hess.diagonal().clamp_min(1e-12).rsqrt().split(sizes)
        out.append(
            {
                "max_eig": float(evals[-1]),
                "min_eig": float(evals[0]),
                "num_negative": int((evals < 0).sum()),
                "condition_positive": float(evals[-1] / evals[evals > 0][0]),
                "top5_weight": {k: round(float(t.sum()) / 5, 3) for k, t in zip(names, top)},
                "top_eigs": [round(float(v), 1) for v in evals[-8:].flip(0)],
                "cond_sd_median": {k: round(float(s.median()), 4) for k, s in zip(names, scale)},
                "cond_sd_min": {k: round(float(s.min()), 5) for k, s in zip(names, scale)},
                "sigma_at_start": {
                    k: [round(v, 4) for v in params[k][len(out)].exp().tolist()]
                    for k in names
                    if k.startswith("sigma")
                },
            }
        )
    return out


def laplace_draw_geometry(model, x, y, params: dict, draws: int, seed: int) -> list[dict]:
    """How Gaussian the posterior is around each start: at ``draws`` points drawn from the
    start's Laplace approximation (inverse Hessian, eigenvalues clamped at 1), the Hessian
    whitened by that approximation, ``A = S^T H(x) S`` with ``S S^T = H(start)^-1``. For a
    Gaussian posterior ``A = I``; NUTS's step is bounded by ``2 / sqrt(max eig A)``, and the
    sites carrying ``A``'s top eigenvector are where the curvature grows away from the start."""
    names = sorted(params)
    sizes = [params[k][0].numel() for k in names]
    gen = torch.Generator().manual_seed(seed)
    out = []
    for c, hess in enumerate(potential_hessians(model, x, y, None, params)):
        evals, evecs = torch.linalg.eigh(hess)
        root = evecs / evals.clamp_min(1.0).sqrt()  # S, S S^T = clamped H^-1
        flat = torch.cat([params[k][c].reshape(-1) for k in names])
        rows = []
        for _ in range(draws):
            point = flat + root @ torch.randn(flat.shape, generator=gen, dtype=flat.dtype)
            parts = point.split(sizes)
            one = {k: p.reshape(params[k].shape[1:])[None] for k, p in zip(names, parts)}
            h = potential_hessians(model, x, y, None, one)[0]
            a_evals, a_evecs = torch.linalg.eigh(root.mT @ h @ root)
            weight = (root @ a_evecs[:, -1]).square()
            weight = (weight / weight.sum()).split(sizes)
            rows.append(
                {
                    "max_eig": round(float(a_evals[-1]), 1),
                    "min_eig": round(float(a_evals[0]), 2),
                    "top_weight": {k: round(float(w.sum()), 3) for k, w in zip(names, weight)},
                }
            )
        out.append(rows)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_problem_args(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--init", default="fit-prior-noise", choices=["fit-prior-noise", "fit"])
    parser.add_argument("--init-steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--laplace-draws", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, x, y, *_ = build_problem(args)
    report = {"settings": vars(args), "rows": len(x), "load_at_start": os.getloadavg()}
    report["gradient"] = gradient_costs_ms(model, x, y, repeats=args.repeats, rounds=args.rounds)
    hold = noise_prior_medians(model, x) if args.init == "fit-prior-noise" else None
    cpu = time.process_time()
    params = fit_initial_params(
        model, x, y, None, num_chains=args.chains, steps=args.init_steps, seed=args.seed, hold=hold
    )
    report["fit_cpu_s"] = round(time.process_time() - cpu, 1)
    report["starts"] = start_geometry(model, x, y, params)
    if args.laplace_draws:
        report["laplace_draws"] = laplace_draw_geometry(
            model, x, y, params, args.laplace_draws, args.seed
        )
    report["load_at_end"] = os.getloadavg()
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
