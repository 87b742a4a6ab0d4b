r"""The paper's deterministic ELBO of the variational GPN, as a Pyro loss.

For a :class:`~pyro_gpn.models.variational.VariationalGPN` with ``L`` layers,
``eq:gpn_vi_sampling_l`` splits into ``L = -L_reg + L_pred`` (``eq:gpn_vi_l``):

.. math::

    L_{\rm reg} = \sum_l \sum_n \mathrm{KL}\big(q(U^l_{\star n}) \,\|\, p(U^l_{\star n})\big)
        \qquad (\text{eq:gpn\_vi\_sampling\_la}),

    L_{\rm pred} = \frac{S}{B} \sum_{s \in \text{batch}}
        \mathbb{E}_{Q(F^L_s \mid X^0_s)}\big[\log p(y_s \mid F^L_s)\big]
        \qquad (\text{eq:gpn\_lpred\_exp}).

``L_pred`` is evaluated by propagating means and variances (or covariances) layer by layer
(``eq:gpn_vi_a``, ``eq:gpn_vi_mu``, ``eq:gpn_vi_marginal_sigma_fl``,
``eq:gpn_vi_marginal_sigma2_fl``, through :meth:`GPNLayerBase.propagate
<pyro_gpn.layers.base.GPNLayerBase.propagate>`) and then

* regression: ``eq:gpn_lpred_marginal_final`` (:func:`pyro_gpn.losses.gaussian_expected_nll`,
  which keeps the ``-1/2 log 2 pi`` per output that the paper drops, so the value is the ELBO
  itself and comparable with :class:`~pyro.infer.Trace_ELBO`);
* classification: the unscented transform of the expected log-softmax
  (:func:`pyro_gpn.losses.unscented_cross_entropy`).

**Exactness.** With one GPN layer and observed inputs, regression, the propagated moments of
``F^1`` are exact and so is the objective: it equals the expectation of ``Trace_ELBO`` on
``VariationalGPN.model`` / ``.guide`` (tested to Monte Carlo precision). With more layers the
hidden activations are replaced by Gaussians with the same mean and variance (``eq:gpn_vi_qal``),
an approximation whose error is measured in the tests; the softmax head adds the unscented
transform's error.

**Cost.** Per step ``O(B sum_l N_l (M_l + R)) `` for the mean and variance path (``2R - 1``
exponentials per unit and sample with equidistant inducing points), ``O(B N_l^2 R^2)`` per layer
with ``mode="cov"``, and ``O(sum_l N_l R^3)`` for the Choleskys and the KL, one deterministic
pass instead of one forward pass of ``model`` and ``guide`` per particle.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import pyro
import torch
from pyro.infer import ELBO
from pyro.infer.util import torch_item
from torch import Tensor

from .. import settings
from .._validation import check_class_labels, check_finite, check_int, check_ndim, check_tensor
from ..models._contract import check_num_data
from ..models.variational import VariationalGPN
from .calibration import fit_predictive_scale

__all__ = [
    "ClosedFormELBO",
    "VGPNFit",
    "closed_form_elbo",
    "fit_vgpn",
    "holdout",
    "predictive_log_likelihood",
    "validation_log_lik",
]


def closed_form_elbo(
    vgpn: VariationalGPN, x: Tensor, y: Tensor | None = None, num_data: int | None = None
) -> Tensor:
    """The ELBO ``-L_reg + L_pred`` of ``vgpn`` on a (mini-)batch, differentiable, a scalar.

    Args:
        vgpn: the variational GPN.
        x: ``[B, M]`` inputs.
        y: ``[B, N_L]`` targets (gaussian head) or ``[B]`` labels (softmax head).
        num_data: ``S``, the size of the data set ``x`` is a batch of (default:
            ``vgpn.num_data``, else ``B``), a positive integer; the likelihood is scaled by
            ``S / B``.

    Raises:
        ValueError: no ``y``, an empty batch, a ``num_data`` that is not a positive integer,
            or (from the network) inputs or targets that do not fit it.
    """
    scale = _likelihood_scale(vgpn, x, y, num_data, "the closed-form ELBO")
    return scale * vgpn.expected_log_likelihood(x, y).sum() - vgpn.kl_divergence()


def predictive_log_likelihood(
    vgpn: VariationalGPN, x: Tensor, y: Tensor | None = None, num_data: int | None = None
) -> Tensor:
    r"""The predictive log-likelihood objective of ``vgpn`` on a (mini-)batch, a scalar:

    .. math::

        \frac{S}{B} \sum_{s \in \text{batch}} \log \mathbb{E}_{Q(F^L_s \mid X^0_s)}
            \big[p(y_s \mid F^L_s)\big] - L_{\rm reg},

    the ELBO (:func:`closed_form_elbo`) with the expectation moved inside the logarithm: the
    log density of each target under the closed-form predictive (``head.log_predictive``:
    ``N(y | E[F], Var[F] + sigma^2)`` for the Gaussian head, the Gauss-Hermite mixture of the
    heteroscedastic head, the averaged softmax), minus the same KL. It is the objective of
    parametric predictive GP regression (PPGPR; Jankowiak, Pleiss & Gardner, ICML 2020;
    GPyTorch's ``mlls.PredictiveLogLikelihood``). By Jensen's inequality it is at least the
    ELBO, and it is not a bound on the evidence: it fits ``Q`` to predict the training targets.
    Under the ELBO the optimal noise variance is ``E[(y - F)^2] = (y - E F)^2 + Var[F]``, so
    the fitted noise absorbs ``Var[F]`` and the predictive ``Var[F] + sigma^2`` counts it twice
    (measured on UCI sets: ``docs/results/uci.md`` section 10); here ``Var[F]`` and
    ``sigma^2`` share one budget.

    Args:
        vgpn, x, y, num_data: as :func:`closed_form_elbo`.

    Raises:
        ValueError: as :func:`closed_form_elbo`.
    """
    scale = _likelihood_scale(vgpn, x, y, num_data, "the predictive log-likelihood")
    # a training objective: the head's calibration scale (fitted after training) stays out
    return scale * vgpn.log_predictive(x, y, calibrated=False).sum() - vgpn.kl_divergence()


def _likelihood_scale(
    vgpn: VariationalGPN, x: Tensor, y: Tensor | None, num_data: int | None, objective: str
) -> float:
    """``S / B``, the data term's scale of a batch of ``B`` rows out of ``S`` (``num_data``,
    else ``vgpn.num_data``, else ``B``); a batch without targets or rows, or a ``num_data``
    that is not a positive integer, raises."""
    num_data = check_num_data(num_data)
    if y is None:
        raise ValueError(f"{objective} needs observations y")
    batch = x.shape[0]
    if batch == 0:
        raise ValueError(f"x has 0 samples (rows): {objective} of an empty batch is undefined")
    num_data = vgpn.num_data if num_data is None else num_data
    return 1.0 if num_data is None else num_data / batch


class ClosedFormELBO(ELBO):
    """The deterministic ELBO of a :class:`~pyro_gpn.models.variational.VariationalGPN`.

    The objective takes its model explicitly (as GPyTorch's ``VariationalELBO(likelihood,
    model, num_data)``), and is a drop-in loss for :class:`pyro.infer.SVI`::

        svi = SVI(vgpn.model, vgpn.guide, optim, loss=ClosedFormELBO(vgpn))
        svi.step(x, y)                      # or svi.step(x_batch, y_batch, num_data=S)

    It does not trace ``model`` and ``guide``: it evaluates :func:`closed_form_elbo` of its
    network with the step's arguments ``(x, y, num_data)``. The evaluation runs inside the
    network's ``pyro_method``\\ s, so every parameter goes through ``pyro.param`` and
    :class:`~pyro.infer.SVI` (which collects the parameters touched during
    :meth:`loss_and_grads`) optimises all of them. With ``pyro.settings``'
    ``module_local_params`` use ``ClosedFormELBO(vgpn)(vgpn.model, vgpn.guide)``, a
    ``torch.nn.Module`` whose forward is :meth:`differentiable_loss`, with a torch optimiser.

    Args:
        vgpn: the network whose ELBO this is. Deprecated: without it the network is found as
            the owner of the bound method ``model`` (a ``DeprecationWarning``; removed in the
            next release).

    Like Pyro's ELBOs, :meth:`loss` and :meth:`loss_and_grads` return the *negative* ELBO as a
    float; :meth:`differentiable_loss` returns it as a tensor.
    """

    def __init__(self, vgpn: VariationalGPN | None = None) -> None:
        super().__init__(num_particles=1, max_plate_nesting=1)
        if vgpn is None:
            warnings.warn(
                "ClosedFormELBO() without its network is deprecated: use ClosedFormELBO(vgpn)",
                DeprecationWarning,
                stacklevel=2,
            )
        elif not isinstance(vgpn, VariationalGPN):
            raise TypeError(f"vgpn must be a VariationalGPN, got {type(vgpn).__name__}")
        self.vgpn = vgpn

    def _get_trace(self, model, guide, args, kwargs):
        raise NotImplementedError("ClosedFormELBO evaluates the ELBO without tracing")

    def differentiable_loss(self, model, guide, *args, **kwargs) -> Tensor:
        """The negative ELBO as a differentiable scalar tensor (``model`` and ``guide`` are
        not called; ``args`` and ``kwargs`` are those of :func:`closed_form_elbo`)."""
        return -closed_form_elbo(self.vgpn or _owner(model, guide), *args, **kwargs)

    def loss(self, model, guide, *args, **kwargs) -> float:
        """The negative ELBO as a float (no gradients)."""
        with torch.no_grad():
            return torch_item(self.differentiable_loss(model, guide, *args, **kwargs))

    def loss_and_grads(self, model, guide, *args, **kwargs) -> Tensor:
        """The negative ELBO (a detached scalar tensor: no device sync); accumulates its
        gradients into the parameters."""
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        if loss.requires_grad:
            loss.backward(retain_graph=self.retain_graph)
        return loss.detach()


def _owner(model, guide) -> VariationalGPN:
    """The deprecated discovery of the network from its bound ``model`` and ``guide``."""
    owner = getattr(model, "__self__", None)
    if not isinstance(owner, VariationalGPN):
        raise ValueError(
            "ClosedFormELBO needs its network: ClosedFormELBO(vgpn) (the model given is not "
            "VariationalGPN.model)"
        )
    if getattr(guide, "__self__", None) is not owner:
        raise ValueError("model and guide must be methods of the same VariationalGPN")
    return owner


# ---------------------------------------------------------------------------------- training
@dataclass
class VGPNFit:
    """What :func:`fit_vgpn` returns.

    Attributes:
        losses: the per-sample negative ELBO of every step (``-ELBO / num_data``).
        curve: ``(step, validation log-likelihood)`` at every evaluation.
        best_step: the step whose state was restored (the last step without validation).
        best_val_log_lik: its mean validation log predictive density (in the units of the
            data given).
        num_steps: steps run.
        wall_time: seconds in the optimisation steps (validation excluded).
        eval_time: seconds spent on the validation evaluations.
        stopped_early: the patience ran out before the step budget.
        num_train, num_val: training rows fitted and validation rows (0: no validation).
        predictive_scale: with ``calibrate=True``, the predictive scale fitted on the
            validation rows (one per output, or the softmax head's temperature;
            :func:`~pyro_gpn.inference.fit_predictive_scale`), else ``None``.
    """

    losses: list[float] = field(default_factory=list)
    curve: list[tuple[int, float]] = field(default_factory=list)
    best_step: int = 0
    best_val_log_lik: float = -math.inf
    num_steps: int = 0
    wall_time: float = 0.0
    eval_time: float = 0.0
    stopped_early: bool = False
    num_train: int = 0
    num_val: int = 0
    predictive_scale: list[float] | None = None


def _grads_finite(params: list[Tensor]) -> bool:
    """Whether every gradient of ``params`` is finite (``None`` gradients count as finite), in
    one reduction over the concatenated gradients (one check per parameter costs a dozen small
    kernels and synchronisations per step)."""
    grads = [p.grad.reshape(-1) for p in params if p.grad is not None]
    if not grads:
        return True
    if len({(g.device, g.dtype) for g in grads}) > 1:
        return all(bool(torch.isfinite(g).all()) for g in grads)
    return bool(torch.isfinite(torch.cat(grads)).all())


def validation_log_lik(vgpn: VariationalGPN, x: Tensor, y: Tensor) -> float:
    """Mean log predictive density of ``y`` under ``vgpn``'s closed-form predictive (the head's
    :meth:`~pyro_gpn.heads.Head.log_predictive`): the moment-matched Gaussian
    ``N(mean, var + sigma^2)`` of a Gaussian head, the Gauss-Hermite mixture of a
    heteroscedastic one, the class probabilities of a softmax head."""
    with torch.no_grad():
        return float(vgpn.log_predictive(x, y).mean())


def holdout(
    x: Tensor, y: Tensor, fraction: float, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Split ``(x, y)`` into training and validation rows: a seeded random ``fraction`` (at
    least one row, at most all but one) for validation. Returns ``x_train, y_train, x_val,
    y_val``."""
    if not 0 < fraction < 1:
        raise ValueError(f"val_fraction must lie in (0, 1), got {fraction!r}")
    num = x.shape[0]
    if num < 2:
        raise ValueError(f"x needs at least 2 rows for a validation hold-out, got {num}")
    num_val = min(max(1, round(fraction * num)), num - 1)
    perm = torch.randperm(num, generator=torch.Generator().manual_seed(seed)).to(x.device)
    val, train = perm[:num_val], perm[num_val:]
    return x[train], y[train], x[val], y[val]


def _check_fit_data(
    vgpn: VariationalGPN, x: Tensor, y: Tensor, x_val: Tensor | None, y_val: Tensor | None
) -> None:
    """:func:`fit_vgpn`'s data on entry, before the hold-out indexes them and the loop turns
    validation off: tensors, one row of ``y`` per row of ``x`` (``y_val`` per row of
    ``x_val``, at least one), ``x_val`` with ``x``'s columns and ``y_val`` with ``y``'s
    trailing shape, class labels in the head's range (always, as an out-of-range label would
    train silently: one device synchronisation per label tensor, a ``torch.aminmax`` read
    back), finite floating values (while validation is on: one per tensor)."""
    check_ndim("x", check_tensor("x", x), 2)
    if not isinstance(y, Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    if y.shape[:1] != x.shape[:1]:
        raise ValueError(
            f"y must have one row per row of x ({x.shape[0]}), got y of shape {tuple(y.shape)}"
        )
    if x_val is not None:
        check_ndim("x_val", check_tensor("x_val", x_val), 2)
        if not isinstance(y_val, Tensor):
            raise TypeError(f"y_val must be a torch.Tensor, got {type(y_val).__name__}")
        if x_val.shape[0] == 0:
            raise ValueError(
                "x_val has 0 rows: validation needs at least one (for none, pass neither x_val "
                "nor y_val and val_fraction=0)"
            )
        if x_val.shape[1] != x.shape[1]:
            raise ValueError(f"x_val must have x's {x.shape[1]} columns, got {x_val.shape[1]}")
        if y_val.shape[:1] != x_val.shape[:1] or y_val.shape[1:] != y.shape[1:]:
            raise ValueError(
                f"y_val must have one row per row of x_val ({x_val.shape[0]}) and y's trailing "
                f"shape {tuple(y.shape[1:])}, got {tuple(y_val.shape)}"
            )
    classes = getattr(vgpn.head, "num_classes", None)
    for name, value in (("x", x), ("y", y), ("x_val", x_val), ("y_val", y_val)):
        if value is None:
            continue
        if name.startswith("y") and classes is not None:
            check_class_labels(name, value, classes)
        elif value.is_floating_point():
            check_finite(name, value)


def fit_settings(
    *,
    num_steps: int | None = None,
    lr: float | None = None,
    lr_decay: float | None = None,
    eval_every: int | None = None,
    patience: int | None = None,
    elbo: str | None = None,
    noise_warmup: int | None = None,
) -> dict:
    """:func:`fit_vgpn`'s schedule and objective, each ``None`` replaced by the recommendation
    (:data:`pyro_gpn.recommended.VGPN`), checked: the dict of the seven values.

    Raises:
        ValueError: naming a value out of range or of the wrong type.
    """
    from ..recommended import VGPN

    out = {
        "num_steps": VGPN.num_steps if num_steps is None else num_steps,
        "lr": VGPN.lr if lr is None else lr,
        "lr_decay": VGPN.lr_decay if lr_decay is None else lr_decay,
        "eval_every": VGPN.eval_every if eval_every is None else eval_every,
        "patience": VGPN.patience if patience is None else patience,
        "elbo": VGPN.elbo if elbo is None else elbo,
        "noise_warmup": VGPN.noise_warmup if noise_warmup is None else noise_warmup,
    }
    for name in ("num_steps", "eval_every"):
        out[name] = check_int(name, out[name], 1)
    for name in ("patience", "noise_warmup"):
        out[name] = check_int(name, out[name], 0)
    lr, lr_decay = out["lr"], out["lr_decay"]
    if isinstance(lr, bool) or not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if isinstance(lr_decay, bool) or not (isinstance(lr_decay, (int, float)) and 0 < lr_decay <= 1):
        raise ValueError(f"lr_decay must lie in (0, 1], got {lr_decay!r}")
    if out["elbo"] not in ("closed_form", "trace", "predictive"):
        raise ValueError(
            f"elbo must be 'closed_form', 'trace' or 'predictive', got {out['elbo']!r}"
        )
    return out


def fit_vgpn(
    vgpn: VariationalGPN,
    x: Tensor,
    y: Tensor,
    x_val: Tensor | None = None,
    y_val: Tensor | None = None,
    *,
    val_fraction: float | None = None,
    num_steps: int | None = None,
    lr: float | None = None,
    lr_decay: float | None = None,
    batch_size: int | None | str = "auto",
    eval_every: int | None = None,
    patience: int | None = None,
    seed: int | None = 0,
    clear_param_store: bool = True,
    log: Callable[[str], None] | None = None,
    elbo: str | None = None,
    num_particles: int = 1,
    noise_warmup: int | None = None,
    calibrate: bool | None = None,
) -> VGPNFit:
    """Fit the closed-form variational GPN with validation stopping (the recommended route).

    Adam on the per-sample negative objective: by default (the recommendation) the
    closed-form predictive log-likelihood objective, ``-predictive_log_likelihood / num_data``;
    with ``elbo="closed_form"`` the paper's closed-form ELBO, ``-closed_form_elbo / num_data``
    (mini-batches scaled by ``num_data / B``); or, with ``elbo="trace"``, Pyro's Monte
    Carlo estimate of the same ELBO (:class:`~pyro.infer.Trace_ELBO` on ``vgpn.model`` /
    ``vgpn.guide``, ``num_particles`` vectorised particles: reparameterised draws of ``W``,
    ``U`` and every layer's responses; its expectation is the closed form's with one GPN layer,
    and the exact ELBO of which the closed form is the moment-matched approximation with more),
    so that the two objectives can be compared with everything else equal. The learning rate
    decays exponentially from ``lr`` to ``lr * lr_decay`` over ``num_steps``. Every
    ``eval_every`` steps (and at the last) the validation log-likelihood
    (:func:`validation_log_lik`) is recorded; the best state is kept and restored at the end,
    and the loop stops once more than ``patience``
    evaluations in a row brought no improvement. Every ``None`` argument is the
    recommendation :data:`pyro_gpn.recommended.VGPN`.

    Args:
        vgpn: the network (its ``num_data`` is set to the number of training rows).
        x, y: ``[S, M]`` training inputs and ``[S, D]`` targets (or ``[S]`` labels).
        x_val, y_val: a validation set; ``None``: a seeded ``val_fraction`` of ``(x, y)`` is
            held out (inside the training data: never pass test data here).
        val_fraction: the hold-out share when ``x_val`` is ``None`` (``0``: no validation,
            no stopping, the final state is kept).
        num_steps, lr, lr_decay: the step budget and the learning-rate schedule.
        batch_size: mini-batch size, ``None`` for full batch, ``"auto"`` for the
            recommendation by data size (``VGPN.batch_for``).
        eval_every, patience: the stopping rule (``patience`` in evaluations).
        seed: seeds the hold-out and the mini-batch draws (``None``: unseeded).
        clear_param_store: call :func:`pyro.clear_param_store` first (as
            :func:`~pyro_gpn.inference.fit_svi`). The package's networks compute with their own
            parameters either way (:class:`~pyro_gpn.pyro_module.GPNModule`); ``False`` keeps
            other entries of the store.
        log: called with a line of text at every 20th evaluation.
        elbo: the objective: ``"predictive"`` (:func:`predictive_log_likelihood`: the
            closed-form predictive log-likelihood minus the KL, not a bound; PPGPR; the
            recommendation), ``"closed_form"`` (the paper's deterministic ELBO) or
            ``"trace"`` (Pyro's ``Trace_ELBO``, sampled). The validation score is the
            closed-form predictive of ``q`` in every case.
        num_particles: the ``Trace_ELBO``'s particles per step (``elbo="trace"`` only).
        noise_warmup: for this many first steps the head's parameters (the observation noise)
            stay at their initial values while everything else trains; the objective is
            unchanged. Early on the network's mean explains little, a learnable noise grows to
            cover the residuals and flattens the data term's gradient (it scales as
            ``1 / sigma^2``), and a fit can settle in that noise-dominated optimum; holding the
            noise lets the mean fit first. Measured on naval (``docs/results/uci.md``
            section 16).
        calibrate: after restoring the best state, fit the head's predictive scale on the
            validation rows (:func:`~pyro_gpn.inference.fit_predictive_scale`: for a regression
            head ``sigma``-scaling, the predictive stretched about its mean so that the
            validation rows' log density is highest; for a softmax head the temperature of the
            logits); needs validation rows. The fit starts from scale 1 either way (an earlier
            calibration no longer applies).
            Measured on the UCI benchmark (``docs/results/uci.md`` section 17).

    Returns:
        :class:`VGPNFit`.

    Raises:
        TypeError: ``vgpn`` is not a ``VariationalGPN``, or the data are not tensors.
        ValueError: naming the argument: ``y`` without one row per row of ``x`` (``y_val``
            per row of ``x_val``), ``x_val`` with no rows or other columns than ``x``, class
            labels (softmax head) that are not integers in ``[0, C)``, NaN or infinite values
            (while validation is on), or a setting out of range.
        FloatingPointError: a non-finite loss or gradient (the parameters keep the values of
            the step before).
    """
    from ..recommended import VGPN

    if not isinstance(vgpn, VariationalGPN):
        raise TypeError(f"vgpn must be a VariationalGPN, got {type(vgpn).__name__}")
    if (x_val is None) != (y_val is None):
        raise ValueError("give both x_val and y_val, or neither")
    _check_fit_data(vgpn, x, y, x_val, y_val)
    schedule = fit_settings(
        num_steps=num_steps,
        lr=lr,
        lr_decay=lr_decay,
        eval_every=eval_every,
        patience=patience,
        elbo=elbo,
        noise_warmup=noise_warmup,
    )
    num_steps, lr, lr_decay = schedule["num_steps"], schedule["lr"], schedule["lr_decay"]
    eval_every, patience, elbo = schedule["eval_every"], schedule["patience"], schedule["elbo"]
    noise_warmup = schedule["noise_warmup"]
    calibrate = VGPN.calibrate if calibrate is None else calibrate
    if not isinstance(calibrate, bool):
        raise ValueError(f"calibrate must be True or False, got {calibrate!r}")
    if calibrate and not hasattr(vgpn.head, "predictive_scale"):
        raise ValueError(
            f"calibrate=True needs a head with a predictive scale, got {type(vgpn.head).__name__}"
        )
    num_particles = check_int("num_particles", num_particles, 1)
    if num_particles > 1 and elbo != "trace":
        raise ValueError("num_particles applies to elbo='trace' only")
    if x_val is None:
        fraction = VGPN.val_fraction if val_fraction is None else val_fraction
        if fraction:
            x, y, x_val, y_val = holdout(x, y, fraction, 0 if seed is None else seed)
    elif val_fraction:
        raise ValueError("val_fraction holds out rows only when no x_val is given")
    if calibrate and x_val is None:
        raise ValueError(
            "calibrate=True fits the predictive scale on validation rows: give "
            "x_val and y_val, or a val_fraction > 0"
        )
    if getattr(vgpn.head, "predictive_scale", None) is not None:
        vgpn.head.predictive_scale.fill_(1.0)
    num_data = x.shape[0]
    if batch_size == "auto":
        batch_size = VGPN.batch_for(num_data)
    batch_size = check_int("batch_size", batch_size, 1, none_ok=True)
    full = batch_size is None or batch_size >= num_data
    vgpn.num_data = num_data
    out = VGPNFit(num_train=num_data, num_val=0 if x_val is None else int(x_val.shape[0]))
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    best, since = None, 0
    if clear_param_store:
        pyro.clear_param_store()
    if elbo == "trace":
        if seed is not None:
            pyro.set_rng_seed(seed)
        estimator = pyro.infer.Trace_ELBO(
            num_particles=num_particles, vectorize_particles=num_particles > 1, max_plate_nesting=1
        )

        def objective(xb: Tensor, yb: Tensor) -> Tensor:
            return estimator.differentiable_loss(vgpn.model, vgpn.guide, xb, yb, num_data)

    else:
        closed_form = predictive_log_likelihood if elbo == "predictive" else closed_form_elbo

        def objective(xb: Tensor, yb: Tensor) -> Tensor:
            return -closed_form(vgpn, xb, yb, num_data=num_data)

    params = [p for p in vgpn.parameters() if p.requires_grad]
    held = [p for p in vgpn.head.parameters() if p.requires_grad] if noise_warmup else []
    # foreach: one pass per parameter group instead of a loop of small ops (the same steps)
    opt = torch.optim.Adam(params, lr=lr, foreach=True)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, lr_decay ** (1.0 / num_steps))
    for step in range(1, num_steps + 1):
        start = time.perf_counter()
        if full:
            xb, yb = x, y
        else:
            index = torch.randperm(num_data, generator=gen)[:batch_size].to(x.device)
            xb, yb = x[index], y[index]
        with settings.validation(False):  # the data were checked on entry
            loss = objective(xb, yb) / num_data
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step <= noise_warmup:
            for p in held:  # Adam skips a parameter without a gradient
                p.grad = None
        value = float(loss.detach())
        if not math.isfinite(value) or not _grads_finite(params):
            raise FloatingPointError(
                f"fit_vgpn: non-finite loss or gradient at step {step} (loss {value:.6g}); "
                "the parameters keep their last finite values: try a smaller lr"
            )
        opt.step()
        sched.step()
        out.losses.append(value)
        out.num_steps = step
        out.wall_time += time.perf_counter() - start
        if x_val is None or (step % eval_every and step != num_steps):
            continue
        start = time.perf_counter()
        with settings.validation(False):
            val = validation_log_lik(vgpn, x_val, y_val)
        out.curve.append((step, val))
        if val > out.best_val_log_lik:
            out.best_val_log_lik, out.best_step, since = val, step, 0
            best = copy.deepcopy(vgpn.state_dict())
        else:
            since += 1
        out.eval_time += time.perf_counter() - start
        if log is not None and len(out.curve) % 20 == 0:
            log(f"step {step}: loss {value:.4f}, validation log-lik {val:.4f}")
        if since > patience:
            out.stopped_early = True
            break
    if best is not None:
        vgpn.load_state_dict(best)
    else:
        out.best_step = out.num_steps
    if calibrate:
        with settings.validation(False):
            out.predictive_scale = fit_predictive_scale(vgpn, x_val, y_val).tolist()
    return out
