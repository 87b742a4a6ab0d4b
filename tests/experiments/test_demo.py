"""``pyro-gpn demo``: its schedule is the recommendation, its calibration curve is right, a tiny
run writes what it promises."""

from __future__ import annotations

import json

import pytest
import torch

from pyro_gpn.experiments.cli import build_parser, main
from pyro_gpn.experiments.demo import LEVELS, calibration
from pyro_gpn.recommended import VGPN, VGPN_QUICK


def test_demo_schedule_is_the_recommendation():
    args = build_parser().parse_args(["demo"])
    assert args.steps == VGPN.num_steps and args.gpn_lr == VGPN.lr and args.elbo == VGPN.elbo
    # the short schedule differs from the benchmark's only in the step budget and the learning
    # rate, not in the model
    for name in ("whiten", "targets_init", "weights", "weight_prior_scale", "lr_decay"):
        assert getattr(VGPN_QUICK, name) == getattr(VGPN, name)
    assert VGPN_QUICK.num_steps < VGPN.num_steps


def _gaussian(mean, std):
    """A one-component predictive mixture (weights, means, variances)."""
    return torch.ones(1, dtype=mean.dtype), mean[None, :, None], std[None, :, None] ** 2


def test_calibration_of_the_true_predictive_is_the_diagonal():
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(200_000, generator=gen, dtype=torch.float64)
    std = 0.1 + torch.rand(200_000, generator=gen, dtype=torch.float64)
    y = mean + std * torch.randn(200_000, generator=gen, dtype=torch.float64)
    curve = calibration(_gaussian(mean, std), y)
    # binomial standard error at n = 200,000 is at most 0.0012
    assert curve == pytest.approx(list(LEVELS), abs=0.005)
    # a predictive twice too narrow covers what the true one covers at the scaled level
    narrow = calibration(_gaussian(mean, std / 2), y)
    normal = torch.distributions.Normal(0.0, 1.0)
    expected = [
        float(2 * normal.cdf(normal.icdf(torch.tensor(0.5 + p / 2)) / 2) - 1) for p in LEVELS
    ]
    assert narrow == pytest.approx(expected, abs=0.005)


def test_calibration_of_a_two_component_mixture_is_the_diagonal():
    """Targets drawn from an equal mixture of N(-2, 0.5^2) and N(2, 1): the mixture's own
    intervals are calibrated; the moment-matched Gaussian's are not (its 50 % interval covers
    the gap between the modes)."""
    gen = torch.Generator().manual_seed(1)
    n = 100_000
    pick = torch.rand(n, generator=gen, dtype=torch.float64) < 0.5
    means = torch.tensor([-2.0, 2.0], dtype=torch.float64)
    stds = torch.tensor([0.5, 1.0], dtype=torch.float64)
    y = torch.where(pick, means[0], means[1]) + torch.where(pick, stds[0], stds[1]) * torch.randn(
        n, generator=gen, dtype=torch.float64
    )
    mixture = (
        torch.full((2,), 0.5, dtype=torch.float64),
        means.view(2, 1, 1).expand(2, n, 1),
        stds.square().view(2, 1, 1).expand(2, n, 1),
    )
    assert calibration(mixture, y) == pytest.approx(list(LEVELS), abs=0.01)
    matched_std = (0.5 * (stds.square() + means.square()).sum()).sqrt()
    gaussian = calibration(_gaussian(torch.zeros(n, dtype=torch.float64), matched_std.expand(n)), y)
    assert gaussian[LEVELS.index(0.5)] < 0.4


def test_tiny_demo_run_writes_metrics_schedule_and_figures(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--steps", "12", "--epochs", "2", "--gpn-lr", "0.02"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Bayesian GPN: test RMSE" in printed and "tanh network: test RMSE" in printed
    record = json.loads((out / "demo.json").read_text())
    gpn = record["results"]["gpn"]
    assert gpn["head"] == "heteroscedastic" and gpn["val_log_likelihood"] < 0
    assert gpn["weights"] == "point"
    assert gpn["elbo"] == VGPN.elbo
    assert gpn["steps"] == 12 and 1 <= gpn["best_step"] <= 12
    assert gpn["schedule"]["lr"] == 0.02 and gpn["schedule"]["num_steps"] == 12
    assert gpn["schedule"]["eval_every"] == VGPN.eval_every
    assert record["results"]["tanh"]["epochs"] == 2
    for name in ("gpn", "tanh"):
        result = record["results"][name]
        assert result["rmse"] > 0 and len(result["calibration"]) == len(LEVELS)
        assert result["coverage90"] == result["calibration"][LEVELS.index(0.9)]
    assert (out / "predictive.png").exists() and (out / "activations.png").exists()
    assert record["command"] == "pyro-gpn " + " ".join(argv)


def test_demo_weights_default_is_point_and_bad_values_are_refused(capsys):
    """The demo's GPN has point weights unless ``--weights variational`` asks for the library's
    default ``q(W)``; an unknown value is refused by the parser, naming the option."""
    assert build_parser().parse_args(["demo"]).weights == "point"
    assert build_parser().parse_args(["demo", "--weights", "variational"]).weights == "variational"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--weights", "gaussian"])
    assert "--weights" in capsys.readouterr().err


def test_demo_rejects_an_unknown_objective(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--elbo", "trace"])
    assert "--elbo" in capsys.readouterr().err


def test_demo_rejects_a_bad_step_budget(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--steps", "0"])
    assert "--steps" in capsys.readouterr().err
