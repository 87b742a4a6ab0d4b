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
of the full-data loss. The loop never inspects the model, except on entry for the class count
of a package network's classifier head (``model`` a bound method of it, or a
:class:`~pyro_gpn.inference.ClosedFormELBO` loss), to check the labels once.

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
of one on the same global batches (:mod:`pyro_gpn.inference.distributed`, which says why this is
not DDP). Those come from a generator seeded with :func:`batch_seed` of ``seed``: a single
process that draws nothing else from the global generator (a closed-form ELBO) takes the same
steps with ``seed=batch_seed(seed)``.

**Checkpoints.** With ``out_dir``, every ``checkpoint_every`` steps and at the end the loop
writes ``out_dir/svi_checkpoint.pt`` (:data:`~pyro_gpn.inference.checkpoint.SVI_CHECKPOINT_NAME`,
atomically, with a SHA-256 checksum beside it; rank 0 alone under ``torchrun``): the parameters
the loss trained, by their Pyro names (``pyro.param`` sites of the param store and the
``PyroModule`` parameters alike, as the unconstrained tensors the optimiser updates), the
optimiser's state, the step, the random number generator states and the loss history.
``resume=True`` continues from it: the parameters are created by evaluating the loss once on a
batch (its gradients are discarded), overwritten in place with the saved values, the optimiser
and the generators are restored, and the loop goes on from the saved step, so that the finished
run equals an uninterrupted one. Under ``torchrun`` rank 0 alone checks, locks, reads and writes
``out_dir`` (its errors raise on every rank, :func:`~pyro_gpn.inference.distributed.on_main_rank`)
and sends the checkpoint to the other ranks, whose own ``out_dir`` is never touched: it need not
be on a shared file system. The checkpoint keeps every rank's random state (each rank draws the
Monte Carlo samples of its own share of the batch); the global batches come from a generator of
their own, seeded alike on every rank (from a seed derived from ``seed``, :func:`batch_seed`),
so that the ranks' shares of a step never overlap.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import pyro.optim
import torch
from pyro import poutine
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.elbo import ELBO
from pyro.infer.util import zero_grads
from torch import Tensor

from .. import settings
from .._validation import check_class_labels, check_finite, check_int
from .checkpoint import (
    SVI_CHECKPOINT_NAME,
    gather_rng_state,
    load_svi_checkpoint,
    locked_out_dir,
    own_rng_state,
    plain_settings,
    save_svi_checkpoint,
    set_rng_state,
)
from .distributed import (
    DistContext,
    all_reduce_gradients,
    broadcast_parameters,
    broadcast_seed,
    current_context,
    on_main_rank,
    shard,
    shard_weight,
)

__all__ = ["LOSSES", "SVI_CHECKPOINT_NAME", "SVIResult", "fit_svi"]

logger = logging.getLogger(__name__)

LOSSES = ("trace", "trace_meanfield")

#: ``callback(step, loss)`` is called after every step (``step`` counts from 1); returning
#: ``True`` stops the loop.
Callback = Callable[[int, float], "bool | None"]


@dataclass
class SVIResult:
    """What :func:`fit_svi` returns.

    Attributes:
        losses: the loss of every step (Pyro's estimate of the negative ELBO for the full data
            set, as returned by the loss; divide by ``num_data`` for a per-sample value); a
            resumed run's history starts with the checkpoint's.
        wall_time: seconds spent in the loop (a resumed run's includes the checkpoint's).
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
        particles = check_int("num_particles", 1 if num_particles is None else num_particles, 1)
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
    # plain floats: the optimiser's state goes into checkpoints, whose weights_only=True load
    # refuses NumPy scalars (an lr of np.float64)
    lr, lr_decay = float(lr), float(lr_decay)
    if clip_norm is None and lr_decay == 1.0:
        return pyro.optim.Adam({"lr": lr})
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be positive, got {clip_norm}")
    # ClippedAdam multiplies the learning rate by lrd after every step.
    return pyro.optim.ClippedAdam(
        {
            "lr": lr,
            "clip_norm": math.inf if clip_norm is None else float(clip_norm),
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
) -> tuple[float, dict[str, Tensor]]:
    """:meth:`pyro.infer.SVI.step`, refusing to update the parameters with non-finite values.

    One device synchronisation: the loss and the all-finite flag of every gradient are read
    back together; the offending parameters are looked up only on failure. Returns the loss
    and the trained (unconstrained) parameters by name. Under ``torchrun``
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
    return loss, named


def _stable_repr(value: Any) -> str:
    """``repr(value)`` without memory addresses (which differ from one process to the next)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _comparable(value: Any) -> Any:
    """``value`` (``model_kwargs`` and what it holds) in a form that compares by content and
    that a checkpoint stores under ``weights_only=True``: a tensor or NumPy array becomes
    ``("tensor", dtype, shape, SHA-256 of its bytes on the CPU)`` (every element counts, the
    device does not), a set or frozenset the sorted list of its members' forms (not their hash
    order), a dict a dict of its items in sorted key order, a list or tuple a list, a NumPy
    scalar its Python value, ``None``, ``bool``, ``int``, ``float`` and ``str`` themselves, and
    anything else its ``repr`` without memory addresses.

    Not detected: a change of an object's state that its ``repr`` does not show (a module's
    parameters, a callable's closure), a tuple changed into a list, a tensor's ``requires_grad``
    or a NaN's payload.
    """
    if isinstance(value, (Tensor, np.ndarray)):
        try:
            data = torch.as_tensor(value).detach().cpu()
            data = data.to_dense() if data.is_sparse else data
            raw = data.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        except (TypeError, RuntimeError, NotImplementedError, ValueError):
            # what torch cannot read as plain memory (string or object arrays, meta,
            # quantized or nested tensors, ...): its repr, as any other object
            return _stable_repr(value)
        return ("tensor", str(data.dtype), list(data.shape), hashlib.sha256(raw).hexdigest())
    if isinstance(value, (set, frozenset)):
        return sorted((_comparable(item) for item in value), key=repr)
    if isinstance(value, dict):
        items = ((_comparable(key), _comparable(item)) for key, item in value.items())
        return {
            key if isinstance(key, (str, int, float, bool, type(None))) else repr(key): item
            for key, item in sorted(items, key=lambda pair: repr(pair[0]))
        }
    if isinstance(value, (list, tuple)):
        return [_comparable(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _stable_repr(value)


def _describe_optim(optim: pyro.optim.PyroOptim) -> str:
    """A custom optimiser's class and settings, e.g. ``"SGD({'lr': 0.1})"`` (``PyroOptim`` is
    every Pyro optimiser's type; a callable of per-parameter settings shows as its name)."""
    text = f"{optim.pt_optim_constructor.__name__}({_stable_repr(optim.pt_optim_args)})"
    scheduler = getattr(optim, "pt_scheduler_constructor", None)
    if scheduler is not None:
        text += f" + {scheduler.__name__}({_stable_repr(getattr(optim, 'kwargs', {}))})"
    if getattr(optim, "pt_clip_args", None):
        text += f" + clip {_stable_repr(optim.pt_clip_args)}"
    return text


def _run_settings(
    *,
    loss: str | ELBO | Callable,
    elbo: ELBO | Callable,
    optim: pyro.optim.PyroOptim | None,
    lr: float,
    clip_norm: float | None,
    lr_decay: float,
    num_steps: int,
    batch_size: int | None,
    model_kwargs: dict | None,
    num_data: int,
    seed: int | None,
) -> dict[str, Any]:
    """The settings of :func:`fit_svi` that a checkpoint records and a resumption compares
    (:func:`~pyro_gpn.inference.checkpoint.check_resume_settings`), in a comparable form: what
    the run ignores is ``None`` (``lr`` and ``clip_norm`` beside a custom ``optim``, a
    ``batch_size`` of all samples), objects are described by their class and settings, and
    ``model_kwargs`` by its content (:func:`_comparable`)."""
    if isinstance(loss, str):
        loss_text, particles = loss, elbo.num_particles
    else:
        particles = None
        loss_text = type(loss).__name__ if isinstance(loss, ELBO) else _stable_repr(loss)
        if getattr(loss, "num_particles", None) is not None:
            loss_text += f"(num_particles={loss.num_particles})"
    return plain_settings(  # weights_only=True loads no NumPy scalar (an lr of np.float64)
        {
            "loss": loss_text,
            "num_particles": particles,
            "optim": None if optim is None else _describe_optim(optim),
            "lr": lr if optim is None else None,
            "clip_norm": clip_norm if optim is None else None,
            "lr_decay": lr_decay,
            "num_steps": num_steps,
            "batch_size": batch_size,
            "model_kwargs": _comparable(model_kwargs or {}),
            "num_data": num_data,
            "seed": seed,
        }
    )


def _check_checkpoint_args(
    out_dir: str | os.PathLike | None, resume: bool, checkpoint_every: int
) -> Path | None:
    """The checkpoint arguments of :func:`fit_svi`, checked (``ValueError`` naming one)."""
    if out_dir is not None and not isinstance(out_dir, (str, os.PathLike)):
        raise ValueError(f"out_dir must be a path or None, got {type(out_dir).__name__}")
    if not isinstance(resume, bool):
        raise ValueError(f"resume must be a bool, got {resume!r}")
    check_int("checkpoint_every", checkpoint_every, 1)
    return None if out_dir is None else Path(out_dir)


def _restore(
    svi: SVI, checkpoint: dict[str, Any], path: Path, *args, **kwargs
) -> dict[str, Tensor]:
    """Create the trained parameters by evaluating the loss once on ``args`` (the gradients are
    discarded), overwrite them in place with the checkpoint's values, and hand the optimiser its
    state (consumed when it first meets each parameter). Returns the parameters by name."""
    with settings.validation(False):
        _, named = _loss_and_grads(svi, 1, *args, **kwargs)
    zero_grads(set(named.values()))
    saved = checkpoint["params"]
    if set(saved) != set(named):
        raise ValueError(
            f"{path} holds the parameters {sorted(saved)}, but the loss trains {sorted(named)}: "
            "resume with the model and guide that wrote it (or resume=False to start afresh)"
        )
    with torch.no_grad():
        for name, value in named.items():
            if value.shape != saved[name].shape or value.dtype != saved[name].dtype:
                raise ValueError(
                    f"{path} holds {name} of shape {tuple(saved[name].shape)} and dtype "
                    f"{saved[name].dtype}, the model's is of shape {tuple(value.shape)} and "
                    f"dtype {value.dtype}: resume with the model that wrote it"
                )
            value.copy_(saved[name])
    svi.optim.set_state(checkpoint["optim"])
    return named


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
    out_dir: str | os.PathLike | None = None,
    resume: bool = False,
    checkpoint_every: int = 100,
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
        num_steps: the number of optimiser steps (at least one).
        lr: Adam's learning rate (ignored when ``optim`` is given).
        batch_size: mini-batch size ``B``; ``None`` or ``B >= S`` uses all samples each step.
        num_particles: Monte Carlo particles of a loss given by name (default 1; loops over the
            particles, the models need not be vectorised). Configure an ELBO instance directly.
        seed: a non-negative integer passed to :func:`pyro.set_rng_seed` before the first step
            (``None``: leave the random state alone). A resumed run restores the generator
            states of the checkpoint instead, so its ``seed`` need not be the first run's.
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
        out_dir: folder for ``svi_checkpoint.pt`` (created if missing; the module docstring
            says what it holds), written every ``checkpoint_every`` steps and at the end (also
            when the callback stops the loop); ``None``: nothing is written, as the
            :class:`~pyro_gpn.inference.TrainConfig`'s ``out_dir``.
        resume: continue from ``out_dir/svi_checkpoint.pt`` if it exists (else start afresh),
            up to ``num_steps`` steps in all (a checkpoint at or past ``num_steps`` only restores
            the parameters), so that the finished run equals an uninterrupted one. A resumed run
            continues the saved one, never a mix of two: the model, guide and data must be those
            that wrote it, and the settings that shape the trajectory the checkpoint's --
            ``loss`` (its name, or an ELBO's class and ``num_particles``), ``num_particles``,
            ``lr``, ``clip_norm``, ``lr_decay``, ``optim`` (its class and settings),
            ``batch_size``, ``model_kwargs`` (compared by content, tensors by their bytes,
            numbers with their type: ``1`` is not ``1.0``; a NaN is the same NaN),
            the number of samples, and with ``lr_decay`` also ``num_steps`` (the decay spans
            them) -- else ``ValueError`` names each changed one with both values. ``seed``,
            ``progress``, ``callback``, ``checkpoint_every`` and ``clear_param_store`` may change
            (every parameter the loss trains is overwritten with the checkpoint's).
        checkpoint_every: steps between checkpoints (with ``out_dir``).

    Returns:
        :class:`SVIResult` with the loss history, the wall time and the ``SVI`` object.

    Raises:
        ValueError: for invalid arguments (naming the argument; class labels ``y`` outside
            ``[0, C)`` of the classifier whose ``model`` this is), a checkpoint written with
            other settings (naming them), or one whose parameters are not those the loss trains
            (their names, shapes or dtypes).
        FloatingPointError: when a loss or a gradient is not finite (no update is applied; the
            last checkpoint is left intact).
        pyro_gpn.io.CorruptFileError: ``resume=True`` and the checkpoint is damaged (checked
            against its checksum), naming the file.
        pyro_gpn.io.RunInUseError: another live process trains into ``out_dir`` (under
            ``torchrun``: into rank 0's; raised on every rank).
    """
    num_steps = check_int("num_steps", num_steps, 1)
    # as a Python int: random.seed refuses NumPy integers
    seed = check_int("seed", seed, 0, none_ok=True)
    run_dir = _check_checkpoint_args(out_dir, resume, checkpoint_every)
    if not isinstance(x, Tensor) or x.dim() < 1:
        raise ValueError("x must be a tensor with the samples along its first dimension")
    num_data = x.shape[0]
    if y is not None and (not isinstance(y, Tensor) or y.shape[:1] != x.shape[:1]):
        raise ValueError(f"y must be a tensor with {num_data} samples along its first dimension")
    check_finite("x", x)
    if y is not None and y.is_floating_point():
        check_finite("y", y)
    classes = _num_classes(model, loss)
    if y is not None and classes is not None:  # always: the loop turns the model's check off
        check_class_labels("y", y, classes)
    ctx = current_context(x.device)
    kwargs = {**(model_kwargs or {}), "num_data": num_data}
    slice_size = None
    if batch_size is not None:
        batch_size = check_int("batch_size", batch_size, 1)
        if batch_size < num_data:
            slice_size = batch_size
    if ctx.distributed and min(slice_size or num_data, num_data) < ctx.world_size:
        raise ValueError(
            f"batch_size {batch_size} is smaller than the {ctx.world_size} processes: every rank "
            "needs a sample of each global batch"
        )
    elbo = _make_loss(loss, num_particles)
    optimizer = _make_optim(optim, lr, clip_norm, lr_decay, num_steps)
    run_settings = _run_settings(
        loss=loss,
        elbo=elbo,
        optim=optim,
        lr=lr,
        clip_norm=clip_norm,
        lr_decay=lr_decay,
        num_steps=num_steps,
        batch_size=batch_size if slice_size is not None else None,
        model_kwargs=model_kwargs,
        num_data=num_data,
        seed=seed,
    )
    # a longer (or shorter) run continues the same trajectory, unless the learning rate decays
    # over num_steps; the restored generator states replace the seed
    may_change = {"seed"} if lr_decay != 1.0 else {"seed", "num_steps"}
    with locked_out_dir(run_dir, ctx, SVI_CHECKPOINT_NAME) as writes:
        # after the folder's collective: under torchrun rank 0's out_dir decides, and every
        # rank raises together (a rank raising alone would leave rank 0 waiting)
        if resume and not writes:
            raise ValueError("resume=True needs out_dir (rank 0's, under torchrun)")
        checkpoint = None
        if resume:  # rank 0 reads and verifies it, and sends it to every rank
            checkpoint = on_main_rank(
                lambda: load_svi_checkpoint(run_dir, run_settings, may_change), ctx
            )
        return _loop(
            svi_args=(model, guide, elbo, optimizer),
            data=(x, y, slice_size, kwargs),
            num_steps=num_steps,
            seed=seed,
            ctx=ctx,
            clear_param_store=clear_param_store,
            progress=progress,
            callback=callback,
            run_dir=run_dir,
            writes=writes,
            checkpoint=checkpoint,
            checkpoint_every=checkpoint_every,
            run_settings=run_settings,
        )


def _num_classes(model: Callable, loss: str | ELBO | Callable) -> int | None:
    """The class count of the network behind ``model`` (a bound method of a package network)
    or a :class:`~pyro_gpn.inference.ClosedFormELBO` ``loss``, when its head is a classifier;
    ``None`` for anything else (a plain callable is not inspected)."""
    for owner in (getattr(loss, "vgpn", None), getattr(model, "__self__", None)):
        classes = getattr(getattr(owner, "head", None), "num_classes", None)
        if isinstance(classes, int) and not isinstance(classes, bool):
            return classes
    return None


def batch_seed(seed: int) -> int:
    """The seed of the generator of the global batches under ``torchrun``, derived from
    ``seed`` (the first child of ``numpy.random.SeedSequence(seed)``, 32 bits), so that the
    batch indices do not repeat the stream of the global generator, which ``seed`` also seeds
    and which draws the Monte Carlo noise. The same on every rank; a single process draws its
    batches from the global generator and never uses it."""
    return int(np.random.SeedSequence(seed % 2**64).spawn(1)[0].generate_state(1)[0])


def _loop(
    *,
    svi_args: tuple,
    data: tuple,
    num_steps: int,
    seed: int | None,
    ctx: DistContext,
    clear_param_store: bool,
    progress: bool,
    callback: Callback | None,
    run_dir: Path | None,
    writes: bool,
    checkpoint: dict[str, Any] | None,
    checkpoint_every: int,
    run_settings: dict[str, Any],
) -> SVIResult:
    """:func:`fit_svi`'s loop on checked arguments (``out_dir`` locked and writable).
    ``writes``: whether to checkpoint (under ``torchrun`` rank 0's ``out_dir`` decides, on every
    rank: saving is a collective)."""
    model, guide, elbo, optimizer = svi_args
    x, y, slice_size, kwargs = data
    num_data = x.shape[0]
    if clear_param_store:
        pyro.clear_param_store()
    seed = broadcast_seed(seed, ctx)  # every rank draws the same global batches
    if seed is not None:
        pyro.set_rng_seed(seed)
    # Under torchrun the global batches come from a generator of their own, seeded alike on
    # every rank: the global generator also draws each rank's Monte Carlo samples, as many as
    # the rank's share of the batch, and shares of unequal size would put the ranks out of step.
    # Its seed is derived from the global one (never None here: broadcast_seed draws one), so
    # that the batch indices and the Monte Carlo noise do not reuse one random stream.
    batches = None
    if ctx.distributed:
        batches = torch.Generator(device=x.device).manual_seed(batch_seed(seed))
    svi = SVI(model, guide, optimizer, loss=elbo)
    result = SVIResult(num_data=num_data, svi=svi)
    start_step, named, done_before = 0, {}, 0.0
    if checkpoint is not None:
        path = run_dir / SVI_CHECKPOINT_NAME
        first = torch.arange(min(slice_size or num_data, num_data), device=x.device)
        named = _restore(svi, checkpoint, path, x[first], None if y is None else y[first], **kwargs)
        set_rng_state(own_rng_state(checkpoint["rng"], ctx), batches, ctx.device)
        start_step = checkpoint["step"]
        result.losses = list(checkpoint["losses"])
        done_before = checkpoint["wall_time"]
        logger.info("resuming from step %d of %s", start_step, path)

    def save(step: int) -> None:
        if not writes or not named:
            return
        rng = gather_rng_state(batches, ctx)  # every rank's (a collective)
        wall_time = done_before + time.perf_counter() - start
        on_main_rank(  # a failed write raises on every rank
            lambda: save_svi_checkpoint(
                run_dir,
                params=named,
                optim_state=svi.optim.get_state(),
                rng=rng,
                step=step,
                losses=result.losses,
                wall_time=wall_time,
                settings=run_settings,
            ),
            ctx,
        )

    bar = None
    if progress and ctx.is_main:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_steps, initial=min(start_step, num_steps), desc="SVI", leave=False)
    start = time.perf_counter()
    step = start_step
    try:
        for step in range(start_step + 1, num_steps + 1):
            batch_x, batch_y, weight = x, y, 1.0
            if slice_size is not None or ctx.distributed:
                index = torch.arange(num_data, device=x.device)
                if slice_size is not None:
                    perm = torch.randperm(num_data, device=x.device, generator=batches)
                    index = perm[:slice_size]
                local = shard(index, ctx)
                weight = shard_weight(local.numel(), index.numel())
                batch_x, batch_y = x[local], None if y is None else y[local]
            with settings.validation(False):  # the data were checked on entry
                value, named = _checked_step(
                    svi, step, batch_x, batch_y, ctx=ctx, weight=weight, **kwargs
                )
            result.losses.append(value)
            if bar is not None:
                bar.update()
                if step % 10 == 0 or step == num_steps:
                    bar.set_postfix(loss_per_sample=f"{value / max(num_data, 1):.4g}")
            if callback is not None and callback(step, value):
                result.stopped_early = True
                break
            if step % checkpoint_every == 0 and step != num_steps:
                save(step)
        if step > start_step:
            save(step)
    finally:
        result.wall_time = done_before + time.perf_counter() - start
        if bar is not None:
            bar.close()
    return result
