r"""Prototype (issue 15): the closed-form variational GPN with a Bayesian treatment of ``W``.

Nothing in the library imports this module; ``benchmarks/uci.py`` and
``benchmarks/uci_diagnose.py`` use it to measure candidate fixes before they move into the
refactored core.

:class:`ProtoVGPN` wraps a :class:`~pyro_gpn.models.variational.VariationalGPN`
(``head="gaussian"``) and evaluates the same closed-form ELBO (``eq:gpn_vi_l``) with three
treatments of the weights:

* ``weights="point"``: ``W`` is a point estimate without a prior -- the library's
  :class:`~pyro_gpn.inference.ClosedFormELBO` exactly;
* ``weights="map"``: a Gaussian prior ``W_ij ~ N(0, s_l^2)`` and its log density added to the
  ELBO (weight decay);
* ``weights="vi"``: mean-field ``q(W_ij) = N(m_ij, v_ij)`` with ``KL(q(W) || p(W))`` in the
  objective, as DVI (Wu et al. 2019) and deep GPs treat their parameters. The activations
  ``A = X W`` of a sample then have mean ``E[X] m`` and variance
  ``Var[X] m^2 + (E[X]^2 + Var[X]) v`` (independent inputs and weights), which the GPN layer's
  moment propagation (``eq:gpn_vi_mu``, ``eq:gpn_vi_marginal_sigma_fl``) takes as it is.

``s_l^2 = prior_scale^2 / fan_in`` (fan-in scaling keeps activations of standardised inputs of
order one, inside the inducing range).

The observation noise optionally has a floor: ``sigma_eff^2 = sigma^2 + noise_floor^2``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .losses import gaussian_expected_nll
from .models.variational import VariationalGPN
from .moments.gaussian import Moments
from .moments.propagate import response_moments

__all__ = ["ProtoVGPN", "ProtoFit", "fit_proto"]

WEIGHTS = ("point", "map", "vi")


def _layer_moments(layer, inputs: Moments | Tensor, w_var: Tensor | None, noise: bool) -> Moments:
    """Moments of a variational GPN layer's outputs with (optionally) Gaussian weights."""
    if isinstance(inputs, Tensor):
        m, v = inputs, None
    else:
        m, v = inputs.mean, inputs.var
    weight = layer.weight
    mean = m @ weight
    var = None
    if v is not None:
        var = v @ weight.square()
    if w_var is not None:
        second = m.square() if v is None else m.square() + v
        extra = second @ w_var
        var = extra if var is None else var + extra
    acts = Moments(mean, var=var, validate=False)
    if layer.compute_dtype is not None:
        acts = acts.to(layer.compute_dtype)
    beta, reduction = layer.response_weights()
    out = response_moments(
        acts,
        layer.compute_inducing_points(),
        layer.to_compute(layer.lengthscales),
        beta,
        reduction,
        layer.to_compute(layer.noise_std.square()) if noise else None,
        "meanvar",
        equidistant=layer._equidistant,
    )
    return out.to(mean.dtype)


class ProtoVGPN(nn.Module):
    """Closed-form variational GPN with point, MAP or variational weights (module docstring).

    Args:
        sizes: ``[D, N_1, ..., N_L]`` (gaussian head).
        weights: ``"point"``, ``"map"`` or ``"vi"``.
        prior_scale: prior std of ``W`` times ``sqrt(fan_in)``.
        weight_std_init: initial std of ``q(W)`` (``"vi"``), times ``1 / sqrt(fan_in)``.
        noise_floor: floor added (in quadrature) to the observation noise std.
        **vgpn_kwargs: passed to :class:`VariationalGPN` (``whiten``, ``q_cov``,
            ``targets_init``, ``noise_std_init``, ``num_inducing``, ...).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        weights: str = "point",
        prior_scale: float = 1.0,
        weight_std_init: float = 1e-2,
        noise_floor: float = 0.0,
        **vgpn_kwargs,
    ) -> None:
        super().__init__()
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
        self.vgpn = VariationalGPN(list(sizes), head="gaussian", **vgpn_kwargs)
        self.weights = weights
        self.prior_scale = float(prior_scale)
        self.noise_floor = float(noise_floor)
        self.weight_log_std = nn.ParameterList()
        if weights == "vi":
            for layer in self.vgpn.layers:
                std = weight_std_init / math.sqrt(layer.in_features)
                self.weight_log_std.append(
                    nn.Parameter(torch.full_like(layer.weight, math.log(std)))
                )

    @property
    def layers(self):
        return self.vgpn.layers

    def prior_std(self, layer) -> float:
        return self.prior_scale / math.sqrt(layer.in_features)

    def weight_var(self, l: int) -> Tensor | None:
        if self.weights != "vi":
            return None
        return (2 * self.weight_log_std[l]).exp()

    def noise_std(self) -> Tensor:
        sigma = self.layers[-1].noise_std
        if self.noise_floor > 0:
            return (sigma.square() + self.noise_floor**2).sqrt()
        return sigma

    def hidden_moments(self, x: Tensor) -> Moments:
        moments: Moments | Tensor = x
        last = len(self.layers) - 1
        for l, layer in enumerate(self.layers):
            moments = _layer_moments(layer, moments, self.weight_var(l), noise=l != last)
        return moments

    def weight_regulariser(self) -> Tensor:
        """``KL(q(W) || p(W))`` (``"vi"``), ``-log p(W)`` (``"map"``), or 0."""
        total = torch.zeros((), dtype=self.layers[0].weight.dtype)
        if self.weights == "point":
            return total
        for l, layer in enumerate(self.layers):
            s2 = self.prior_std(layer) ** 2
            w = layer.weight
            if self.weights == "map":
                total = total + 0.5 * (w.square() / s2 + math.log(2 * math.pi * s2)).sum()
            else:
                v = self.weight_var(l)
                total = total + 0.5 * ((v + w.square()) / s2 - 1 - (v / s2).log()).sum()
        return total

    def elbo(self, x: Tensor, y: Tensor) -> Tensor:
        features = self.hidden_moments(x)
        nll = gaussian_expected_nll(features, y, self.noise_std(), reduction="sum")
        return -nll - self.vgpn.kl_divergence() - self.weight_regulariser()

    @torch.no_grad()
    def predictive(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Predictive mean and variance (noise included), standardised units, ``[S]`` each."""
        features = self.hidden_moments(x)
        var = features.variance + self.noise_std().square()
        return features.mean.reshape(-1), var.reshape(-1)


def gaussian_log_lik(mean: Tensor, var: Tensor, y: Tensor) -> float:
    """Mean log density of ``y`` under ``N(mean, var)`` (standardised units)."""
    y = y.reshape(-1).to(mean.dtype)
    return float((-0.5 * (math.log(2 * math.pi) + var.log() + (y - mean).square() / var)).mean())


@dataclass
class ProtoFit:
    """What :func:`fit_proto` returns."""

    steps: int = 0
    best_step: int = 0
    best_val_ll: float = -math.inf
    final_val_ll: float = math.nan
    wall_s: float = 0.0
    eval_s: float = 0.0
    curve: list[tuple[int, float]] = field(default_factory=list)


def fit_proto(
    model: ProtoVGPN,
    x: Tensor,
    y: Tensor,
    x_val: Tensor | None = None,
    y_val: Tensor | None = None,
    num_steps: int = 2000,
    lr: float = 5e-2,
    lr_decay: float = 0.1,
    eval_every: int = 25,
    early_stopping: bool = True,
    patience: int | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    log=None,
) -> ProtoFit:
    """Adam on the negative ELBO with ``lr * lr_decay ** (step / num_steps)`` (as
    :func:`~pyro_gpn.inference.fit_svi`'s ``lr_decay``); every ``eval_every`` steps the
    validation log-likelihood is recorded, and with ``early_stopping`` the best state is restored
    at the end (``patience``: evaluations without improvement before stopping; ``None``: run all
    steps)."""
    torch.manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    gamma = lr_decay ** (1.0 / max(num_steps, 1))
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma)
    out = ProtoFit()
    best_state, since = None, 0
    num_data = x.shape[0]
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for step in range(1, num_steps + 1):
        if batch_size is None or batch_size >= num_data:
            loss = -model.elbo(x, y) / num_data
        else:
            idx = torch.randperm(num_data, generator=gen)[:batch_size]
            feats = model.hidden_moments(x[idx])
            nll = gaussian_expected_nll(feats, y[idx], model.noise_std(), reduction="sum")
            kl = model.vgpn.kl_divergence() + model.weight_regulariser()
            loss = (nll * (num_data / batch_size) + kl) / num_data
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss {float(loss)} at step {step}")
        opt.step()
        sched.step()
        out.steps = step
        if x_val is not None and (step % eval_every == 0 or step == num_steps):
            t0 = time.perf_counter()
            val_ll = gaussian_log_lik(*model.predictive(x_val), y_val)
            out.curve.append((step, val_ll))
            out.final_val_ll = val_ll
            if val_ll > out.best_val_ll:
                out.best_val_ll, out.best_step, since = val_ll, step, 0
                if early_stopping:
                    best_state = copy.deepcopy(model.state_dict())
            else:
                since += 1
            out.eval_s += time.perf_counter() - t0
            if log is not None and step % (eval_every * 20) == 0:
                log(f"  step {step} loss {float(loss):.4f} val_ll {val_ll:.4f}")
            if patience is not None and since > patience:
                break
    out.wall_s = time.perf_counter() - start - out.eval_s
    if early_stopping and best_state is not None:
        model.load_state_dict(best_state)
    return out
