"""The capacity of the UCI benchmark's Bayesian GPN (``benchmarks/uci.py``'s ``bgpn_sizes``, the
``hidden`` keyword of ``fit_bgpn`` and of ``benchmarks/uci_variants.py``): the sizes built, the
second hidden layer's start inside the inducing range, and tiny fits of each route."""

import math
from types import SimpleNamespace

import pytest
import torch

from benchmarks.uci import BGPN_CONFIG, bgpn_sizes, fit_bgpn

pytestmark = pytest.mark.usefixtures("fresh_param_store")


def test_sizes_in_units_of_the_set_width():
    assert bgpn_sizes("boston", 13) == [13, 50, 1]
    assert bgpn_sizes("concrete", 8, (1, 1)) == [8, 50, 50, 1]
    assert bgpn_sizes("kin8nm", 8, (2,)) == [8, 100, 1]
    assert bgpn_sizes("protein", 9) == [9, 100, 1]
    assert bgpn_sizes("protein", 9, (1, 1)) == [9, 100, 100, 1]
    for bad in ((), (0,), (1.5,), (True,), (1, -1)):
        with pytest.raises(ValueError, match="hidden"):
            bgpn_sizes("boston", 13, bad)


def test_variants_build_the_named_capacity():
    from benchmarks.uci_variants import VARIANTS

    hidden = {name: kw.get("hidden", (1,)) for name, (_, kw) in VARIANTS.items()}
    for name in (
        "deep",
        "deep_lr02",
        "deep_s1000",
        "deep_s3000",
        "hetero_deep",
        "hetero_deep_s1000",
    ):
        assert bgpn_sizes("concrete", 8, hidden[name]) == [8, 50, 50, 1]
    for name in ("wide", "wide_lr02", "wide_s1000"):
        assert bgpn_sizes("concrete", 8, hidden[name]) == [8, 100, 1]
    # each capacity variant changes one thing against its schedule's baseline
    assert VARIANTS["deep_s1000"][0] == VARIANTS["s1000"][0]
    assert VARIANTS["deep_lr02"][0] == VARIANTS["lr02"][0]
    assert VARIANTS["hetero_deep"][1] == {**VARIANTS["hetero"][1], "hidden": (1, 1)}


@pytest.mark.parametrize("hidden", [(1, 1), (2,)])
def test_every_layer_starts_inside_the_inducing_range(hidden):
    """With the recommended start (Glorot means of ``q(W)``, identity targets) the activations
    of standardised inputs stay of order one in every layer of the deeper and wider nets: the
    second hidden layer needs no other initialisation (its activations would leave the
    inducing range ``[-2, 2]``, where the activation function decays to the prior mean, if the
    weights did not scale with the fan-in)."""
    from pyro_gpn.models import VariationalGPN
    from pyro_gpn.moments import Moments

    torch.manual_seed(0)
    sizes = bgpn_sizes("kin8nm", 8, hidden)
    model = VariationalGPN(sizes)
    moments = Moments(torch.randn(2000, 8))
    for layer in model.layers:
        low, high = float(layer.inducing_points.min()), float(layer.inducing_points.max())
        acts = layer.activation_moments(moments)
        spread = acts.mean.std()
        assert 0.1 < spread < 1.2, spread
        outside = ((acts.mean < low) | (acts.mean > high)).double().mean()
        assert outside < 0.01, outside
        moments = layer._propagate(moments)
        assert torch.isfinite(moments.mean).all() and (moments.var >= 0).all()


def _tiny_data(name="boston", rows=120, features=3):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows + 40, features, generator=gen)
    y = torch.sin(2 * x[:, :1]) + 0.1 * torch.randn(rows + 40, 1, generator=gen)
    return SimpleNamespace(
        name=name,
        num_features=features,
        x_train=x[:rows],
        y_train=y[:rows],
        x_val=x[rows:],
        y_val=y[rows:],
        y_std=torch.tensor(1.0),
    )


def _record_networks(monkeypatch) -> list:
    """Make ``pyro_gpn.models.VariationalGPN`` append every network it builds to the list
    returned (``fit_bgpn`` builds its own)."""
    import pyro_gpn.models as models

    built = []
    original = models.VariationalGPN

    class Recording(original):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(models, "VariationalGPN", Recording)
    return built


@pytest.mark.parametrize(
    ("hidden", "head", "widths"),
    [
        ((1, 1), "gaussian", [(3, 50), (50, 50), (50, 1)]),
        ((2,), "heteroscedastic", [(3, 100), (100, 2)]),
    ],
)
def test_fit_bgpn_builds_and_fits_the_capacity(monkeypatch, hidden, head, widths):
    built = _record_networks(monkeypatch)
    config = {**BGPN_CONFIG, "hidden": hidden, "num_steps": 30, "eval_every": 10}
    if head == "heteroscedastic":
        config["head"] = head
    fit = fit_bgpn(_tiny_data(), config, seed=0)
    (model,) = built
    assert [(layer.in_features, layer.out_features) for layer in model.layers] == widths
    assert fit["sizes"] == bgpn_sizes("boston", 3, hidden)
    assert 10 <= fit["steps"] <= 30 and fit["best_step"] <= fit["steps"]
    mean, var, *weights = fit["predict"](torch.zeros(5, 3))
    assert mean.shape[-1] == 5 and var.shape == mean.shape
    assert torch.isfinite(mean).all() and (var > 0).all()


def test_variant_run_records_the_sizes(monkeypatch):
    import benchmarks.uci_variants as variants
    import pyro_gpn.data.uci_regression as uci_regression

    monkeypatch.setitem(
        variants.VARIANTS,
        "tiny_hetero_deep",
        ({"num_steps": 20}, {"hidden": (1, 1), "head": "heteroscedastic"}),
    )
    monkeypatch.setattr(uci_regression, "load_uci_regression", lambda *a, **k: _tiny_data())
    row = variants.run("tiny_hetero_deep", split=0, name="boston")
    assert row["sizes"] == [3, 50, 50, 1] and row["hidden"] == (1, 1)
    assert row["steps"] <= 20 and math.isfinite(row["val_log_lik"]) and row["cpu_s"] > 0


def test_column_names_list_their_changes_and_chosen_columns_exist():
    """Every ``bgpn_*`` column is ``bgpn`` with the changes its name lists, each one of
    :data:`BGPN_MODIFIERS` and nothing else; every chosen column is a benchmark model."""
    from benchmarks.uci import BGPN_MODELS, BGPN_MODIFIERS, CHOSEN, MODELS, bgpn_config

    assert set(CHOSEN.values()) <= set(MODELS)
    assert bgpn_sizes("kin8nm", 8, bgpn_config("bgpn_wide", "kin8nm")["hidden"]) == [8, 100, 1]
    for model in BGPN_MODELS:
        modifiers = model.split("_")[1:]
        if modifiers in (["trace"], ["issue"]):
            continue
        expected = dict(BGPN_CONFIG)
        for modifier in modifiers:
            expected.update(BGPN_MODIFIERS[modifier])
        config = bgpn_config(model, "wine")  # wine has no set schedule: "long" changes nothing
        assert config == expected, model
    assert bgpn_config("bgpn_wide_point_long", "kin8nm")["set_steps"] == 2000


def test_bgpn_config_pll_suffix_changes_the_objective_only():
    """``<column>_pll`` is the column's configuration with ``elbo="predictive"``; nothing else
    differs (the schedule of ``bgpn_long`` per set, the head of ``bgpn_het``, the width of
    ``bgpn_wide``); names that are not Bayesian GPN columns raise."""
    from benchmarks.uci import BGPN_MODELS, MODELS, PLL, SET_SCHEDULES, bgpn_config

    for base in (m for m in BGPN_MODELS if m not in ("bgpn_trace", "bgpn_issue")):
        assert base + PLL in MODELS
        for name in ("naval", "yacht"):
            plain, pll = bgpn_config(base, name), bgpn_config(base + PLL, name)
            assert pll.pop("elbo") == "predictive"
            assert plain.get("elbo", "closed_form") == "closed_form"
            plain.pop("elbo", None)
            assert pll == plain
    assert bgpn_config("bgpn_long", "naval")["set_steps"] == SET_SCHEDULES["naval"]["num_steps"]
    assert bgpn_config("bgpn_het", "wine")["head"] == "heteroscedastic"
    het_point = bgpn_config("bgpn_het_point", "wine")  # one change against bgpn_het: no q(W)
    assert het_point.pop("weights") == "point"
    assert het_point == {k: v for k, v in bgpn_config("bgpn_het", "wine").items() if k != "weights"}
    # bgpn_wide_long: bgpn_wide with bgpn_long's schedule of the set (none on wine)
    wide_long = bgpn_config("bgpn_wide_long", "protein")
    assert wide_long["hidden"] == (2,) and wide_long["set_steps"] == 3000
    assert wide_long == {**bgpn_config("bgpn_long", "protein"), "hidden": (2,)}
    assert bgpn_config("bgpn_wide_long", "wine") == bgpn_config("bgpn_wide", "wine")
    assert bgpn_config("bgpn_trace", "wine")["elbo"] == "trace"
    assert set(BGPN_MODELS) <= set(MODELS)
    for bad in ("mcdrop", "bgpn_trace_pll", "bgpn_plll"):
        with pytest.raises(ValueError, match="model"):
            bgpn_config(bad, "wine")


def test_compare_pairs_variants_on_the_splits_both_ran(tmp_path):
    """``uci_variants.compare``: the paired difference over the common splits only, its
    standard error and the splits won; a pair with no common split says so."""
    import json

    from benchmarks.uci_variants import compare

    rows = [
        ("a", 0, -1.0), ("a", 1, -2.0), ("a", 2, -3.0),
        ("b", 0, -0.5), ("b", 1, -2.5),
    ]  # fmt: skip
    lines = [
        json.dumps({"variant": v, "split": s, "val_log_lik": ll, "noise_std": 0.1, "best_step": 5})
        for v, s, ll in rows
    ]
    (tmp_path / "toy_budget.jsonl").write_text("\n".join(lines) + "\n")
    table = compare(["toy:a:b", "toy:a:c"], runs=tmp_path).splitlines()
    assert table[2].split(" | ")[3:7] == ["0,1", "-1.500", "-1.500", "+0.000 ± 0.500 (1/2)"]
    assert "not run" in table[3]


def test_fit_bgpn_passes_the_noise_warmup(monkeypatch):
    """The ``warm`` columns' ``noise_warmup`` reaches ``fit_vgpn``: within the warm-up the
    head's noise keeps its initial value; without it the noise trains."""
    built = _record_networks(monkeypatch)
    noise = []
    for warmup in (20, 0):
        config = {**BGPN_CONFIG, "num_steps": 20, "eval_every": 10, "noise_warmup": warmup}
        fit_bgpn(_tiny_data(), config, seed=0)
        noise.append(float(built[-1].head.noise_std))
    assert noise[0] == pytest.approx(0.1, rel=1e-6) and noise[1] != pytest.approx(0.1, rel=1e-3)


def test_calibrated_columns_and_their_facts(monkeypatch):
    """``calibrated`` names the ``cal`` twin of every chosen column (before ``_pll``); a
    calibrated fit records its scale (the head's), a finite cross-fitted validation pair and
    test metrics at scale 1 that equal the same network's with its scale set to 1."""
    from benchmarks.uci import CHOSEN, MODELS, _score, bgpn_config, calibrated

    assert calibrated("bgpn_het_qw2_pll") == "bgpn_het_qw2_cal_pll"
    assert calibrated("bgpn_long") == calibrated("bgpn_long_cal") == "bgpn_long_cal"
    for name, chosen in CHOSEN.items():
        assert calibrated(chosen) in MODELS
        config = bgpn_config(calibrated(chosen), name)
        assert config["calibrate"] is True
        uncalibrated = calibrated(chosen).replace("_cal", "")
        assert {**config, "calibrate": False} == bgpn_config(uncalibrated, name)
    built = _record_networks(monkeypatch)
    data = _tiny_data()
    gen = torch.Generator().manual_seed(1)
    data.x_test = torch.randn(30, 3, generator=gen)
    data.y_test = torch.sin(2 * data.x_test[:, :1]) + 0.1 * torch.randn(30, 1, generator=gen)
    config = {**BGPN_CONFIG, "num_steps": 30, "eval_every": 10, "calibrate": True}
    fit = fit_bgpn(data, config, seed=0)
    (model,) = built
    facts = fit["calibration"]
    assert facts["scale"] == model.head.predictive_scale.tolist()
    assert facts["scale"][0] != 1.0
    assert all(math.isfinite(v) for v in facts["val_crossfit"].values())
    calibrated_test = _score(fit["predict"], data.x_test, data.y_test, 1.0)
    model.head.predictive_scale.fill_(1.0)
    assert facts["test_uncalibrated"] == _score(fit["predict"], data.x_test, data.y_test, 1.0)
    assert calibrated_test["rmse"] == facts["test_uncalibrated"]["rmse"]
    assert calibrated_test["log_lik"] != facts["test_uncalibrated"]["log_lik"]


def test_t4_modifier_gives_student_t_noise_to_either_head():
    from benchmarks.uci import bgpn_config, bgpn_head
    from pyro_gpn.heads import HeteroscedasticGaussianHead, StudentTHead

    het = bgpn_head(bgpn_config("bgpn_het_qw2_t4", "wine"))
    assert isinstance(het, HeteroscedasticGaussianHead) and het.df == 4.0
    homo = bgpn_head(bgpn_config("bgpn_long_t4", "boston"))
    assert isinstance(homo, StudentTHead) and homo.df == 4.0
    assert bgpn_head(bgpn_config("bgpn_long", "boston")) == "gaussian"
    assert bgpn_head(bgpn_config("bgpn_het_qw2", "wine")).df is None
