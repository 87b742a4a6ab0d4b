"""Why the ``[1, 4, 1]`` chains sit at different noise levels (issue 16): diagnostics computed from
the saved chains of a ``benchmarks.nuts_runs --run synthetic --sizes 1 4 1 --checkpoint-dir DIR``
run (``docs/results/nuts.md``, session of 2026-11-24 13:50 UTC).

* ``summary``: per chain the noise medians, the effective activation noise
  ``s_A = sqrt(sum_n W2_n^2 sigma1_n^2)`` (the noise part of
  ``Cov(A) = sum_n W2_n^2 K_n + s_A^2 I``), correlations of ``log sigma2`` with ``s_A`` and with
  the log density ``lp``, per-chain ESS and BFMI;
* ``lines``: the Laplace approximation of the parameters' marginal ``log p(theta | y)`` (the latent
  activations integrated at their conditional mode) along straight lines between the chains'
  median-``lp`` draws and, for scale, between the 10 % and 90 % ``sigma2`` draws of one chain;
  hidden units matched, signs folded and ``z -> -z`` chosen first (exact symmetries of the
  collapsed model: the script checks one);
* ``curvature``: the Hessian of the potential over (parameters, latent activations) at every
  ``--step``-th draw, preconditioned by that chain's draw covariance (as a fully adapted metric
  would be): ``sqrt(lambda_max)`` sets the largest stable leapfrog step (about ``2 /
  sqrt(lambda_max)``); for the whitened ``z`` (the run's coordinates) and the centred ``A = L z``,
  each with the ``dense-block`` metric (dense parameters, diagonal latents) and a dense one.

Example::

    OMP_NUM_THREADS=1 python -m benchmarks.nuts_noise_geometry --checkpoint-dir DIR --what all \\
        --out docs/results/nuts_runs/noise_geometry_141.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

SITES = ("W1", "W2", "sigma1", "sigma2", "Za2_train")


def load_chains(directory: Path) -> list[dict]:
    """The saved chains (``chain*.pt``, in chain order) as ``{"samples", "stats"}``."""
    files = sorted(directory.glob("chain*.pt"))
    if not files:
        raise ValueError(f"checkpoint_dir {directory} holds no chain*.pt files")
    return [torch.load(f, weights_only=False) for f in files]


def problem():
    from pyro_gpn.data import synthetic_1d

    data = synthetic_1d(60, 100, seed=0)
    return data.x_train.double(), data.y_train.double()[:, 0]


def potential(activations: str, x, y):
    from pyro.infer.mcmc.util import initialize_model

    from pyro_gpn.models.nonparametric import NonParametricGPN

    model = NonParametricGPN([1, 4, 1], max_samples=154, activations=activations)
    return initialize_model(model.model, model_args=(x, y, None), jit_compile=False)[1]


def draw(chain: dict, i: int) -> dict:
    s = chain["samples"]
    out = {k: s[k][0, i].clone() for k in SITES}
    out["sigma1"], out["sigma2"] = out["sigma1"].log(), out["sigma2"].log()  # unconstrained
    return out


def activation_noise(w2: np.ndarray, sigma1: np.ndarray) -> np.ndarray:
    return np.sqrt((w2.reshape(len(w2), -1) ** 2 * sigma1**2).sum(1))


def summary(chains: list[dict]) -> dict:
    import arviz as az

    out = {}
    for c, ch in enumerate(chains):
        s = {k: v[0].numpy() for k, v in ch["samples"].items()}
        lp = np.asarray(ch["stats"]["lp"])
        ls2, ls_a = np.log(s["sigma2"][:, 0]), np.log(activation_noise(s["W2"], s["sigma1"]))

        def ess(a):
            return round(float(az.ess(np.asarray(a)[None])), 1)

        def corr(a, b):
            return round(float(np.corrcoef(a, b)[0, 1]), 2)

        out[f"chain{c}"] = {
            "sigma1_median": np.median(s["sigma1"], 0).round(4).tolist(),
            "sigma2_median": round(float(np.exp(np.median(ls2))), 4),
            "s_A_median": round(float(np.exp(np.median(ls_a))), 4),
            "lp_q10_q50_q90": np.percentile(lp, [10, 50, 90]).round(1).tolist(),
            "corr_log_sigma2_log_s_A": corr(ls2, ls_a),
            "corr_lp_log_sigma2": corr(lp, ls2),
            "sd_log_sigma1": np.log(s["sigma1"]).std(0).round(2).tolist(),
            "ess_log_sigma2": ess(ls2),
            "ess_log_s_A": ess(ls_a),
            "ess_lp": ess(lp),
            "ess_log_sigma1": [ess(np.log(s["sigma1"][:, n])) for n in range(4)],
            "bfmi": round(float(az.bfmi(np.asarray(ch["stats"]["energy"])[None])[0]), 2),
        }
    return out


def fold(p: dict, ref: dict | None = None) -> dict:
    """Fold the exact symmetries: weight signs, unit order (matched to ``ref``), ``z -> -z``."""
    from scipy.optimize import linear_sum_assignment

    q = dict(p)
    q["W1"], q["W2"] = q["W1"].abs(), q["W2"].abs()
    if ref is None:
        return q

    def features(r):
        return torch.stack([r["W1"][:, 0].log(), r["W2"][0].log(), r["sigma1"]], 1)

    _, perm = linear_sum_assignment(torch.cdist(features(ref), features(q)).numpy())
    perm = torch.as_tensor(perm)
    q["W1"], q["W2"], q["sigma1"] = q["W1"][perm], q["W2"][:, perm], q["sigma1"][perm]
    z, z_ref = q["Za2_train"], ref["Za2_train"]
    if (z - z_ref).norm() > (z + z_ref).norm():
        q["Za2_train"] = -z
    return q


def laplace(pot, p: dict) -> dict:
    """``-U`` at the given point, at the latent's conditional mode, and the Laplace marginal."""
    theta = {k: v for k, v in p.items() if k != "Za2_train"}
    z = p["Za2_train"].clone().requires_grad_(True)
    opt = torch.optim.LBFGS([z], max_iter=200, line_search_fn="strong_wolfe", tolerance_grad=1e-9)

    def closure():
        opt.zero_grad()
        u = pot({**theta, "Za2_train": z})
        u.backward()
        return u

    opt.step(closure)
    mode = z.detach()
    hess = torch.autograd.functional.hessian(lambda v: pot({**theta, "Za2_train": v}), mode)
    at_mode = -float(pot({**theta, "Za2_train": mode}))
    half_log_det = 0.5 * float(torch.linalg.eigvalsh(hess).clamp_min(1e-12).log().sum())
    return {
        "logp_at_point": round(-float(pot(p)), 2),
        "logp_at_latent_mode": round(at_mode, 2),
        "laplace_log_marginal": round(at_mode - half_log_det, 2),
        "sigma2": round(float(p["sigma2"].exp()), 4),
        "s_A": round(float((p["W2"][0] ** 2 * (2 * p["sigma1"]).exp()).sum().sqrt()), 4),
    }


def lines(chains: list[dict], x, y, points: int = 11) -> dict:
    pot = potential("whitened", x, y)
    p = draw(chains[0], 0)
    q = fold(p)
    q["Za2_train"] = -q["Za2_train"]
    perm = torch.tensor([2, 0, 3, 1])
    q["W1"], q["W2"], q["sigma1"] = q["W1"][perm], q["W2"][:, perm], q["sigma1"][perm]
    out = {"symmetry_check_U": [float(pot(p)), float(pot(q))]}

    def at_lp_median(c):
        lp = np.asarray(chains[c]["stats"]["lp"])
        return draw(chains[c], int(np.argsort(lp)[len(lp) // 2]))

    def at_sigma2_quantile(c, level):
        v = chains[c]["samples"]["sigma2"][0, :, 0].numpy()
        return draw(chains[c], int(np.argsort(v)[int(level * (len(v) - 1))]))

    def line(a, b):
        return [
            {"t": round(float(t), 2), **laplace(pot, {k: (1 - t) * a[k] + t * b[k] for k in a})}
            for t in np.linspace(0.0, 1.0, points)
        ]

    a = fold(at_lp_median(0))
    for c in range(1, len(chains)):
        out[f"chain0_to_chain{c}"] = line(a, fold(at_lp_median(c), a))
    for c in (0, min(2, len(chains) - 1)):
        lo = fold(at_sigma2_quantile(c, 0.1))
        out[f"within_chain{c}_sigma2_q10_to_q90"] = line(lo, fold(at_sigma2_quantile(c, 0.9), lo))
    return out


def curvature(chains: list[dict], x, y, step: int) -> dict:
    from pyro_gpn.models.gp_rows import activation_cholesky

    pots = {name: potential(name, x, y) for name in ("whitened", "centred")}
    out = {}
    for c, ch in enumerate(chains):
        s = ch["samples"]
        flat = {"whitened": [], "centred": []}
        for i in range(s["sigma2"].shape[1]):
            w1, w2, s1, s2, z = (s[k][0, i] for k in SITES)
            a = activation_cholesky(x, w1, s1, 1.0, w2, 1e-6) @ z
            head = torch.cat([w1.reshape(-1), w2.reshape(-1), s1.log(), s2.log().reshape(-1)])
            flat["whitened"].append(torch.cat([head, z]))
            flat["centred"].append(torch.cat([head, a]))
        res = {}
        for name, rows in flat.items():
            values = torch.stack(rows)
            cov = torch.cov(values.T)
            block = torch.diag(cov.diagonal())
            block[:13, :13] = cov[:13, :13]
            roots = {}
            for metric, m in (("dense-block", block), ("dense", cov)):
                ev, vec = torch.linalg.eigh(m)
                roots[metric] = vec @ torch.diag(ev.clamp_min(1e-12).sqrt()) @ vec.T
            latent = "Za2_train" if name == "whitened" else "A2_train"

            def energy(v, name=name, latent=latent):
                return pots[name](
                    {
                        "W1": v[:4].reshape(4, 1),
                        "W2": v[4:8].reshape(1, 4),
                        "sigma1": v[8:12],
                        "sigma2": v[12:13],
                        latent: v[13:],
                    }
                )

            top = {metric: [] for metric in roots}
            for i in range(0, len(values), step):
                hess = torch.autograd.functional.hessian(energy, values[i])
                for metric, r in roots.items():
                    top[metric].append(float(torch.linalg.eigvalsh(r @ hess @ r).max().sqrt()))
            res[name] = {
                metric: {
                    "sqrt_lambda_max_median": round(float(np.median(v)), 1),
                    "sqrt_lambda_max_q90": round(float(np.percentile(v, 90)), 1),
                }
                for metric, v in top.items()
            }
        out[f"chain{c}"] = res
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--what", choices=["summary", "lines", "curvature", "all"], default="all")
    parser.add_argument("--step", type=int, default=25, help="curvature: every step-th draw")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_default_dtype(torch.float64)
    chains = load_chains(args.checkpoint_dir)
    x, y = problem()
    report: dict = {"checkpoint_dir": str(args.checkpoint_dir)}
    cpu = time.process_time()
    if args.what in ("summary", "all"):
        report["summary"] = summary(chains)
    if args.what in ("lines", "all"):
        report["lines"] = lines(chains, x, y)
    if args.what in ("curvature", "all"):
        report["curvature"] = curvature(chains, x, y, args.step)
    report["cpu_s"] = round(time.process_time() - cpu, 1)
    print(json.dumps(report, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
