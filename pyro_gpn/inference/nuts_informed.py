r"""Per-chain anchors for ``NonParametricGPN(activations="likelihood-informed")``, set from each
chain's fitted start, and the chains' draws moved back to whitened coordinates (used by
:func:`pyro_gpn.inference.mcmc.run_nuts`).

The likelihood-informed parametrisation (:meth:`NonParametricGPN.set_activation_anchor`)
non-centres the training rows' last-layer activations against ``N(m, (C^{-1} + D)^{-1})`` with
``D = diag(kappa) / sigma_L^2``. Here the pseudo-observations ``a_hat`` are the activations of
the chain's own fit, and ``kappa_s = f'(a_hat_s)^2`` is the Gauss-Newton curvature of the
likelihood in ``A_s`` per unit noise variance, with ``f`` the fitted output GP's posterior mean
(``eq:gp_f_reg_mean_var``):
``f'(a) = sum_t -(a - a_t) / lambda^2 k(a, a_t) alpha_t``, ``alpha = (K + sigma_L^2 I)^{-1} y``.

**Why one anchor per chain.** The fits of different chains put the activations in different
configurations (on the synthetic ``[1, 4, 1]`` problem the first chain's fit spans ``[-2.9,
3.3]``, another's ``[-1.5, -0.5]``: ``A -> h(A)`` with ``f -> f o h^{-1}`` changes the
likelihood little), and a start far from the anchor is far out in ``e`` (norm 230-360 against
1.1 at the anchor's own fit). The anchor is a constant of each chain's potential, so each chain
targets the exact posterior; the chains' draws are then mapped back to the whitened coordinates
``Za{L}_train`` (the deterministic ``Za{L}_train_whitened``) and analysed with the whitened
model, where every chain's draws mean the same thing.
"""

from __future__ import annotations

import copy

import torch
from pyro import poutine
from torch import Tensor

from pyro_gpn.models.nonparametric import NonParametricGPN

__all__ = ["activation_anchor", "informed_chain_models", "twin", "whitened_samples"]


def twin(model: NonParametricGPN, activations: str) -> NonParametricGPN:
    """A copy of ``model`` with another ``activations`` and no anchor (the same priors)."""
    out = copy.copy(model)
    out.activations, out.activation_anchor = activations, None
    return out


def activation_anchor(
    model: NonParametricGPN, a_train: Tensor, y_train: Tensor, noise_std: Tensor, lengthscale
) -> tuple[Tensor, Tensor]:
    r"""``(a_hat, kappa)``, both ``[S_train, N_L]``: the activations ``a_train`` themselves and
    ``kappa = f'(a_hat)^2`` of the output GP's posterior mean given them (module docstring).

    Args:
        a_train: ``[S_train, N_L]`` training activations of a fit.
        y_train: ``[N_L, S_train]`` targets (the model's layout).
        noise_std: ``[N_L]`` output noise; lengthscale: scalar or ``[N_L]``.
    """
    scale = torch.as_tensor(lengthscale, dtype=a_train.dtype).expand(a_train.shape[-1])
    kappa = torch.empty_like(a_train)
    for k in range(a_train.shape[-1]):
        a, ell = a_train[:, k], scale[k]
        diff = a[:, None] - a[None, :]
        gram = torch.exp(-0.5 * diff.square() / ell**2)
        cov = gram + (noise_std[k].square() + model.jitter) * torch.eye(len(a), dtype=a.dtype)
        alpha = torch.linalg.solve(cov, y_train[k])
        kappa[:, k] = ((-diff / ell**2 * gram) @ alpha).square()
    return a_train.clone(), kappa


def _trace(model: NonParametricGPN, args: tuple, values: dict[str, Tensor]):
    return poutine.trace(poutine.condition(model.model, values)).get_trace(*args)


def informed_chain_models(
    model: NonParametricGPN,
    x_train: Tensor,
    y_train: Tensor,
    x_test: Tensor | None,
    params: dict[str, Tensor],
) -> tuple[list[NonParametricGPN], dict[str, Tensor]]:
    """One copy of ``model`` per chain, anchored at that chain's fitted start, and the starts in
    the likelihood-informed coordinates.

    Args:
        model: ``activations="likelihood-informed"`` with no anchor (then ``e = z``, so the fits
            of :func:`~pyro_gpn.inference.nuts_setup.fit_initial_params` are whitened fits).
        x_train, y_train, x_test: as for ``run_nuts`` (``x_test`` only with ``joint=True``).
        params: ``{site: [num_chains, *shape]}`` unconstrained fitted starts.

    Returns:
        ``(models, params)``: the chains' models and their starts (``Ea{L}_train`` converted to
        ``e = M^T z - c``; test rows unchanged).
    """
    from pyro.infer.mcmc.util import initialize_model

    if model.activations != "likelihood-informed" or model.activation_anchor is not None:
        raise ValueError("needs a likelihood-informed model without an anchor")
    chains = next(iter(params.values())).shape[0]
    if not model.activation_sites():
        return [model] * chains, params
    top, args = model.num_layers, (x_train, y_train, x_test)
    _, y_obs, _ = model.check_data(x_train, y_train, None)
    num_train = x_train.shape[0]
    _, _, transforms, _ = initialize_model(model.model, args)
    centred = twin(model, "centred")
    models, out = [], {k: v.clone() for k, v in params.items()}
    for c in range(chains):
        values = {k: transforms[k].inv(v[c]).detach() for k, v in params.items()}
        a = _trace(model, args, values).nodes[f"A{top}"]["value"].detach()[:num_train]
        lengthscale = values.get(f"lengthscale{top}", model.lengthscale)
        anchor = activation_anchor(model, a, y_obs, values[f"sigma{top}"], lengthscale)
        fixed = {k: v for k, v in values.items() if not k.startswith(f"Ea{top}_")}
        fixed[f"A{top}_train"] = a.reshape(-1)
        node = _trace(centred, (x_train, y_train, None), fixed).nodes[f"A{top}_train"]
        chain_model = copy.copy(model)
        chain_model.set_activation_anchor(*anchor)
        m, shift = chain_model.informed_factor(node["fn"].scale_tril, values[f"sigma{top}"])
        z = params[f"Ea{top}_train"][c]
        out[f"Ea{top}_train"][c] = (m.mT @ z.unsqueeze(-1)).squeeze(-1).detach() - shift.detach()
        models.append(chain_model)
    return models, out


def whitened_samples(
    model: NonParametricGPN, samples: dict[str, Tensor], args: tuple
) -> dict[str, Tensor]:
    """A chain's draws ``{site: [1, D, *shape]}`` (``group_by_chain``) of an anchored
    likelihood-informed ``model`` with ``Ea{L}_train`` / ``Ea{L}_test`` replaced by the whitened
    ``Za{L}_train`` / ``Za{L}_test`` (the test rows are whitened already): the same states in
    the coordinates of ``twin(model, "whitened")``."""
    top = model.num_layers
    name = f"Ea{top}_train"
    if name not in samples:
        return samples
    draws = samples[name].shape[1]
    z = []
    with torch.no_grad():
        for d in range(draws):
            values = {k: v[0, d] for k, v in samples.items()}
            node = _trace(model, args, values).nodes[f"Za{top}_train_whitened"]
            z.append(node["value"])
    out = {k: v for k, v in samples.items() if not k.startswith(f"Ea{top}_")}
    out[f"Za{top}_train"] = torch.stack(z).unsqueeze(0)
    if f"Ea{top}_test" in samples:
        out[f"Za{top}_test"] = samples[f"Ea{top}_test"]
    return out
