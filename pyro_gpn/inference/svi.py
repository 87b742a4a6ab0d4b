r"""A small, reusable stochastic variational inference loop.

:func:`fit_svi` runs ``num_steps`` steps of Pyro's :class:`~pyro.infer.SVI` on ``model(x, y)`` /
``guide(x, y)`` and records the loss history and the wall time. It serves every route that is
trained by minimising a Pyro loss:

* the sampled parametric GPN (:class:`pyro_gpn.models.parametric.ParametricGPN`, empty guide,
  ``Trace_ELBO``: the loss is the reparameterised estimate of ``eq:gpn_parametrized_loss``);
* the variational GPN, with a sampled ``Trace_ELBO`` or the deterministic closed-form ELBO passed
  as ``loss``.

**The contract** (:mod:`pyro_gpn.models._contract`, the ``pyro.contrib.gp`` convention): every
step calls ``model(x_batch, y_batch, num_data=S)`` and the same for the guide; the model opens
its data plate with ``num_data`` and so scales the sites inside it by ``S / B``, while global
sites (a KL term of global latents, a parameter penalty) are not scaled. With ``batch_size = B <
S`` the loop draws ``B`` distinct random indices per step, so every step is an unbiased estimate
of the full-data loss. The loop never inspects the model.

**Safety.** The loss and every gradient are checked before the optimiser touches the
parameters, with one device synchronisation per step (the loss and a single all-finite flag
read back together): a non-finite value raises :class:`FloatingPointError` naming the step and
the offending parameters, and the parameters keep their last finite values. Inside the loop
the library's value checks and Pyro's distribution checks are off
(:func:`pyro_gpn.settings.validation`); the data are checked once on entry.

**Data-parallel.** Launched by ``torchrun --nproc_per_node=K``, the same call trains on ``K``
processes: every rank draws the same global batch of ``batch_size`` indices and evaluates the
loss on its share (still with ``num_data = S``), and the gradients, weighted by each rank's
share, are summed across ranks before the optimiser step, so the ``K`` processes take the steps
of one (:mod:`pyro_gpn.inference.distributed`, which says why this is not DDP).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyro
import pyro.optim
import torch
from pyro import poutine
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.elbo import ELBO
from pyro.infer.util import zero_grads
from torch import Tensor

from .. import settings
from .._validation import check_finite
from .distributed import (
    DistContext,
    all_reduce_gradients,
    broadcast_parameters,
    broadcast_seed,
    current_context,
    shard,
    shard_weight,
)

__all__ = ["LOSSES", "SVIResult", "fit_svi"]

LOSSES = ("trace", "trace_meanfield")

#: ``callback(step, loss)`` is called after every step (``step`` counts from 1); returning
#: ``True`` stops the loop.
Callback = Callable[[int, float], "bool | None"]


@dataclass
class SVIResult:
    """What :func:`fit_svi` returns.

    Attributes:
        losses: the loss of every step (Pyro's estimate of the negative ELBO for the full data
            set, as returned by the loss; divide by ``num_data`` for a per-sample value).
        wall_time: seconds spent in the loop.
        num_data: ``S``, the number of training samples.
        svi: the :class:`~pyro.infer.SVI` object (its optimiser keeps the Adam moments, so
            ``svi.step(x, y)`` continues the run).
        stopped_early: whether the callback stopped the loop.
    """

    losses: list[float] = field(default_factory=list)
    wall_time: float = 0.0
    num_data: int = 0
    svi: SVI | None = None
    stopped_early: bool = False

    @property
    def num_steps(self) -> int:
        return len(self.losses)

    @property
    def final_loss(self) -> float:
        """The mean of the last ``min(10, num_steps)`` losses (a less noisy final value)."""
        if not self.losses:
            raise ValueError("no steps were run")
        tail = self.losses[-10:]
        return sum(tail) / len(tail)


def _make_loss(loss: str | ELBO | Callable, num_particles: int | None) -> ELBO | Callable:
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, an ELBO or a callable, got {loss!r}")
        particles = 1 if num_particles is None else num_particles
        if not isinstance(particles, int) or particles < 1:
            raise ValueError(f"num_particles must be a positive integer, got {num_particles!r}")
        cls = Trace_ELBO if loss == "trace" else TraceMeanField_ELBO
        return cls(num_particles=particles)
    if num_particles is not None:
        raise ValueError(
            "num_particles applies to a loss given by name; configure the ELBO instead"
        )
    if not (isinstance(loss, ELBO) or callable(loss)):
        raise TypeError(f"loss must be a name, an ELBO or a callable, got {type(loss).__name__}")
    return loss


def _make_optim(
    optim: pyro.optim.PyroOptim | None,
    lr: float,
    clip_norm: float | None,
    lr_decay: float = 1.0,
    num_steps: int = 1,
) -> pyro.optim.PyroOptim:
    if not (isinstance(lr_decay, (int, float)) and math.isfinite(lr_decay) and 0 < lr_decay <= 1):
        raise ValueError(f"lr_decay must lie in (0, 1], got {lr_decay!r}")
    if optim is not None:
        if not isinstance(optim, pyro.optim.PyroOptim):
            raise TypeError(f"optim must be a pyro.optim.PyroOptim, got {type(optim).__name__}")
        if lr_decay != 1.0:
            raise ValueError("lr_decay configures the default optimiser; it cannot go with optim")
        return optim
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if clip_norm is None and lr_decay == 1.0:
        return pyro.optim.Adam({"lr": lr})
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be positive, got {clip_norm}")
    # ClippedAdam multiplies the learning rate by lrd after every step.
    return pyro.optim.ClippedAdam(
        {
            "lr": lr,
            "clip_norm": math.inf if clip_norm is None else clip_norm,
            "lrd": lr_decay ** (1.0 / max(num_steps, 1)),
        }
    )


def _loss_and_grads(svi: SVI, step: int, *args, **kwargs) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss and its gradients, with the unconstrained parameters they reached by name."""
    with poutine.trace(param_only=True) as capture:
        try:
            loss = svi.loss_and_grads(svi.model, svi.guide, *args, **kwargs)
        except ValueError as error:
            if step == 1:  # the model's own argument checks: not a divergence
                raise
            raise FloatingPointError(
                f"SVI step {step} failed after {step - 1} finite updates ({error}); the "
                "optimisation has most likely diverged: try a smaller lr or clip_norm"
            ) from error
    sites = capture.trace.nodes.values()
    named = {site["name"]: site["value"].unconstrained() for site in sites}
    return torch.as_tensor(loss).detach().to(torch.float64).reshape(()), named


def _checked_step(
    svi: SVI, step: int, *args, ctx: DistContext | None = None, weight: float = 1.0, **kwargs
) -> float:
    """:meth:`pyro.infer.SVI.step`, refusing to update the parameters with non-finite values.

    One device synchronisation: the loss and the all-finite flag of every gradient are read
    back together; the offending parameters are looked up only on failure. Under ``torchrun``
    (``ctx``), the gradients and the loss, weighted by this rank's share ``weight`` of the global
    batch, are summed over the ranks first (and at the first step every rank starts from rank
    0's freshly created parameters).
    """
    loss, named = _loss_and_grads(svi, step, *args, **kwargs)
    if ctx is not None and ctx.distributed:
        ordered = [named[name] for name in sorted(named)]
        if step == 1:
            broadcast_parameters(ordered, ctx)
            zero_grads(set(ordered))
            loss, named = _loss_and_grads(svi, step, *args, **kwargs)
            ordered = [named[name] for name in sorted(named)]
        loss = all_reduce_gradients(ordered, weight, loss, ctx)
    params = set(named.values())
    grads = [p.grad for p in named.values() if p.grad is not None]
    finite = torch.stack([torch.isfinite(g).all() for g in grads]).all() if grads else True
    loss, grads_finite = torch.stack([loss.cpu(), torch.as_tensor(finite).cpu().double()]).tolist()
    if not math.isfinite(loss):
        zero_grads(params)
        raise FloatingPointError(
            f"SVI loss is {loss} at step {step}; parameters were left at their last finite "
            "values (try a smaller lr, clip_norm, or check the data for outliers)"
        )
    if not grads_finite:
        bad = [
            name
            for name, p in named.items()
            if p.grad is not None and not bool(torch.isfinite(p.grad).all())
        ]
        zero_grads(params)
        raise FloatingPointError(
            f"non-finite gradients at step {step} (loss {loss:.6g}) for parameters {sorted(bad)}; "
            "parameters were left at their last finite values"
        )
    svi.optim(params)
    zero_grads(params)
    return loss


def fit_svi(
    model: Callable,
    guide: Callable,
    x: Tensor,
    y: Tensor | None = None,
    loss: str | ELBO | Callable = "trace",
    num_steps: int = 1000,
    lr: float = 1e-2,
    batch_size: int | None = None,
    num_particles: int | None = None,
    seed: int | None = None,
    progress: bool = True,
    callback: Callback | None = None,
    optim: pyro.optim.PyroOptim | None = None,
    clip_norm: float | None = None,
    lr_decay: float = 1.0,
    clear_param_store: bool = True,
    model_kwargs: dict | None = None,
) -> SVIResult:
    """Fit ``model`` / ``guide`` to ``(x, y)`` by stochastic variational inference.

    Each step evaluates ``loss`` on ``model(x, y, **model_kwargs)`` and ``guide(x, y,
    **model_kwargs)`` (on a mini-batch with ``batch_size``, see the module docstring) and takes
    one optimiser step.

    Args:
        model, guide: Pyro callables with signature ``(x, y, num_data=None, **kwargs)`` (the
            contract in the module docstring).
        x: ``[S, ...]`` inputs (``S`` training samples along the first dimension).
        y: targets or ``None``.
        loss: ``"trace"`` (:class:`~pyro.infer.Trace_ELBO`), ``"trace_meanfield"``
            (:class:`~pyro.infer.TraceMeanField_ELBO`), an :class:`~pyro.infer.elbo.ELBO`
            instance (e.g. the variational GPN's closed-form ELBO) or a callable
            ``loss(model, guide, *args, **kwargs) -> Tensor``.
        num_steps: the number of optimiser steps.
        lr: Adam's learning rate (ignored when ``optim`` is given).
        batch_size: mini-batch size ``B``; ``None`` or ``B >= S`` uses all samples each step.
        num_particles: Monte Carlo particles of a loss given by name (default 1; loops over the
            particles, the models need not be vectorised). Configure an ELBO instance directly.
        seed: passed to :func:`pyro.set_rng_seed` before the first step (``None``: leave the
            random state alone).
        progress: show a ``tqdm`` progress bar with the per-sample loss.
        callback: ``callback(step, loss)`` after every step; returning ``True`` stops the loop.
        optim: a :class:`pyro.optim.PyroOptim` to use instead of ``Adam(lr)``.
        clip_norm: if given (and ``optim`` is not), :class:`pyro.optim.ClippedAdam` with this
            gradient-norm clip.
        lr_decay: factor by which the learning rate has shrunk after ``num_steps`` steps, by
            an exponential schedule (``lr * lr_decay ** (step / num_steps)``, through
            :class:`pyro.optim.ClippedAdam`'s ``lrd``); ``1``: constant.
        clear_param_store: call :func:`pyro.clear_param_store` first, so that no parameter of an
            earlier run with the same name leaks into this one. ``PyroModule`` parameters live
            in their modules and are unaffected; set ``False`` to continue a run that keeps
            plain ``pyro.param`` sites.
        model_kwargs: extra keyword arguments for the model and the guide (besides
            ``num_data``, which the loop passes).

    Returns:
        :class:`SVIResult` with the loss history, the wall time and the ``SVI`` object.

    Raises:
        ValueError: for invalid arguments.
        FloatingPointError: when a loss or a gradient is not finite (no update is applied).
    """
    if not isinstance(num_steps, int) or num_steps < 0:
        raise ValueError(f"num_steps must be a non-negative integer, got {num_steps!r}")
    if not isinstance(x, Tensor) or x.dim() < 1:
        raise ValueError("x must be a tensor with the samples along its first dimension")
    num_data = x.shape[0]
    if y is not None and (not isinstance(y, Tensor) or y.shape[:1] != x.shape[:1]):
        raise ValueError(f"y must be a tensor with {num_data} samples along its first dimension")
    check_finite("x", x)
    if y is not None and y.is_floating_point():
        check_finite("y", y)
    ctx = current_context(x.device)
    kwargs = {**(model_kwargs or {}), "num_data": num_data}
    slice_size = None
    if batch_size is not None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if batch_size < num_data:
            slice_size = batch_size
    if ctx.distributed and min(slice_size or num_data, num_data) < ctx.world_size:
        raise ValueError(
            f"batch_size {batch_size} is smaller than the {ctx.world_size} processes: every rank "
            "needs a sample of each global batch"
        )
    elbo = _make_loss(loss, num_particles)
    optimizer = _make_optim(optim, lr, clip_norm, lr_decay, num_steps)
    if clear_param_store:
        pyro.clear_param_store()
    seed = broadcast_seed(seed, ctx)  # every rank draws the same global batches
    if seed is not None:
        pyro.set_rng_seed(seed)
    svi = SVI(model, guide, optimizer, loss=elbo)
    result = SVIResult(num_data=num_data, svi=svi)

    bar = None
    if progress and ctx.is_main:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_steps, desc="SVI", leave=False)
    start = time.perf_counter()
    try:
        for step in range(1, num_steps + 1):
            batch_x, batch_y, weight = x, y, 1.0
            if slice_size is not None or ctx.distributed:
                index = torch.arange(num_data, device=x.device)
                if slice_size is not None:
                    index = torch.randperm(num_data, device=x.device)[:slice_size]
                local = shard(index, ctx)
                weight = shard_weight(local.numel(), index.numel())
                batch_x, batch_y = x[local], None if y is None else y[local]
            with settings.validation(False):  # the data were checked on entry
                value = _checked_step(svi, step, batch_x, batch_y, ctx=ctx, weight=weight, **kwargs)
            result.losses.append(value)
            if bar is not None:
                bar.update()
                if step % 10 == 0 or step == num_steps:
                    bar.set_postfix(loss_per_sample=f"{value / max(num_data, 1):.4g}")
            if callback is not None and callback(step, value):
                result.stopped_early = True
                break
    finally:
        result.wall_time = time.perf_counter() - start
        if bar is not None:
            bar.close()
    return result
