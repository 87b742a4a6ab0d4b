"""Choosing the Bayesian GPN's configuration on validation rows: ``select_vgpn``, its portfolio
(``pyro_gpn.recommended.VGPN_PORTFOLIO``), ``crossfitted_scores`` and
``crossfitted_stacked_scores``.

References that do not share the code under test: a candidate's score against a plain
``fit_vgpn`` of the same network and seed; the cross-fitted scores against the two halves
written out by hand with the Gaussian scale's closed form ``sqrt(mean(z^2))``; the stacked
mixture's cross-fitted scores against scipy's optimisers and normal density. (The portfolio
against the benchmark's per-set choices, ``benchmarks/uci.py``'s ``CHOSEN``, is
``tests/benchmarks/test_uci.py``'s.)
"""

import math

import numpy as np
import pytest
import torch

from pyro_gpn.heads import GaussianHead, StudentTHead
from pyro_gpn.inference import (
    VGPNFit,
    crossfitted_combination,
    crossfitted_scores,
    crossfitted_stacked_scores,
    fit_vgpn,
    predictive_scale_of,
    select_vgpn,
    stacking_weights,
)
from pyro_gpn.inference import selection as selection_module
from pyro_gpn.models import NetworkEnsemble, VariationalGPN
from pyro_gpn.recommended import VGPN, VGPN_PORTFOLIO, VGPNCandidate

pytestmark = pytest.mark.usefixtures("fresh_param_store")

STEPS = {"num_steps": 150, "eval_every": 25}


def _outlier_data(rows: int = 240, seed: int = 0, share: float = 0.1):
    """A sine with small Gaussian noise and one row in ten moved by a draw of sd 3: Gaussian
    noise must widen to cover the outliers, Student-t noise need not."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(rows, 2, generator=gen) * 4 - 2
    y = torch.sin(2 * x[:, :1]) + 0.05 * torch.randn(rows, 1, generator=gen)
    outlier = torch.rand(rows, 1, generator=gen) < share
    return x, torch.where(outlier, y + 3 * torch.randn(rows, 1, generator=gen), y)


def _split(x, y, num_val: int = 60):
    return x[num_val:], y[num_val:], x[:num_val], y[:num_val]


def _candidates():
    return [
        VGPNCandidate("gaussian", fit=dict(STEPS)),
        VGPNCandidate("het", head="heteroscedastic", fit=dict(STEPS)),
        VGPNCandidate("t4", df=4.0, fit=dict(STEPS)),
    ]


def test_selection_keeps_the_candidate_its_validation_rows_score_highest():
    """On data with outliers Student-t noise wins by a wide margin; the kept network is that
    candidate's, and its validation score is the recorded one."""
    x, y, x_val, y_val = _split(*_outlier_data())
    sel = select_vgpn(
        x, y, x_val, y_val, hidden=6, candidates=_candidates(), calibrate=False, combine="best"
    )
    assert list(sel.scores) == ["gaussian", "het", "t4"]
    assert sel.candidate.name == max(sel.scores, key=sel.scores.get) == "t4"
    assert sel.scores["t4"] > sel.scores["gaussian"] + 0.5
    assert isinstance(sel.model.head, StudentTHead)
    with torch.no_grad():
        assert float(sel.model.log_predictive(x_val, y_val).mean()) == pytest.approx(
            sel.scores["t4"], abs=1e-6
        )
    assert (sel.num_train, sel.num_val) == (180, 60)
    assert not sel.calibrated and sel.crossfit is None
    assert set(sel.fits) == set(sel.fit_seconds) == set(sel.scores)


def test_each_candidate_is_the_plain_fit_of_its_configuration():
    """A candidate inside the selection is exactly ``fit_vgpn`` of the same network, seed and
    schedule run alone: the same validation curve and score."""
    x, y, x_val, y_val = _split(*_outlier_data())
    candidate = VGPNCandidate(
        "t4_point", df=4.0, weights="point", width_factor=2, fit={**STEPS, "lr": 0.02}
    )
    sel = select_vgpn(x, y, x_val, y_val, hidden=3, candidates=[candidate], seed=7, calibrate=False)
    torch.manual_seed(7)
    net = VariationalGPN([2, 6, 1], head=StudentTHead(1, df=4.0), weights="point")
    fit = fit_vgpn(net, x, y, x_val, y_val, seed=7, **STEPS, lr=0.02)
    assert sel.fits["t4_point"].curve == fit.curve
    with torch.no_grad():
        score = float(net.log_predictive(x_val, y_val).mean())
    assert sel.scores["t4_point"] == pytest.approx(score, abs=1e-9)
    assert [layer.out_features for layer in sel.model.layers] == [6, 1]


def test_holdout_when_no_validation_rows_are_given():
    x, y = _outlier_data(100)
    sel = select_vgpn(x, y, hidden=4, candidates=_candidates()[:1], calibrate=False)
    assert (sel.num_train, sel.num_val) == (90, 10)


def test_calibration_follows_the_crossfitted_scores():
    """A network whose predictive is too wide (its noise held at its start by the warm-up, on
    data with little noise): the cross-fitted calibrated score is higher, so ``"auto"`` fits the
    scale (below 1); ``False`` leaves it at 1; ``True`` fits it whatever the scores."""
    x, y, x_val, y_val = _split(*_outlier_data(share=0.0))
    wide = [VGPNCandidate("wide_noise", fit={"num_steps": 60, "noise_warmup": 60})]
    auto = select_vgpn(x, y, x_val, y_val, hidden=4, candidates=wide)
    raw, calibrated = auto.crossfit
    assert calibrated > raw + 0.02
    assert auto.calibrated
    assert float(auto.model.head.predictive_scale) < 0.9
    never = select_vgpn(x, y, x_val, y_val, hidden=4, candidates=wide, calibrate=False)
    assert float(never.model.head.predictive_scale) == 1.0
    always = select_vgpn(x, y, x_val, y_val, hidden=4, candidates=wide, calibrate=True)
    assert always.calibrated and always.crossfit is None
    assert float(always.model.head.predictive_scale) == pytest.approx(
        float(auto.model.head.predictive_scale), rel=1e-6
    )


def test_auto_calibration_declines_where_the_crossfitted_score_falls(monkeypatch):
    x, y, x_val, y_val = _split(*_outlier_data())
    monkeypatch.setattr(selection_module, "crossfitted_scores", lambda *a, **k: (-1.0, -1.5))
    sel = select_vgpn(x, y, x_val, y_val, hidden=4, candidates=_candidates()[:1])
    assert sel.crossfit == (-1.0, -1.5) and not sel.calibrated
    assert float(sel.model.head.predictive_scale) == 1.0


def test_crossfitted_scores_against_the_halves_written_out():
    """A Gaussian predictive: the scale fitted on one half is ``sqrt(mean(z^2))`` of that half
    (closed form), scored on the other; the model's scale is left as it was."""
    torch.manual_seed(0)
    net = VariationalGPN([2, 4, 1], head=GaussianHead(1, noise_std_init=2.0))
    x, y = _outlier_data(41, share=0.0)
    net.head.predictive_scale.fill_(0.5)
    raw, calibrated = crossfitted_scores(net, x, y)
    assert float(net.head.predictive_scale) == 0.5
    with torch.no_grad():
        pred = net.predict(x)  # at scale 0.5
    mean, sd = pred.mean[:, 0].double(), pred.std[:, 0].double() / 0.5
    z = (y[:, 0].double() - mean) / sd
    normal = torch.distributions.Normal(0.0, 1.0)
    halves = [torch.arange(0, 41, 2), torch.arange(1, 41, 2)]
    want_raw = want_cal = 0.0
    for fit_rows, score_rows in (halves, halves[::-1]):
        s = float(z[fit_rows].pow(2).mean().sqrt())
        share = len(score_rows) / 41
        lp = normal.log_prob(z[score_rows]) - sd[score_rows].log()
        want_raw += share * float(lp.mean())
        lp_s = normal.log_prob(z[score_rows] / s) - (s * sd[score_rows]).log()
        want_cal += share * float(lp_s.mean())
    assert raw == pytest.approx(want_raw, abs=1e-5)
    assert calibrated == pytest.approx(want_cal, abs=1e-4)
    assert calibrated > raw  # the predictive is 2x too wide


def test_a_failed_candidate_is_recorded_and_the_others_compete(monkeypatch):
    x, y, x_val, y_val = _split(*_outlier_data())
    real = selection_module.fit_vgpn

    def failing(model, *args, **kwargs):
        if type(model.head) is StudentTHead:
            raise FloatingPointError("non-finite loss at step 3")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(selection_module, "fit_vgpn", failing)
    sel = select_vgpn(x, y, x_val, y_val, hidden=4, candidates=_candidates(), calibrate=False)
    assert sel.scores["t4"] == -math.inf and "step 3" in sel.errors["t4"]
    assert sel.candidate.name in ("gaussian", "het") and "t4" not in sel.fits
    assert "t4" not in sel.models and "t4" not in sel.weights  # nor in the stacked mixture
    only = [c for c in _candidates() if c.name == "t4"]
    with pytest.raises(ValueError, match="every candidate's fit failed"):
        select_vgpn(x, y, x_val, y_val, hidden=4, candidates=only, calibrate=False)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"x": torch.zeros(10)}, "^x must"),
        ({"y": torch.zeros(9, 1)}, "one row per row of x"),
        ({"y": torch.full((10, 1), math.nan)}, "^y "),
        ({"x_val": torch.zeros(4, 2)}, "both x_val and y_val"),
        ({"x_val": torch.zeros(4, 3), "y_val": torch.zeros(4, 1)}, "columns"),
        ({"x_val": torch.zeros(4, 2), "y_val": torch.zeros(3, 1)}, "y_val"),
        ({"hidden": 0}, "hidden"),
        ({"hidden": (4, True)}, "hidden"),
        ({"calibrate": "yes"}, "calibrate"),
        ({"calibrate": 1}, "calibrate"),
        ({"calibrate": 0}, "calibrate"),
        ({"combine": "mean"}, "combine"),
        ({"combine": None}, "combine"),
        (
            {
                "x_val": torch.zeros(1, 2),
                "y_val": torch.zeros(1, 1),
                "calibrate": False,
                "combine": "stack",
            },
            "combine='stack' needs at least 2 validation rows",
        ),
        ({"x_val": torch.zeros(3, 2), "y_val": torch.zeros(3, 1)}, "at least 4 validation rows"),
        (
            {"x_val": torch.zeros(1, 2), "y_val": torch.zeros(1, 1), "calibrate": True},
            "at least 2 validation rows",
        ),
        ({"candidates": [VGPNCandidate("a", df=1.0)]}, "candidate 'a'"),
        ({"candidates": [VGPNCandidate("a", weights="pointt")]}, "candidate 'a'"),
        ({"candidates": [VGPNCandidate("a", fit={"num_steps": 0})]}, "candidate 'a': num_steps"),
        ({"candidates": [VGPNCandidate("a", fit={"lr": -1.0})]}, "candidate 'a': lr"),
        ({"candidates": [VGPNCandidate("a", fit=[("lr", 1.0)])]}, "mapping"),
        ({"candidates": [VGPNCandidate("a", fit={"lr": True})]}, "candidate 'a': lr"),
        (
            {"x_val": torch.zeros(0, 2), "y_val": torch.zeros(0, 1), "calibrate": False},
            r"at least 1 validation rows, got 0: give more \(x_val, val_fraction\)$",
        ),
        ({"seed": 1.5}, "seed"),
        ({"candidates": []}, "at least one"),
        ({"candidates": ["default"]}, "VGPNCandidate"),
        ({"candidates": [VGPNCandidate("a"), VGPNCandidate("a")]}, "unique"),
        ({"candidates": [VGPNCandidate("a", fit={"steps": 3})]}, "fit may set"),
        ({"candidates": [VGPNCandidate("a", width_factor=0)]}, "width_factor"),
        ({"candidates": [VGPNCandidate("a", head="poisson")]}, "head"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    args = {"x": torch.zeros(10, 2), "y": torch.zeros(10, 1), "hidden": 4}
    args.update(kwargs)
    if "candidates" not in args:
        args["candidates"] = [VGPNCandidate("a", fit={"num_steps": 1})]
    with pytest.raises((TypeError, ValueError), match=match):
        select_vgpn(args.pop("x"), args.pop("y"), **args)


def test_bad_arguments_are_refused_before_any_fit(monkeypatch):
    """A bad candidate late in the list, or too few validation rows for the calibration, is
    refused before the first candidate is fitted."""
    calls = []
    monkeypatch.setattr(selection_module, "fit_vgpn", lambda *a, **k: calls.append(1))
    x, y = torch.zeros(30, 2), torch.zeros(30, 1)
    late = [VGPNCandidate("a"), VGPNCandidate("b", fit={"patience": -1})]
    with pytest.raises(ValueError, match="candidate 'b': patience"):
        select_vgpn(x, y, hidden=2, candidates=late)
    with pytest.raises(ValueError, match="at least 4 validation rows, got 3"):
        select_vgpn(x, y, hidden=2, candidates=late[:1])  # 10 % of 30 rows
    assert not calls


def _unfitted(monkeypatch):
    """Stub out the fits: every candidate keeps its initial state (fast, and reproducible by
    building the same network after the same seed)."""
    monkeypatch.setattr(selection_module, "fit_vgpn", lambda *a, **k: VGPNFit())


def test_every_candidate_starts_from_the_seed(monkeypatch):
    """Each candidate's network is built right after ``torch.manual_seed(seed)``: the second
    and third candidates' initial states are the network built by hand after that seed, not
    a continuation of the first candidate's random stream."""
    _unfitted(monkeypatch)
    x, y, x_val, y_val = _split(*_outlier_data(80, share=0.0), num_val=20)
    names = ("first", "second", "third")
    candidates = [VGPNCandidate(name) for name in names]
    sel = select_vgpn(
        x, y, x_val, y_val, hidden=4, candidates=candidates, seed=3, calibrate=False,
        combine="best",
    )  # fmt: skip
    torch.manual_seed(3)
    want = VariationalGPN([2, 4, 1], weights=VGPNCandidate("x").weights).state_dict()
    for name in names:
        got = sel.models[name].state_dict()
        assert set(got) == set(want)
        assert all(torch.equal(got[k], want[k]) for k in want), name


def test_forced_calibration_fits_the_scale_on_the_validation_rows(monkeypatch):
    """``calibrate=True`` fits the kept network's scale on the validation rows: for a Gaussian
    predictive ``sqrt(mean(z^2))`` of those rows (closed form), with the validation targets
    shrunk so that the training rows would give a very different scale."""
    _unfitted(monkeypatch)
    x, y, x_val, y_val = _split(*_outlier_data(120, share=0.0), num_val=40)
    y_val = 0.2 * y_val
    sel = select_vgpn(
        x, y, x_val, y_val, hidden=4, candidates=[VGPNCandidate("a")], calibrate=True,
        combine="best",
    )  # fmt: skip
    assert sel.calibrated
    torch.manual_seed(0)
    net = VariationalGPN([2, 4, 1], weights=VGPNCandidate("a").weights)
    with torch.no_grad():
        pred = net.predict(x_val)
        pred_train = net.predict(x)
    z = (y_val.double() - pred.mean.double()) / pred.std.double()
    want = float(z.square().mean().sqrt())
    z_train = (y.double() - pred_train.mean.double()) / pred_train.std.double()
    assert abs(float(z_train.square().mean().sqrt()) - want) > 0.1 * want  # rows matter
    assert float(sel.model.head.predictive_scale) == pytest.approx(want, rel=1e-6)


def test_a_heteroscedastic_candidate_keeps_its_degrees_of_freedom(monkeypatch):
    """``VGPNCandidate(head="heteroscedastic", df=4.0)`` is the heteroscedastic head with t
    noise of 4 degrees of freedom (the portfolio's ``het_t4_qw2``); without ``df`` Gaussian."""
    from pyro_gpn.heads import HeteroscedasticGaussianHead

    _unfitted(monkeypatch)
    x, y, x_val, y_val = _split(*_outlier_data(80, share=0.0), num_val=20)
    candidates = [
        VGPNCandidate("het_t4", head="heteroscedastic", df=4.0),
        VGPNCandidate("het", head="heteroscedastic"),
    ]
    sel = select_vgpn(x, y, x_val, y_val, hidden=3, candidates=candidates, calibrate=False)
    heads = {name: net.head for name, net in sel.models.items()}
    assert all(type(h) is HeteroscedasticGaussianHead for h in heads.values())
    assert heads["het_t4"].df == 4.0 and heads["het"].df is None
    portfolio = {c.name: c for c in VGPN_PORTFOLIO}
    assert selection_module._head(portfolio["het_t4_qw2"], 1).df == 4.0


def test_stacked_weights_drop_the_floor_and_renormalise(monkeypatch):
    """Weights below ``MIN_STACKING_WEIGHT`` (1e-4) are dropped with their networks and the
    rest divided by their sum (written out: ``0.6 / 0.99995`` and ``0.39995 / 0.99995``)."""
    given = torch.tensor([0.6, 0.39995, 0.00005], dtype=torch.float64)
    monkeypatch.setattr(selection_module, "stacking_weights", lambda log_densities: given)
    kept = selection_module.stacked_weights(["a", "b", "c"], torch.zeros(5, 3))
    assert list(kept) == ["a", "b"]
    assert kept["a"] == pytest.approx(0.6 / 0.99995, rel=1e-12)
    assert kept["b"] == pytest.approx(0.39995 / 0.99995, rel=1e-12)
    assert sum(kept.values()) == pytest.approx(1.0, abs=1e-15)


# ------------------------------------------------------------------------------ stacking


def _candidate_rows(sel, x_val, y_val):
    """Every kept candidate's validation log densities ``[S, K]``, recomputed from its network."""
    with torch.no_grad():
        return torch.stack(
            [net.log_predictive(x_val, y_val).double() for net in sel.models.values()], 1
        )


def test_stack_mixes_the_candidates_by_their_stacking_weights():
    """``combine="stack"``: the kept networks and weights are the stacking optimum over every
    candidate's validation rows (weights below the floor dropped, the rest renormalised), and
    the model's log density is that mixture of the candidates' own densities; its validation
    score is at least the best single candidate's."""
    x, y, x_val, y_val = _split(*_outlier_data(share=0.05))
    sel = select_vgpn(
        x, y, x_val, y_val, hidden=6, candidates=_candidates(), calibrate=False, combine="stack"
    )
    assert list(sel.models) == ["gaussian", "het", "t4"] and sel.combine_crossfit is None
    weights = stacking_weights(_candidate_rows(sel, x_val, y_val))
    kept = {n: float(w) for n, w in zip(sel.models, weights) if w >= 1e-4}
    total = sum(kept.values())
    assert sel.weights == pytest.approx({n: w / total for n, w in kept.items()}, abs=1e-9)
    names = list(sel.weights)
    with torch.no_grad():
        own = torch.stack([sel.models[n].log_predictive(x_val, y_val).double() for n in names])
        got = sel.model.log_predictive(x_val, y_val).double()
    log_w = torch.tensor([math.log(sel.weights[n]) for n in names], dtype=torch.float64)
    torch.testing.assert_close(got, torch.logsumexp(own + log_w[:, None], 0), rtol=0, atol=1e-5)
    assert float(got.mean()) >= max(sel.scores.values()) - 1e-6
    assert len(names) > 1 and isinstance(sel.model, NetworkEnsemble)
    assert sel.candidate.name == max(sel.scores, key=sel.scores.get)


def test_stack_of_models_that_need_each_other_keeps_both(monkeypatch):
    """Two candidates, each far better on its own half of the validation rows (their densities
    set by hand): stacking keeps both with weights near one half, and ``"auto"`` stacks, its
    cross-fitted stacked score above the cross-fitted choice's."""
    x, y, x_val, y_val = _split(*_outlier_data(share=0.0))
    even = torch.arange(x_val.shape[0]) // 2 % 2 == 0  # rows 0, 1, 4, 5, ...: in both halves

    def split_minds(self, xs, ys, **kwargs):  # the narrow network fits half the rows
        good = even if self.sizes[1] == 4 else ~even
        return torch.where(good, torch.tensor(0.0), torch.tensor(-3.0))

    monkeypatch.setattr(selection_module, "fit_vgpn", lambda *a, **k: VGPNFit())
    monkeypatch.setattr(selection_module.VariationalGPN, "log_predictive", split_minds)
    candidates = [VGPNCandidate("narrow"), VGPNCandidate("wide", width_factor=2)]
    sel = select_vgpn(
        x, y, x_val, y_val, hidden=4, candidates=candidates, calibrate=False, combine="auto"
    )
    best, stacked = sel.combine_crossfit
    assert stacked > best + 0.5
    assert set(sel.weights) == {"narrow", "wide"}
    assert all(abs(w - 0.5) < 0.05 for w in sel.weights.values())
    assert isinstance(sel.model, NetworkEnsemble)


def test_auto_keeps_the_best_where_the_crossfitted_choice_wins(monkeypatch):
    x, y, x_val, y_val = _split(*_outlier_data())
    monkeypatch.setattr(selection_module, "crossfitted_combination", lambda rows: (-1.0, -1.2))
    sel = select_vgpn(
        x, y, x_val, y_val, hidden=4, candidates=_candidates(), calibrate=False, combine="auto"
    )
    assert sel.combine_crossfit == (-1.0, -1.2)
    assert sel.weights == {sel.candidate.name: 1.0}
    assert sel.model is sel.models[sel.candidate.name]


def _too_wide_pair():
    """Two networks whose noise the warm-up holds at its (wide) start throughout."""
    return [
        VGPNCandidate("wide_noise", fit={"num_steps": 60, "noise_warmup": 60}),
        VGPNCandidate("wider", fit={"num_steps": 50, "noise_warmup": 50}),
    ]


def test_a_stacked_model_is_calibrated_as_a_whole(monkeypatch):
    """The scale of a stacked mixture is the ensemble's (its members keep theirs at 1). Two
    networks whose noise is held wide by the warm-up, on data with little noise: the scale falls
    below 1 with ``calibrate=True``; ``"auto"`` fits the same scale, because the score
    cross-fitted with the stacking inside rises; ``False`` leaves it at 1."""
    x, y, x_val, y_val = _split(*_outlier_data(share=0.0))
    wide = _too_wide_pair()
    halves = torch.tensor([0.5, 0.5], dtype=torch.float64)
    monkeypatch.setattr(selection_module, "stacking_weights", lambda log_densities: halves)
    forced = select_vgpn(x, y, x_val, y_val, hidden=4, candidates=wide, calibrate=True)
    assert isinstance(forced.model, NetworkEnsemble) and forced.calibrated
    assert forced.weights == {"wide_noise": 0.5, "wider": 0.5} and forced.crossfit is None
    assert float(predictive_scale_of(forced.model)) < 0.9
    assert all(float(m.head.predictive_scale) == 1.0 for m in forced.model.members)
    auto = select_vgpn(x, y, x_val, y_val, hidden=4, candidates=wide)
    assert isinstance(auto.model, NetworkEnsemble) and auto.calibrated
    raw, calibrated = auto.crossfit
    assert calibrated > raw + 0.02
    assert float(predictive_scale_of(auto.model)) == pytest.approx(
        float(predictive_scale_of(forced.model)), rel=1e-6
    )
    assert all(float(m.head.predictive_scale) == 1.0 for m in auto.model.members)
    never = select_vgpn(x, y, x_val, y_val, hidden=4, candidates=wide, calibrate=False)
    assert float(predictive_scale_of(never.model)) == 1.0 and never.crossfit is None


def test_auto_leaves_a_stacked_model_unscaled_where_its_crossfitted_score_falls(monkeypatch):
    """The nested check gets every fitted network and its validation rows, and a fall in its
    calibrated score leaves the mixture at scale 1."""
    x, y, x_val, y_val = _split(*_outlier_data(share=0.0))
    halves = torch.tensor([0.5, 0.5], dtype=torch.float64)
    monkeypatch.setattr(selection_module, "stacking_weights", lambda log_densities: halves)
    seen = []

    def falls(models, log_densities, xs, ys):
        seen.append((list(models), tuple(log_densities.shape), xs.shape[0]))
        return (-1.0, -1.5)

    monkeypatch.setattr(selection_module, "crossfitted_stacked_scores", falls)
    sel = select_vgpn(x, y, x_val, y_val, hidden=4, candidates=_too_wide_pair())
    assert seen == [(["wide_noise", "wider"], (60, 2), 60)]
    assert isinstance(sel.model, NetworkEnsemble)
    assert sel.crossfit == (-1.0, -1.5) and not sel.calibrated
    assert float(predictive_scale_of(sel.model)) == 1.0


def _gaussian_pair(rows: int = 41):
    """Two untrained networks with Gaussian predictives of different means, and rows drawn
    from the first network's predictive on most even rows and from the second's on most odd
    ones (so the two halves stack them with different weights), at 1.5 times its spread (so
    the mixture's fitted scale is above 1)."""
    torch.manual_seed(0)
    first = VariationalGPN([2, 4, 1], head=GaussianHead(1, noise_std_init=0.3))
    torch.manual_seed(1)
    second = VariationalGPN([2, 4, 1], head=GaussianHead(1, noise_std_init=0.3))
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(rows, 2, generator=gen) * 4 - 2
    with torch.no_grad():
        a, b = first.predict(x), second.predict(x)
    index = torch.arange(rows)[:, None]
    from_first = (index % 2 == 0) != (index % 10 < 2)  # 4 in 5 even rows, 1 in 5 odd ones
    mean = torch.where(from_first, a.mean, b.mean)
    sd = torch.where(from_first, a.std, b.std)
    y = mean + 1.5 * sd * torch.randn(rows, 1, generator=gen)
    return {"first": first, "second": second}, x, y


def test_crossfitted_stacked_scores_against_the_halves_written_out():
    """Two Gaussian predictives: on each half the stacking weights (scipy's SLSQP over the
    simplex) and then the mixture's scale (scipy's bounded scalar search over the log density
    of the stretched mixture, written with scipy's normal density) are fitted, and the other
    half scored at scale 1 and at that scale; the members' scales stay at 1."""
    from scipy import optimize, stats

    models, x, y = _gaussian_pair()
    with torch.no_grad():
        preds = [models[n].predict(x) for n in models]
        rows = torch.stack([models[n].log_predictive(x, y).double() for n in models], 1)
    mean = torch.stack([p.mean[:, 0] for p in preds], 1).double().numpy()  # [S, 2]
    sd = torch.stack([p.std[:, 0] for p in preds], 1).double().numpy()
    target = y[:, 0].double().numpy()

    def mixture_log_density(w, s, idx):
        centre = (w * mean[idx]).sum(1)
        u = centre + (target[idx] - centre) / s
        dens = (w * stats.norm.pdf(u[:, None], mean[idx], sd[idx])).sum(1)
        return np.log(dens) - np.log(s)

    halves = [np.arange(0, 41, 2), np.arange(1, 41, 2)]
    want_raw = want_cal = 0.0
    for fit_rows, score_rows in (halves, halves[::-1]):
        res = optimize.minimize(
            lambda w, idx=fit_rows: -mixture_log_density(w, 1.0, idx).mean(),
            np.array([0.5, 0.5]),
            method="SLSQP",
            bounds=[(0, 1)] * 2,
            constraints={"type": "eq", "fun": lambda w: w.sum() - 1},
            options={"ftol": 1e-14},
        )
        w = res.x.clip(0) / res.x.clip(0).sum()
        scale = optimize.minimize_scalar(
            lambda t, w=w, idx=fit_rows: -mixture_log_density(w, np.exp(t), idx).mean(),
            bounds=(np.log(1e-2), np.log(1e2)),
            method="bounded",
            options={"xatol": 1e-10},
        )
        share = len(score_rows) / 41
        want_raw += share * mixture_log_density(w, 1.0, score_rows).mean()
        want_cal += share * mixture_log_density(w, np.exp(scale.x), score_rows).mean()
    raw, calibrated = crossfitted_stacked_scores(models, rows, x, y)
    assert raw == pytest.approx(want_raw, abs=1e-5)
    assert calibrated == pytest.approx(want_cal, abs=1e-4)
    assert all(float(m.head.predictive_scale) == 1.0 for m in models.values())


def test_crossfitted_stacked_scores_at_scale_one_is_the_crossfitted_stack():
    """Its uncalibrated score is the stacked score of ``crossfitted_combination`` on the same
    halves (no weight below the floor here)."""
    models, x, y = _gaussian_pair(40)
    with torch.no_grad():
        rows = torch.stack([models[n].log_predictive(x, y).double() for n in models], 1)
    raw, _ = crossfitted_stacked_scores(models, rows, x, y)
    assert raw == pytest.approx(crossfitted_combination(rows)[1], abs=1e-6)


def test_crossfitted_stacked_scores_gives_no_weight_where_a_model_has_no_mass():
    """A network whose density is ``-inf`` on the even rows takes no part in the mixture
    stacked there: the odd rows are scored by the other network alone; the even rows by the
    mixture stacked on the odd rows, where both have mass."""
    models, x, y = _gaussian_pair(40)
    with torch.no_grad():
        rows = torch.stack([models[n].log_predictive(x, y).double() for n in models], 1)
    given = rows.clone()
    given[0::2, 1] = -math.inf
    raw, _ = crossfitted_stacked_scores(models, given, x, y)
    odd_alone = float(rows[1::2, 0].mean())
    w = stacking_weights(rows[1::2])
    even_mixed = float(torch.logsumexp(rows[0::2] + w.log(), 1).mean())
    assert 0.0 < float(w.min()) and float(w.max()) < 1.0
    assert raw == pytest.approx(0.5 * odd_alone + 0.5 * even_mixed, abs=1e-6)


@pytest.mark.parametrize(
    "rows, x_rows, match",
    [
        ((40, 3), 40, "one column per model"),
        ((40, 2), 41, "one row per row of x_val"),
        ((3, 2), 3, "at least 4"),
    ],
)
def test_crossfitted_stacked_scores_refuses_bad_shapes(rows, x_rows, match):
    models, x, y = _gaussian_pair(41)
    with pytest.raises(ValueError, match=match):
        crossfitted_stacked_scores(models, torch.zeros(rows), x[:x_rows], y[:x_rows])
    with pytest.raises(ValueError, match="y_val must have one row per row of x_val"):
        crossfitted_stacked_scores(models, torch.zeros(41, 2), x, y[:40])


def test_a_stack_of_one_network_is_calibrated_as_a_single_network(monkeypatch):
    """Where the stacking weights keep one network, ``"auto"`` treats it as a single network:
    its own scale, fitted where the cross-fitted score rises."""
    x, y, x_val, y_val = _split(*_outlier_data(share=0.0))
    wide = _too_wide_pair()
    one = torch.tensor([1.0, 0.0], dtype=torch.float64)
    monkeypatch.setattr(selection_module, "stacking_weights", lambda log_densities: one)
    sel = select_vgpn(x, y, x_val, y_val, hidden=4, candidates=wide)
    assert not isinstance(sel.model, NetworkEnsemble) and sel.model is sel.models["wide_noise"]
    assert sel.weights == {"wide_noise": 1.0}
    raw, calibrated = sel.crossfit
    assert calibrated > raw and sel.calibrated
    assert float(sel.model.head.predictive_scale) < 0.9


def test_one_dimensional_targets_are_one_output():
    x, y, x_val, y_val = _split(*_outlier_data(120, share=0.0))
    sel = select_vgpn(
        x, y[:, 0], x_val, y_val[:, 0], hidden=3, candidates=_candidates()[:1], calibrate="auto"
    )
    assert sel.model.layers[-1].out_features == 1 and sel.crossfit is not None


def test_a_candidate_with_a_non_finite_score_cannot_win(monkeypatch):
    x, y, x_val, y_val = _split(*_outlier_data())
    real = selection_module.VariationalGPN.log_predictive

    def nan_for_student_t(self, x, y, calibrated=True):
        # NaN in the score only (the training objective calls it with calibrated=False)
        out = real(self, x, y, calibrated)
        return out * math.nan if type(self.head) is StudentTHead and calibrated else out

    monkeypatch.setattr(selection_module.VariationalGPN, "log_predictive", nan_for_student_t)
    sel = select_vgpn(x, y, x_val, y_val, hidden=4, candidates=_candidates(), calibrate=False)
    assert sel.scores["t4"] == -math.inf and "t4" in sel.fits
    assert sel.errors["t4"] == "validation log-likelihood nan"
    assert sel.candidate.name != "t4"
    assert "t4" not in sel.models and "t4" not in sel.weights  # nor in the stacked mixture


def test_the_default_portfolio_works_at_any_depth(monkeypatch):
    """``("point", "variational")`` means ``q(W)`` in the last layer at any depth: with two
    hidden layers every candidate is checked and built (the fits are stubbed out)."""
    built = []

    def stub(model, *args, **kwargs):
        built.append([layer.weight_treatment for layer in model.layers])
        raise FloatingPointError("stub")

    monkeypatch.setattr(selection_module, "fit_vgpn", stub)
    x, y = torch.zeros(30, 2), torch.zeros(30, 1)
    with pytest.raises(ValueError, match="every candidate's fit failed"):
        select_vgpn(x, y, hidden=(2, 2), calibrate=False)
    assert len(built) == len(VGPN_PORTFOLIO)
    assert ["point", "point", "variational"] in built


def test_the_portfolio_is_read_only_and_hashable():
    with pytest.raises(TypeError):
        VGPN_PORTFOLIO[2].fit["lr"] = 1.0
    assert len(set(VGPN_PORTFOLIO)) == len(VGPN_PORTFOLIO)
    assert VGPN_PORTFOLIO[2].as_dict()["fit"]["noise_warmup"] == 1500
    import copy
    import pickle

    for candidate in VGPN_PORTFOLIO:
        assert pickle.loads(pickle.dumps(candidate)) == candidate == copy.deepcopy(candidate)
    assert VGPNCandidate("a", weights=["point", "variational"]).weights == (
        "point",
        "variational",
    )


def test_the_portfolio_starts_with_the_recommendation_and_holds_valid_candidates():
    assert VGPN_PORTFOLIO[0] == VGPNCandidate("default")
    assert VGPN_PORTFOLIO[0].weights == VGPN.weights
    selection_module._check_candidates(VGPN_PORTFOLIO)  # raises on a bad entry
    for candidate in VGPN_PORTFOLIO:
        selection_module._head(candidate, 1)  # raises on a bad head
