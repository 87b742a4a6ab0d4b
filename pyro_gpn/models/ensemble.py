"""A mixture of independently fitted networks' closed-form predictives, equal-weight or weighted.

A variational GPN's ``q`` sits in one mode of the posterior; networks fitted from other
random starts sit in others. Their equal-weight mixture,

    ``p(y | x) = (1 / K) sum_k p_k(y | x)``,

is the deep ensemble of Lakshminarayanan et al. (2017) made of Bayesian networks: each member's
predictive already integrates its ``q(U)`` (and ``q(W)``), and the mixture averages over the
modes a single ``q`` cannot reach (Wilson & Izmailov 2020, "Bayesian deep learning and a
probabilistic perspective of generalization", the multi-basin ``MultiSWAG`` argument). It costs
``K`` fits and ``K`` forward passes. Measured on the UCI regression benchmark in
``docs/results/uci.md`` (section 19).

With ``weights`` the mixture is ``sum_k w_k p_k(y | x)``: the members may be different models
(different heads, widths, schedules) and the weights fitted on held-out rows by stacking
(:func:`pyro_gpn.inference.stacking_weights`, Yao et al. 2018; used by
:func:`pyro_gpn.inference.select_vgpn` with ``combine="stack"``).

The mixture adds the members' disagreement to their own spreads, so members that are each
calibrated can make a mixture that is too wide (kin8nm: 90 % intervals covering 95 %). The
mixture therefore has a predictive scale of its own, fitted on held-out rows by
:func:`pyro_gpn.inference.fit_predictive_scale` (section 20).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..heads import Prediction
from ..losses import log_mean_softmax

__all__ = ["NetworkEnsemble"]


class NetworkEnsemble(nn.Module):
    """The mixture of fitted networks' closed-form predictives (module docstring).

    **Mixture weights** (buffer ``mixture_weights`` ``[K]``): equal unless given. Member
    ``k``'s own predictive (its Gauss-Hermite or sigma-point components) enters with weight
    ``w_k``; every method below mixes with these weights.

    **Predictive scale** (buffer ``predictive_scale``, 1 unless calibrated; the members' own
    scales stay as they are and act first). Regression (``[D]``): the mixture's predictive of
    a new ``y`` is that of ``m + s (y - m)``, ``m`` the mixture's mean -- the whole mixture
    stretched about its mean, not each member about its own, so the members' disagreement
    shrinks or grows with their spreads; the variance is ``s^2`` times. Classification
    (``[1]``): a temperature ``T`` dividing every member's sigma-point logits (after the
    member's own temperature). Fitted on held-out rows by
    :func:`pyro_gpn.inference.fit_predictive_scale`, which accepts an ensemble; a scale of 1
    changes no bit of the predictive.

    Args:
        members: ``K >= 1`` fitted networks with the same task and input width, each with
            ``hidden(x)`` and a ``head`` (:class:`~pyro_gpn.GPNNet`,
            :class:`~pyro_gpn.models.VariationalGPN`, their calibrated heads included).
        weights: ``[K]`` non-negative finite mixture weights summing to 1 (within ``1e-6``;
            they are then normalised), ``None``: ``1 / K`` each.

    Shape:
        ``x [S, M]`` -> :meth:`predict`: :class:`~pyro_gpn.heads.Prediction` ``[S, D]`` (class
        probabilities ``[S, C]``); :meth:`log_predictive`: ``[S]``.

    Raises:
        ValueError: no members; members of different tasks, input widths or output widths;
            weights of the wrong length, negative, not finite or not summing to 1.
        TypeError: a member without ``hidden`` and ``head``.
    """

    predictive_scale: Tensor
    mixture_weights: Tensor

    def __init__(
        self, members: Sequence[nn.Module], weights: Sequence[float] | Tensor | None = None
    ) -> None:
        super().__init__()
        members = list(members)
        if not members:
            raise ValueError("members must hold at least one fitted network, got none")
        for k, member in enumerate(members):
            if not (
                hasattr(member, "hidden") and isinstance(getattr(member, "head", None), nn.Module)
            ):
                raise TypeError(
                    f"members[{k}] ({type(member).__name__}) has no hidden(x) and head: give "
                    "GPNNet or VariationalGPN networks"
                )
        tasks = {member.head.task for member in members}
        widths = {member.sizes[0] for member in members}
        outputs = {member.sizes[-1] for member in members}
        if len(tasks) > 1 or len(widths) > 1 or len(outputs) > 1:
            raise ValueError(
                f"members must share one task, input width and output width, got tasks "
                f"{sorted(tasks)}, input widths {sorted(widths)} and output widths "
                f"{sorted(outputs)}"
            )
        self.members = nn.ModuleList(members)
        head = members[0].head
        width = head.num_outputs if self.task == "regression" else 1
        dtype = head.predictive_scale.dtype if hasattr(head, "predictive_scale") else None
        device = next(iter(members[0].parameters()), torch.empty(0)).device
        self.register_buffer("predictive_scale", torch.ones(width, dtype=dtype, device=device))
        self.register_buffer(
            "mixture_weights", _mixture_weights(weights, len(members), dtype).to(device)
        )

    @property
    def task(self) -> str:
        return self.members[0].head.task

    @property
    def num_outputs(self) -> int:
        """Regression: the number of outputs ``D``."""
        return self.members[0].head.num_outputs

    @property
    def num_classes(self) -> int:
        """Classification: the number of classes ``C``."""
        return self.members[0].head.num_classes

    def _is_scaled(self) -> bool:
        return bool((self.predictive_scale != 1).any())

    @torch.no_grad()
    def predict(self, x: Tensor, x_var: Tensor | None = None) -> Prediction:
        """The mixture's mean and standard deviation (regression), or its class probabilities
        and their standard deviation over the members and their posteriors (classification):
        ``mean = sum_k w_k m_k``, ``var = sum_k w_k (s_k^2 + m_k^2) - mean^2`` (the law of
        total variance, for both tasks); the standard deviation times the predictive scale, or the
        class probabilities at the temperature (class docstring)."""
        if self.task == "classification":
            mean, var = self._class_moments(x, x_var)
            return Prediction(mean, var.sqrt(), self.task)
        parts = [member.predict(x, x_var) for member in self.members]
        means = torch.stack([p.mean for p in parts])
        second = torch.stack([p.std.square() + p.mean.square() for p in parts])
        w = self.mixture_weights.to(means.dtype).reshape(-1, *([1] * (means.dim() - 1)))
        mean = (w * means).sum(0)
        std = ((w * second).sum(0) - mean.square()).clamp_min(0.0).sqrt()
        if self._is_scaled():
            std = std * self.predictive_scale.to(std.dtype)
        return Prediction(mean, std, self.task)

    def log_predictive(self, x: Tensor, y: Tensor) -> Tensor:
        """``log sum_k w_k p_k(y_s | x_s)`` per row ``[S]``: each member's joint density of
        the row's outputs under its closed-form predictive, mixed exactly; with a predictive
        scale ``s``, that of ``m + (y - m) / s`` less ``sum_d log s_d`` (regression), or the
        log probability of the label at the temperature (classification)."""
        if self.task == "classification":
            logits, weights = self._point_logits(x, None)
            logits = logits / self.predictive_scale.to(logits.dtype)
            return log_mean_softmax(logits, weights.to(logits.dtype), y)
        correction = None
        if self._is_scaled():
            weights, mean, _ = self._mixture(x)
            centre = torch.einsum("k,ksd->sd", weights, mean)
            scale = self.predictive_scale.to(centre.dtype)
            y = centre + (y.reshape(centre.shape).to(centre.dtype) - centre) / scale
            correction = scale.log().sum()
        logs = torch.stack(
            [member.head.log_predictive(member.hidden(x), y) for member in self.members]
        )
        log_w = self.mixture_weights.to(logs.dtype).log().reshape(-1, 1)
        out = torch.logsumexp(logs + log_w, 0)
        return out if correction is None else out - correction

    def predictive_mixture(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Regression: the mixture as Gaussian components, weights ``[K T]`` and means and
        variances ``[K T, S, D]`` (each member's ``T`` components, its weights times its
        mixture weight ``w_k``), stretched about the mixture's mean by the predictive scale,
        for interval quantiles and plots. Its per-output density equals :meth:`log_predictive` for
        ``D = 1``."""
        if self.task != "regression":
            raise ValueError("predictive_mixture exists for regression heads only")
        weights, mean, var = self._mixture(x)
        if not self._is_scaled():
            return weights, mean, var
        scale = self.predictive_scale.to(mean.dtype)
        centre = torch.einsum("k,ksd->sd", weights, mean)
        return weights, scale * mean + (1 - scale) * centre, scale.square() * var

    def point_logits(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Classification: every member's logits at its unscented sigma points, divided by the
        member's own temperature (not the ensemble's), and the points' weights times the
        member's mixture weight: ``[S, P, C]`` and ``[P]``, ``P`` the members' points together."""
        if self.task != "classification":
            raise ValueError("point_logits exists for classification heads only")
        return self._point_logits(x, None)

    def _mixture(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The members' components together, at the ensemble's scale 1."""
        parts = [member.head.predictive_mixture(member.hidden(x)) for member in self.members]
        shares = self.mixture_weights.tolist()
        weights = torch.cat([w.reshape(-1) * share for (w, _, _), share in zip(parts, shares)])
        return weights, torch.cat([m for _, m, _ in parts]), torch.cat([v for _, _, v in parts])

    def _point_logits(self, x: Tensor, x_var: Tensor | None) -> tuple[Tensor, Tensor]:
        logits, weights = [], []
        for member, share in zip(self.members, self.mixture_weights.tolist()):
            features = member.hidden(x) if x_var is None else member.hidden(x, x_var)
            member_logits, member_weights = member.head.point_logits(features)
            temperature = member.head.predictive_scale.to(member_logits.dtype)
            logits.append(member_logits / temperature)
            weights.append(member_weights * share)
        return torch.cat(logits, 1), torch.cat(weights)

    def _class_moments(self, x: Tensor, x_var: Tensor | None) -> tuple[Tensor, Tensor]:
        """Classification: the mean and variance ``[S, C]`` of the class probabilities over
        every member's sigma points at the ensemble's temperature (the points of member ``k``
        weighted ``w_p w_k``: the law of total variance over members and points at once)."""
        logits, weights = self._point_logits(x, x_var)
        probs = (logits / self.predictive_scale.to(logits.dtype)).softmax(-1)  # [S, P, C]
        weights = weights.view(1, -1, 1)
        mean = (weights * probs).sum(1)
        return mean, (weights * (probs - mean.unsqueeze(1)).square()).sum(1).clamp_min(0)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # a state saved before the ensemble had a predictive scale is an uncalibrated one
        state_dict.setdefault(prefix + "predictive_scale", torch.ones_like(self.predictive_scale))
        # and one saved before it had mixture weights an equal-weight one
        state_dict.setdefault(
            prefix + "mixture_weights",
            torch.full_like(self.mixture_weights, 1.0 / len(self.members)),
        )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        weights = ", ".join(f"{float(w):.3g}" for w in self.mixture_weights)
        return f"members={len(self.members)}, task={self.task!r}, weights=[{weights}]"


def _mixture_weights(weights, num_members: int, dtype) -> Tensor:
    """The ``[K]`` mixture weights ``NetworkEnsemble`` keeps: checked and normalised."""
    dtype = dtype or torch.get_default_dtype()
    if weights is None:
        return torch.full((num_members,), 1.0 / num_members, dtype=dtype)
    if isinstance(weights, Tensor):
        weights = weights.detach().to("cpu", dtype)
    else:
        try:
            weights = torch.as_tensor([float(w) for w in weights], dtype=dtype)
        except (TypeError, ValueError) as error:
            raise ValueError(f"weights must be a sequence of numbers, got {weights!r}") from error
    if weights.shape != (num_members,):
        raise ValueError(
            f"weights must be one number per member ({num_members}), got shape "
            f"{tuple(weights.shape)}"
        )
    if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
        raise ValueError(f"weights must be finite and non-negative, got {weights.tolist()}")
    if not abs(float(weights.sum()) - 1.0) <= 1e-6:
        raise ValueError(f"weights must sum to 1, got {float(weights.sum())!r}")
    return weights / weights.sum()
