"""An equal-weight mixture of independently fitted networks' closed-form predictives.

A variational GPN's ``q`` sits in one mode of the posterior; networks fitted from other
random starts sit in others. Their equal-weight mixture,

    ``p(y | x) = (1 / K) sum_k p_k(y | x)``,

is the deep ensemble of Lakshminarayanan et al. (2017) made of Bayesian networks: each member's
predictive already integrates its ``q(U)`` (and ``q(W)``), and the mixture averages over the
modes a single ``q`` cannot reach (Wilson & Izmailov 2020, "Bayesian deep learning and a
probabilistic perspective of generalization", the multi-basin ``MultiSWAG`` argument). It costs
``K`` fits and ``K`` forward passes. Measured on the UCI regression benchmark in
``docs/results/uci.md`` (section 19).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..heads import Prediction

__all__ = ["NetworkEnsemble"]


class NetworkEnsemble(nn.Module):
    """The equal-weight mixture of fitted networks' closed-form predictives (module docstring).

    Args:
        members: ``K >= 1`` fitted networks with the same task and input width, each with
            ``hidden(x)`` and a ``head`` (:class:`~pyro_gpn.GPNNet`,
            :class:`~pyro_gpn.models.VariationalGPN`, their calibrated heads included).

    Shape:
        ``x [S, M]`` -> :meth:`predict`: :class:`~pyro_gpn.heads.Prediction` ``[S, D]`` (class
        probabilities ``[S, C]``); :meth:`log_predictive`: ``[S]``.

    Raises:
        ValueError: no members, or members of different tasks or input widths.
        TypeError: a member without ``hidden`` and ``head``.
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
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
        if len(tasks) > 1 or len(widths) > 1:
            raise ValueError(
                f"members must share one task and input width, got tasks {sorted(tasks)} and "
                f"input widths {sorted(widths)}"
            )
        self.members = nn.ModuleList(members)

    @property
    def task(self) -> str:
        return self.members[0].head.task

    @torch.no_grad()
    def predict(self, x: Tensor, x_var: Tensor | None = None) -> Prediction:
        """The mixture's mean and standard deviation (regression), or its class probabilities
        and their standard deviation over the members and their posteriors (classification):
        ``mean = avg_k m_k``, ``var = avg_k (s_k^2 + m_k^2) - mean^2`` (the law of total
        variance, for both tasks)."""
        parts = [member.predict(x, x_var) for member in self.members]
        means = torch.stack([p.mean for p in parts])
        second = torch.stack([p.std.square() + p.mean.square() for p in parts])
        mean = means.mean(0)
        var = (second.mean(0) - mean.square()).clamp_min(0.0)
        return Prediction(mean, var.sqrt(), self.task)

    def log_predictive(self, x: Tensor, y: Tensor) -> Tensor:
        """``log (1 / K) sum_k p_k(y_s | x_s)`` per row ``[S]``: each member's joint density of
        the row's outputs under its closed-form predictive, mixed exactly."""
        logs = torch.stack(
            [member.head.log_predictive(member.hidden(x), y) for member in self.members]
        )
        return torch.logsumexp(logs, 0) - math.log(len(self.members))

    def predictive_mixture(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Regression: the mixture as Gaussian components, weights ``[K T]`` and means and
        variances ``[K T, S, D]`` (each member's ``T`` components, its weights divided by
        ``K``), for interval quantiles and plots. Its per-output density equals
        :meth:`log_predictive` for ``D = 1``."""
        if self.task != "regression":
            raise ValueError("predictive_mixture exists for regression heads only")
        parts = [member.head.predictive_mixture(member.hidden(x)) for member in self.members]
        weights = torch.cat([w.reshape(-1) / len(parts) for w, _, _ in parts])
        return weights, torch.cat([m for _, m, _ in parts]), torch.cat([v for _, _, v in parts])

    def extra_repr(self) -> str:
        return f"members={len(self.members)}, task={self.task!r}"
