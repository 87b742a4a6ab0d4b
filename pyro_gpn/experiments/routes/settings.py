"""The routes of the comparison and the budget they run under (:class:`RouteBudget`).

Every :class:`RouteBudget` field declares its ``pyro-gpn compare`` option
(:func:`~pyro_gpn.experiments.options.option`), so the command line, its defaults and its help
come from this one declaration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..._validation import check_int, integer_sizes
from ...layers.parametric import TARGET_INITS
from ...layers.variational import VARIATIONAL_TARGET_INITS as TARGETS_INITS
from ..options import int_at_least_two, nonnegative_int, option, positive_float, positive_int

__all__ = ["ROUTES", "ROUTE_LABELS", "RouteBudget", "check_sizes"]

ROUTES = ("nuts", "sampled-u", "parametric-svi", "clt", "vgpn-trace", "vgpn-closed")
ROUTE_LABELS = {
    "nuts": "NUTS, non-parametric GPN",
    "sampled-u": "NUTS, sampled-U GPN",
    "parametric-svi": "SVI, parametric GPN",
    "clt": "ML, central-limit GPN",
    "vgpn-trace": "VI, Trace_ELBO",
    "vgpn-closed": "VI, closed-form ELBO",
}

_POSITIVE = (
    "svi_steps",
    "trace_particles",
    "predictive_samples",
    "clt_epochs",
    "clt_batch_size",
    "nuts_samples",
    "nuts_chains",
    "nuts_max_tree_depth",
    "nuts_max_rows",
    "sampled_u_inducing",
)
_NONNEGATIVE = ("eval_every", "nuts_warmup", "clt_patience")


def _int(help: str, default: int) -> dict:
    return field(default=default, metadata=option(help, type=positive_int))


def _count(help: str, default: int) -> dict:
    return field(default=default, metadata=option(help, type=nonnegative_int))


def _rate(help: str, default: float) -> dict:
    return field(default=default, metadata=option(help, type=positive_float))


@dataclass
class RouteBudget:
    """How much work each route may do (shared settings such as the learning rate included).

    Attributes:
        svi_steps: optimiser steps of the three SVI routes.
        svi_lr: Adam learning rate of the parametric SVI route.
        vgpn_lr: Adam learning rate of the two variational routes.
        vgpn_whiten: fit the variational GPN in the whitened parametrisation (``U = L z``).
        vgpn_lr_decay: the variational routes' learning rate decays exponentially to
            ``vgpn_lr * vgpn_lr_decay`` at the last step (``1``: constant); the late small steps
            let the noisy ``Trace_ELBO`` route settle.
            On yacht (split 0, ``[6, 4, 1]``, 3000 closed-form steps at ``lr=0.05``) the
            whitened fit reached test RMSE 1.53 and the plain one 11.2: the plain
            parametrisation barely moves the targets away from the prior.
        targets_init: initial targets of the parametric GPN routes (``parametric-svi`` and
            ``clt``): ``"random"`` or ``"identity"`` (the paper uses both). On yacht (3 seeds)
            random targets gave test RMSE 1.90 ± 2.65 (parametric SVI) and 1.51 ± 1.11 (CLT),
            identity 0.29 / 0.38 / 0.44 and 0.37 / 0.40 / 0.39.
        vgpn_targets_init: initial mean of ``q(U)`` of the variational routes (see
            :class:`~pyro_gpn.layers.VariationalGPNLayer`: ``"random"``, ``"identity"``,
            ``"zero"``). On yacht (split 0, ``[6, 4, 1]``, 4000 closed-form steps, ``lr`` 0.05
            decayed to 0.005) ``"random"`` -- activation functions drawn from the GP prior --
            ended in the noise-only optimum in 2 of 3 seeds (test RMSE 11.6, 10.9) and
            ``"identity"`` reached 0.275, 0.279, 0.297 (``docs/results/routes.md``).
        svi_batch_size: mini-batch size of the SVI routes (``None``: the full training set).
        trace_particles: Monte Carlo particles of the sampled ``Trace_ELBO`` losses.
        eval_every: steps between the test evaluations that record the ``vgpn`` learning curves
            (``0``: only at the end).
        predictive_samples: draws of the ``parametric-svi`` predictive.
        clt_epochs: ``max_epochs`` of the CLT route's trainer.
        clt_lr: initial learning rate of the CLT route (divided by 10 on plateaus).
        clt_batch_size: mini-batch size of the CLT route.
        clt_patience: evaluations without improvement before the CLT learning rate drops.
        nuts_samples, nuts_warmup, nuts_chains: NUTS draws kept per chain, warm-up steps per
            chain and chains (both NUTS routes, ``nuts`` and ``sampled-u``).
        nuts_max_tree_depth: NUTS tree-depth limit (both NUTS routes).
        nuts_max_rows: the ``nuts`` route (the non-parametric GPN, ``O(S^3)``) is skipped when
            its training rows plus prediction rows (test and, for 1-D data, the plot grid)
            exceed this; the ``sampled-u`` route has no such limit.
        nuts_subsample: if set, both NUTS routes (``nuts`` and ``sampled-u``) see the same
            random subset of this many training rows (seeded).
        nuts_sizes: hidden widths of the non-parametric GPN (``None``: the common ``sizes``);
            every hidden unit adds one latent dimension per row.
        sampled_u_sizes: hidden widths of the ``sampled-u`` route's
            :class:`~pyro_gpn.models.SampledTargetsGPN` (``None``: the common ``sizes``). Its
            posterior has ``sum_l N_l (R + M_l + 1)`` dimensions whatever the rows. Without a
            hidden layer its chains met r-hat 1.01 on 1,000 rows of power and kin8nm in minutes;
            with one they took 0.5-2.8 s per warm-up iteration there (``docs/results/nuts.md``),
            hence the command line's default of none.
        sampled_u_inducing: inducing points ``R`` per unit of the ``sampled-u`` route (>= 2). On
            the synthetic problem (54 rows, ``[1, 1]``, 2 x (200 + 200), seed 0, shared 2-core
            CPU) 8 took 37-42 s, max r-hat 1.027-1.033, test log-lik 0.654; the model's default
            10 took 80-122 s (42 leapfrog steps per draw against 13), r-hat 1.022-1.024, 0.608;
            6 did not mix (r-hat 1.38).
    """

    svi_steps: int = _int("optimiser steps of the three SVI routes", 2000)
    svi_lr: float = _rate("Adam learning rate of the parametric SVI route", 1e-2)
    vgpn_lr: float = _rate("Adam learning rate of the variational routes", 5e-2)
    vgpn_whiten: bool = field(
        default=True,
        metadata=option(
            "fit the variational GPN unwhitened (default: whitened, U = L z)",
            flag="--vgpn-no-whiten",
        ),
    )
    vgpn_lr_decay: float = field(
        default=0.1,
        metadata=option(
            "variational routes: learning-rate factor reached at the last step (exponential "
            "decay; 1: constant)"
        ),
    )
    targets_init: str = field(
        default="identity",
        metadata=option(
            "parametric routes (parametric-svi, clt): initial targets", choices=TARGET_INITS
        ),
    )
    vgpn_targets_init: str = field(
        default="identity",
        metadata=option("variational routes: initial mean of q(U)", choices=TARGETS_INITS),
    )
    svi_batch_size: int | None = field(
        default=None,
        metadata=option("mini-batch size of the SVI routes (None: all rows)", type=positive_int),
    )
    trace_particles: int = _int("Monte Carlo particles of the Trace_ELBO losses", 1)
    eval_every: int = _count("steps between the vgpn learning-curve evaluations (0: end)", 50)
    predictive_samples: int = _int("draws of the parametric-svi predictive", 500)
    clt_epochs: int = _int("epoch cap of the central-limit route", 300)
    clt_lr: float = _rate("initial learning rate of the central-limit route", 1e-2)
    clt_batch_size: int = _int("mini-batch size of the central-limit route", 32)
    clt_patience: int = _count("central-limit route: epochs before a learning-rate drop", 10)
    nuts_samples: int = _int("NUTS draws kept per chain", 200)
    nuts_warmup: int = _count("NUTS warm-up steps per chain", 200)
    nuts_chains: int = _int("NUTS chains", 2)
    nuts_max_tree_depth: int = _int("NUTS tree-depth limit", 8)
    nuts_max_rows: int = _int("skip NUTS above this many training + prediction rows", 300)
    nuts_subsample: int | None = field(
        default=None, metadata=option("NUTS training rows (None: all)", type=positive_int)
    )
    nuts_sizes: tuple[int, ...] | None = field(
        default=None,
        metadata=option(
            "hidden widths of the non-parametric GPN sampled by NUTS (none given: a single GPN "
            "layer); every hidden unit adds one latent dimension per training row",
            type=positive_int,
            nargs="*",
        ),
    )
    sampled_u_sizes: tuple[int, ...] | None = field(
        default=None,
        metadata=option(
            "hidden widths of the sampled-U GPN sampled by NUTS (none given: a single GPN layer)",
            type=positive_int,
            nargs="*",
        ),
    )
    sampled_u_inducing: int = field(
        default=8,
        metadata=option("sampled-U route: inducing points per unit (>= 2)", type=int_at_least_two),
    )

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        for name in _NONNEGATIVE:
            object.__setattr__(self, name, check_int(name, getattr(self, name), 0))
        for name in ("svi_lr", "vgpn_lr", "clt_lr"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not (isinstance(self.vgpn_lr_decay, (int, float)) and 0 < self.vgpn_lr_decay <= 1):
            raise ValueError(f"vgpn_lr_decay must lie in (0, 1], got {self.vgpn_lr_decay!r}")
        if self.targets_init not in TARGET_INITS:
            raise ValueError(
                f"targets_init must be one of {TARGET_INITS}, got {self.targets_init!r}"
            )
        if self.vgpn_targets_init not in TARGETS_INITS:
            raise ValueError(
                f"vgpn_targets_init must be one of {TARGETS_INITS}, got {self.vgpn_targets_init!r}"
            )
        for name in ("svi_batch_size", "nuts_subsample"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1, none_ok=True))
        if self.sampled_u_inducing < 2:
            raise ValueError(
                f"sampled_u_inducing must be at least 2, got {self.sampled_u_inducing}"
            )
        for name in ("nuts_sizes", "sampled_u_sizes"):
            if getattr(self, name) is not None:
                setattr(self, name, check_sizes(name, getattr(self, name)))


def check_sizes(name: str, sizes: Sequence[int]) -> tuple[int, ...]:
    """``sizes`` as a tuple of positive hidden widths, else a ``ValueError`` naming ``name``."""
    sizes = tuple(integer_sizes(sizes, name))
    if any(s < 1 for s in sizes):
        raise ValueError(f"{name} must be positive integers (hidden widths), got {sizes}")
    return sizes
