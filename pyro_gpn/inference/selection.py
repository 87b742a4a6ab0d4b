"""Choosing the Bayesian GPN's configuration on validation rows.

No single setting of the closed-form variational GPN is best on every regression problem: on
the nine UCI regression sets the library's defaults alone were ahead of a deep GP on 2 of 9
sets, the configurations chosen per set on their validation rows on 7 of 9
(``docs/results/uci.md`` sections 26-27). :func:`select_vgpn` makes that choice itself: it
fits every candidate of a portfolio (by default :data:`~pyro_gpn.recommended.VGPN_PORTFOLIO`,
the configurations those validation rows chose) on the same training rows, scores each on the
same validation rows, and mixes their predictives with the stacking weights the validation
rows give, keeping the networks whose weight is not negligible (the default,
``combine="stack"``; :func:`~pyro_gpn.inference.stacking_weights`), or keeps the single best
(``combine="best"``; the winner's curse of a choice made on a few dozen rows is why stacking is
the default, ``docs/results/uci.md`` sections 28-29). Where it keeps a single network it then
fits that network's predictive scale if that raises the cross-fitted validation score
(:func:`~pyro_gpn.inference.crossfitted_scores`), and a stacked mixture's scale if that raises
the score cross-fitted with the stacking inside (:func:`crossfitted_stacked_scores`). The
validation rows stop each fit and choose among the fits; they are never test rows.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .._validation import check_finite, check_ndim, check_tensor
from ..models.ensemble import NetworkEnsemble
from ..models.variational import VariationalGPN
from ..settings import validation
from .calibration import crossfit_halves, crossfitted_scores, fit_predictive_scale
from .closed_form import VGPNFit, fit_settings, fit_vgpn, holdout
from .stacking import crossfitted_combination, stacking_weights

if TYPE_CHECKING:
    from ..recommended import VGPNCandidate

__all__ = ["VGPNSelection", "crossfitted_stacked_scores", "select_vgpn"]

#: stacking weights below this are dropped (with their networks) and the rest renormalised
MIN_STACKING_WEIGHT = 1e-4

#: the fit_vgpn keywords a candidate may set
_FIT_KEYS = frozenset(
    {"elbo", "lr", "lr_decay", "num_steps", "eval_every", "patience", "noise_warmup"}
)


@dataclass
class VGPNSelection:
    """What :func:`select_vgpn` returns.

    Attributes:
        model: the best candidate's fitted network (its best state), or, where the candidates
            were stacked (``combine="stack"``, or ``"auto"`` deciding so), the
            :class:`~pyro_gpn.models.NetworkEnsemble` of the candidates the stacking weights
            keep (the network itself when they keep one); its predictive scale fitted where
            ``calibrated`` (a single network's in place: the same object as in ``models``).
        candidate: the candidate with the best validation score (where stacked, the one of
            highest single score, whatever its weight).
        scores: every candidate's validation log-likelihood (mean log predictive density per
            row, uncalibrated, in the units of the data given), by name, in the order fitted;
            ``-inf`` for a candidate whose fit failed (``errors``).
        fits: every candidate's :class:`~pyro_gpn.inference.VGPNFit`, by name.
        fit_seconds: every candidate's wall time (fit and scoring), by name.
        errors: the candidates whose fit raised ``FloatingPointError`` or
            ``torch.linalg.LinAlgError``, or whose validation log-likelihood was not finite, with
            the message (their score is ``-inf``).
        crossfit: ``model``'s cross-fitted validation log-likelihood
            ``(uncalibrated, calibrated)`` (for a stacked mixture with the stacking inside the
            cross-fit, :func:`crossfitted_stacked_scores`), or ``None`` when calibration was not
            considered (``calibrate`` not ``"auto"``).
        calibrated: whether ``model``'s predictive scale was fitted.
        num_train, num_val: the training rows every candidate was fitted on, and the
            validation rows.
        weights: the mixture weight of every candidate that ``model`` holds, by name
            (``{candidate.name: 1.0}`` for a single network).
        combine_crossfit: with ``combine="auto"`` and two or more candidates with a finite
            score, the cross-fitted validation log-likelihood ``(best, stacked)``
            (:func:`~pyro_gpn.inference.crossfitted_combination`) that decided; else ``None``.
        models: the fitted network of every candidate with a finite validation score, by name.
    """

    model: VariationalGPN | NetworkEnsemble
    candidate: VGPNCandidate
    scores: dict[str, float] = field(default_factory=dict)
    fits: dict[str, VGPNFit] = field(default_factory=dict)
    fit_seconds: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    crossfit: tuple[float, float] | None = None
    calibrated: bool = False
    num_train: int = 0
    num_val: int = 0
    weights: dict[str, float] = field(default_factory=dict)
    combine_crossfit: tuple[float, float] | None = None
    models: dict[str, VariationalGPN] = field(default_factory=dict)


def stacked_weights(names: Sequence[str], log_densities: Tensor) -> dict[str, float]:
    """The mixture weights a stacked selection keeps, by name: the stacking weights of the
    ``[S, K]`` validation log densities of the ``K`` named candidates
    (:func:`~pyro_gpn.inference.stacking_weights`), those below :data:`MIN_STACKING_WEIGHT`
    dropped and the rest renormalised."""
    weights = stacking_weights(log_densities)
    kept = {n: float(w) for n, w in zip(names, weights) if w >= MIN_STACKING_WEIGHT}
    total = sum(kept.values())
    return {name: w / total for name, w in kept.items()}


def crossfitted_stacked_scores(
    models: Mapping[str, VariationalGPN],
    log_densities: Tensor,
    x_val: Tensor,
    y_val: Tensor,
) -> tuple[float, float]:
    """A stacked mixture's validation score without and with a fitted predictive scale, both
    out of sample, with the stacking inside the cross-fit: the validation rows are split into
    their even and odd rows (as :func:`~pyro_gpn.inference.crossfitted_scores`); on one half
    the stacking weights are fitted (:func:`stacked_weights`) and then the mixture's scale
    (:func:`~pyro_gpn.inference.fit_predictive_scale`), and the other half scores the mixture
    at scale 1 and at that scale; then back. Each half's score is weighted by its share of the
    rows.

    Holding weights fitted on all the rows fixed and cross-fitting only the scale would judge
    the scale on rows that already chose the spread; here neither the weights nor the scale
    has seen the rows that score them. The members are not changed.

    Args:
        models: the ``K`` fitted networks, by name, in the column order of ``log_densities``.
        log_densities: ``[S, K]``: each network's own log predictive density of each
            validation row at its own scale. They set each half's weights (a network with no
            finite density on a half gets weight 0 there); both scores are computed from the
            mixture's own predictive.
        x_val, y_val: the ``S >= 4`` validation rows ``[S, M]`` (2 per half for the scale) and
            their targets, as the networks' ``log_predictive`` takes them (``[S, D]`` or
            ``[S]``).

    Returns:
        ``(uncalibrated, calibrated)``: the cross-fitted mean log predictive density of the
        mixture stacked on the other half, at scale 1 and at the scale fitted there.
    """
    names = list(models)
    check_ndim("log_densities", check_tensor("log_densities", log_densities), 2)
    check_ndim("x_val", check_tensor("x_val", x_val), 2)
    check_tensor("y_val", y_val)
    if log_densities.shape[1] != len(names):
        raise ValueError(
            f"log_densities must have one column per model ({len(names)}), got "
            f"{tuple(log_densities.shape)}"
        )
    if x_val.shape[0] < 4:
        raise ValueError(
            f"x_val needs at least 4 rows to cross-fit (2 per half), got {x_val.shape[0]}"
        )
    if log_densities.shape[0] != x_val.shape[0] or y_val.shape[0] != x_val.shape[0]:
        raise ValueError(
            f"log_densities and y_val must have one row per row of x_val ({x_val.shape[0]}), "
            f"got {log_densities.shape[0]} and {y_val.shape[0]}"
        )
    raw, calibrated = 0.0, 0.0
    for fit_rows, score_rows, share in crossfit_halves(x_val.shape[0]):
        fit = log_densities[fit_rows]
        usable = [k for k in range(len(names)) if bool(torch.isfinite(fit[:, k]).any())]
        kept = stacked_weights([names[k] for k in usable], fit[:, usable])
        mixture = NetworkEnsemble([models[name] for name in kept], list(kept.values()))
        x_score, y_score = x_val[score_rows], y_val[score_rows]
        with torch.no_grad():
            raw += share * float(mixture.log_predictive(x_score, y_score).mean())
            with warnings.catch_warnings():  # a scale at a bound: the check only scores it
                warnings.simplefilter("ignore")
                fit_predictive_scale(mixture, x_val[fit_rows], y_val[fit_rows])
            calibrated += share * float(mixture.log_predictive(x_score, y_score).mean())
    return raw, calibrated


def _head(candidate, num_outputs: int):
    from ..heads import HeteroscedasticGaussianHead, StudentTHead

    if candidate.head == "heteroscedastic":
        return HeteroscedasticGaussianHead(num_outputs, df=candidate.df)
    return "gaussian" if candidate.df is None else StudentTHead(num_outputs, df=candidate.df)


def _layer_weights(candidate, num_layers: int):
    """The candidate's ``weights`` for a network of ``num_layers`` GPN layers: one value for
    every layer, one per layer, or a pair ``(hidden, last)`` that sets every hidden layer and the
    last one (``("point", "variational")``: ``q(W)`` in the last layer only, at any depth)."""
    weights = candidate.weights
    if isinstance(weights, tuple) and len(weights) == 2 and num_layers != 2:
        return (weights[0],) * (num_layers - 1) + (weights[1],)
    return weights


def _check_candidates(candidates, num_outputs: int = 1, num_hidden: int = 1) -> tuple:
    from ..recommended import VGPNCandidate

    candidates = tuple(candidates)
    if not candidates:
        raise ValueError("candidates must hold at least one VGPNCandidate")
    names = set()
    for c in candidates:
        if not isinstance(c, VGPNCandidate):
            raise TypeError(f"candidates must be VGPNCandidate objects, got {type(c).__name__}")
        if c.name in names:
            raise ValueError(f"candidate names must be unique, {c.name!r} appears twice")
        names.add(c.name)
        if not isinstance(c.fit, Mapping):
            raise ValueError(f"candidate {c.name!r}: fit must be a mapping of fit_vgpn keywords")
        unknown = set(c.fit) - _FIT_KEYS
        if unknown:
            raise ValueError(
                f"candidate {c.name!r}: fit may set {sorted(_FIT_KEYS)}, got {sorted(unknown)}"
            )
        if c.head not in ("gaussian", "heteroscedastic"):
            raise ValueError(
                f"candidate {c.name!r}: head must be 'gaussian' or 'heteroscedastic', "
                f"got {c.head!r}"
            )
        width = c.width_factor
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"candidate {c.name!r}: width_factor must be a positive integer")
        try:  # every value a fit would refuse, before any fit runs
            fit_settings(**c.fit)
            VariationalGPN(
                [1] * (num_hidden + 1) + [num_outputs],
                head=_head(c, num_outputs),
                weights=_layer_weights(c, num_hidden + 1),
            )
        except (TypeError, ValueError) as error:
            raise ValueError(f"candidate {c.name!r}: {error}") from error
    return candidates


def select_vgpn(
    x: Tensor,
    y: Tensor,
    x_val: Tensor | None = None,
    y_val: Tensor | None = None,
    *,
    hidden: int | Sequence[int] = 50,
    candidates: Sequence[VGPNCandidate] | None = None,
    calibrate: bool | str = "auto",
    combine: str = "stack",
    val_fraction: float | None = None,
    batch_size: int | None | str = "auto",
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> VGPNSelection:
    """Fit a portfolio of Bayesian GPN configurations and mix them by their stacking weights
    on the validation rows, or keep the one those rows score highest (regression).

    Every candidate is a :class:`~pyro_gpn.models.VariationalGPN` of sizes
    ``[M, width_factor * H_1, ..., width_factor * H_K, D]`` with the candidate's head and
    weights, fitted by :func:`~pyro_gpn.inference.fit_vgpn` with the candidate's schedule on
    ``(x, y)``, stopped on ``(x_val, y_val)`` and scored there by its mean validation log
    predictive density (uncalibrated). Each candidate starts from the same seed. They are
    mixed by their stacking weights on the validation rows (``combine="stack"``,
    :func:`~pyro_gpn.inference.stacking_weights`; weights below ``MIN_STACKING_WEIGHT``
    dropped), or the best one is kept (``"best"``), or whichever of the two scores higher
    cross-fitted on the validation rows (``"auto"``,
    :func:`~pyro_gpn.inference.crossfitted_combination`).
    With ``calibrate="auto"`` the predictive scale of a single kept network is then fitted on
    the validation rows when that raises their cross-fitted score
    (:func:`~pyro_gpn.inference.crossfitted_scores`), and that of a stacked mixture when that
    raises the score cross-fitted with the stacking weights refitted on each half
    (:func:`crossfitted_stacked_scores`).
    Cost: the candidates' fits, one after another (the default portfolio: 8 fits); a stacked
    model's prediction costs one forward pass per network it keeps.

    Args:
        x, y: ``[S, M]`` training inputs and ``[S, D]`` (or ``[S]``) real targets, best
            standardised.
        x_val, y_val: the validation rows; ``None``: a seeded ``val_fraction`` of ``(x, y)``
            (the recommendation, :data:`~pyro_gpn.recommended.VGPN`) is held out. Never pass
            test rows: they would choose the model.
        hidden: the hidden layers' widths before a candidate's ``width_factor``.
        candidates: :class:`~pyro_gpn.recommended.VGPNCandidate` objects (``None``:
            :data:`~pyro_gpn.recommended.VGPN_PORTFOLIO`).
        calibrate: ``"auto"`` (above; needs 4 validation rows), ``True`` (always fit the scale;
            2 rows) or ``False`` (never). ``"auto"`` adopts any cross-fitted gain, however
            small; on small validation sets the scale mostly lost
            (``docs/results/uci.md`` section 17), and this rule then declines it. For a
            stacked mixture of two or more networks the check refits the weights on each half
            before the scale: weights fitted on all the validation rows already set the
            spread there, and a check holding them fixed would judge the scale in-sample
            (sections 29-30).
        combine: ``"stack"`` (the default), ``"best"`` or ``"auto"`` (above; ``"stack"`` and
            ``"auto"`` need 2 validation rows). On the five small UCI sets, kin8nm and power,
            stacking's mean cross-fitted validation score was above the single best
            candidate's, and so was its mean test score (``docs/results/uci.md`` section 29).
        val_fraction: the hold-out share when ``x_val`` is ``None``.
        batch_size: as :func:`~pyro_gpn.inference.fit_vgpn` (``"auto"``: full batch up to
            2,000 rows, mini-batches of 512 above).
        seed: seeds each candidate's initial state, the hold-out and the mini-batches.
        log: called with a line of text after every candidate.

    Returns:
        :class:`VGPNSelection`.

    Raises:
        ValueError: bad arguments (named), or every candidate's fit failed.

    Example::

        >>> sel = select_vgpn(x_train, y_train)  # doctest: +SKIP
        >>> sel.weights, sel.scores  # doctest: +SKIP
        >>> prediction = sel.model.predict(x_test)  # doctest: +SKIP
    """
    from ..recommended import VGPN, VGPN_PORTFOLIO

    check_ndim("x", check_tensor("x", x), 2)
    check_tensor("y", y)
    check_ndim("y", y, (1, 2))
    y = y.reshape(-1, 1) if y.dim() == 1 else y
    if y_val is not None:
        check_ndim("y_val", check_tensor("y_val", y_val), (1, 2))
        y_val = y_val.reshape(-1, 1) if y_val.dim() == 1 else y_val
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"y must have one row per row of x ({x.shape[0]}), got {y.shape[0]}")
    if (x_val is None) != (y_val is None):
        raise ValueError("give both x_val and y_val, or neither")
    if x_val is not None:
        check_ndim("x_val", check_tensor("x_val", x_val), 2)
        if x_val.shape[1] != x.shape[1]:
            raise ValueError(f"x_val must have x's {x.shape[1]} columns, got {x_val.shape[1]}")
        if y_val.shape[0] != x_val.shape[0] or y_val.shape[1:] != y.shape[1:]:
            raise ValueError(
                f"y_val must have one row per row of x_val and y's trailing shape "
                f"{tuple(y.shape[1:])}, got {tuple(y_val.shape)}"
            )
        if val_fraction:
            raise ValueError("val_fraction holds out rows only when no x_val is given")
    for name, value in (("x", x), ("y", y), ("x_val", x_val), ("y_val", y_val)):
        if value is not None:
            check_finite(name, value)
    hidden = (hidden,) if isinstance(hidden, int) else tuple(hidden)
    if not hidden or not all(
        isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in hidden
    ):
        raise ValueError(f"hidden must be a positive integer or a sequence of them, got {hidden}")
    if not (isinstance(calibrate, bool) or calibrate == "auto"):
        raise ValueError(f"calibrate must be True, False or 'auto', got {calibrate!r}")
    if not (isinstance(combine, str) and combine in ("best", "stack", "auto")):
        raise ValueError(f"combine must be 'best', 'stack' or 'auto', got {combine!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    num_outputs = y.shape[1]
    candidates = _check_candidates(
        VGPN_PORTFOLIO if candidates is None else candidates, num_outputs, len(hidden)
    )

    if x_val is None:
        fraction = VGPN.val_fraction if val_fraction is None else val_fraction
        x, y, x_val, y_val = holdout(x, y, fraction, seed)
    # cross-fitting fits the scale on each half of the rows, and a fit needs 2 rows
    needed = {"auto": 4, True: 2, False: 1}[calibrate]
    if x_val.shape[0] < needed:
        raise ValueError(
            f"calibrate={calibrate!r} needs at least {needed} validation rows, got "
            f"{x_val.shape[0]}: give more (x_val, val_fraction)"
            + ("" if calibrate is False else " or pass calibrate=False")
        )
    if combine != "best" and x_val.shape[0] < 2:
        raise ValueError(
            f"combine={combine!r} needs at least 2 validation rows, got {x_val.shape[0]}: "
            "give more (x_val, val_fraction) or pass combine='best'"
        )

    best_name, best_score, best_model = None, -math.inf, None
    scores, fits, seconds, errors, models, val_rows = {}, {}, {}, {}, {}, {}
    for candidate in candidates:
        start = time.perf_counter()
        torch.manual_seed(seed)
        sizes = [x.shape[1], *(candidate.width_factor * h for h in hidden), num_outputs]
        model = VariationalGPN(
            sizes,
            head=_head(candidate, num_outputs),
            weights=_layer_weights(candidate, len(hidden) + 1),
        )
        try:
            fit = fit_vgpn(
                model, x, y, x_val, y_val, batch_size=batch_size, seed=seed, **candidate.fit
            )
        except (FloatingPointError, torch.linalg.LinAlgError) as error:
            scores[candidate.name] = -math.inf
            errors[candidate.name] = str(error)
            seconds[candidate.name] = time.perf_counter() - start
            if log is not None:
                log(f"{candidate.name}: failed ({error})")
            continue
        with torch.no_grad():
            rows = model.log_predictive(x_val, y_val)
        score = float(rows.mean())
        if not math.isfinite(score):
            errors[candidate.name] = f"validation log-likelihood {score}"
            score = -math.inf
        else:
            models[candidate.name], val_rows[candidate.name] = model, rows.double()
        fits[candidate.name] = fit
        scores[candidate.name] = score
        seconds[candidate.name] = time.perf_counter() - start
        if log is not None:
            log(
                f"{candidate.name}: validation log-lik {score:.4f} ({fit.num_steps} steps, "
                f"{seconds[candidate.name]:.1f} s)"
            )
        if best_model is None or score > best_score:
            best_name, best_score, best_model = candidate.name, score, model
    if best_model is None or not math.isfinite(best_score):
        raise ValueError(f"every candidate's fit failed: {errors}")
    chosen = next(c for c in candidates if c.name == best_name)
    kept = {best_name: 1.0}
    combine_crossfit = None
    if combine != "best" and len(models) > 1:
        log_densities = torch.stack(list(val_rows.values()), 1)  # [S_val, K]
        if combine == "auto":
            combine_crossfit = crossfitted_combination(log_densities)
        if combine == "stack" or combine_crossfit[1] > combine_crossfit[0]:
            kept = stacked_weights(list(models), log_densities)
    if len(kept) == 1:
        model = models[next(iter(kept))]
    else:
        model = NetworkEnsemble([models[name] for name in kept], list(kept.values()))
    out = VGPNSelection(
        model=model,
        candidate=chosen,
        weights=kept,
        combine_crossfit=combine_crossfit,
        models=models,
        scores=scores,
        fits=fits,
        fit_seconds=seconds,
        errors=errors,
        num_train=int(x.shape[0]),
        num_val=int(x_val.shape[0]),
    )
    # a stacked mixture's weights were fitted on all the validation rows: the cross-fitted
    # check refits them on each half before the scale (crossfitted_stacked_scores)
    if calibrate is not False:
        with validation(False):
            if calibrate == "auto" and isinstance(model, NetworkEnsemble):
                out.crossfit = crossfitted_stacked_scores(
                    models, torch.stack(list(val_rows.values()), 1), x_val, y_val
                )
            elif calibrate == "auto":
                out.crossfit = crossfitted_scores(model, x_val, y_val)
            if calibrate is True or out.crossfit[1] > out.crossfit[0]:
                fit_predictive_scale(model, x_val, y_val)
                out.calibrated = True
    if log is not None:
        mixture = ", ".join(f"{name} {w:.3f}" for name, w in kept.items())
        log(
            f"best {best_name} (validation log-lik {best_score:.4f}); kept {mixture}; "
            f"calibrated: {out.calibrated}"
        )
    return out
