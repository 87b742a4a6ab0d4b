"""Gradient-check helpers shared by the tests: ``torch.autograd.gradcheck`` that cannot pass
vacuously.

``gradcheck`` silently skips outputs that do not require a gradient, and an input that reaches no
output has a zero analytical and a zero numerical Jacobian; either would let a broken gradient
(a stray ``detach``, a parameter the forward ignores) pass. These helpers check both first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.autograd import gradcheck
from torch.func import functional_call

from pyro_gpn.layers import VariationalTargets


def assert_gradcheck(f: Callable[..., Sequence[Tensor]], inputs: Sequence[Tensor]) -> None:
    """``gradcheck(f, inputs)`` after asserting that every output of ``f`` is differentiable and
    that every input reaches the outputs (a non-zero gradient of their sum)."""
    inputs = tuple(inputs)
    outputs = f(*inputs)
    for i, out in enumerate(outputs):
        assert out.requires_grad, f"output {i} is not differentiable"
    total = sum(out.sum() for out in outputs)
    grads = torch.autograd.grad(total, inputs, allow_unused=True)
    for i, grad in enumerate(grads):
        assert grad is not None and float(grad.abs().sum()) > 0, f"input {i} misses the outputs"
    assert gradcheck(f, inputs)


class _Outputs(nn.Module):
    """A block's output moments (and, for a variational response, its KL term) as a
    ``forward`` without arguments, for :func:`torch.func.functional_call` over the block's
    parameters."""

    def __init__(self, block: nn.Module, inputs, mode: str) -> None:
        super().__init__()
        self.block, self.inputs, self.mode = block, inputs, mode

    def forward(self) -> tuple[Tensor, ...]:
        out = self.block.propagate(self.inputs, self.mode)
        second = out.var if out.cov is None else out.cov
        if not isinstance(getattr(self.block, "response", None), VariationalTargets):
            return out.mean, second
        return out.mean, second, self.block.kl_divergence().reshape(1)


def gradcheck_parameters(
    block: nn.Module, inputs, mode: str = "meanvar", names: Sequence[str] | None = None
) -> None:
    """:func:`assert_gradcheck` of ``block.propagate(inputs, mode)``'s moments (and, for a
    variational response, its ``kl_divergence()``) with respect to the block's parameters
    ``names`` (default: all; a ``PyroParam`` by its unconstrained tensor,
    ``"lengthscales_unconstrained"``)."""
    outputs = _Outputs(block, inputs, mode)
    params = {
        n.removeprefix("block."): p.detach().clone().requires_grad_()
        for n, p in outputs.named_parameters()
        if names is None or n.removeprefix("block.") in names
    }
    assert params and (names is None or sorted(params) == sorted(names)), sorted(params)

    def f(*values: Tensor) -> tuple[Tensor, ...]:
        state = {f"block.{n}": v for n, v in zip(params, values, strict=True)}
        return functional_call(outputs, state, ())

    assert_gradcheck(f, tuple(params.values()))


def variance_slope_at_zero(
    a: Tensor, points: Tensor, lengthscales: Tensor, beta: Tensor, kappa: Tensor
) -> Tensor:
    """``d Var[f] / dv`` at ``v = 0`` for activations ``a`` ``[S, N]``: ``m'(a)^2 + s''(a) / 2``
    by autograd of the mean function ``m = alpha^T beta`` and the conditional variance
    ``s = 1 - alpha^T C alpha`` written out (``points [N, R]``, ``lengthscales [N]``, ``beta
    [N, R]``, ``C = kappa [N, R, R]``), independent of the library's closed forms."""
    a = a.detach().clone().requires_grad_()
    alpha = torch.exp(-0.5 * (a.unsqueeze(-1) - points) ** 2 / lengthscales.square().unsqueeze(-1))
    m = (alpha * beta).sum(-1)
    s = 1 - torch.einsum("snr,nrt,snt->sn", alpha, kappa, alpha)
    (dm,) = torch.autograd.grad(m.sum(), a, retain_graph=True)
    (ds,) = torch.autograd.grad(s.sum(), a, create_graph=True)
    (d2s,) = torch.autograd.grad(ds.sum(), a)
    return (dm.square() + 0.5 * d2s).detach()
