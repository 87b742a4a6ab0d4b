"""The NUTS benchmark scripts' shared options map onto ``run_nuts`` (a renamed argument of
``run_nuts`` breaks every script at once, after minutes of sampling, unless caught here)."""

import argparse
import inspect

from benchmarks.nuts_common import add_sampler_args, sampler_kwargs, settings_of
from pyro_gpn.inference.mcmc import run_nuts


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_sampler_args(parser, chains=4, draws=500)
    return parser.parse_args(argv)


def test_options_are_run_nuts_arguments_with_its_defaults():
    kwargs = sampler_kwargs(_parse([]))
    params = inspect.signature(run_nuts).parameters
    assert set(kwargs) <= set(params)
    for name in (
        "metric",
        "metric_start",
        "shrink_dense",
        "init",
        "max_tree_depth",
        "target_accept_prob",
        "init_steps",
        "workers",
    ):
        assert kwargs[name] == params[name].default, name
    assert kwargs["num_chains"] == 4 and kwargs["num_samples"] == kwargs["warmup_steps"] == 500


def test_options_parse_and_serialise():
    args = _parse(["--chains", "2", "--workers", "2", "--checkpoint-dir", "/tmp/x"])
    kwargs = sampler_kwargs(args)
    assert kwargs["num_chains"] == 2 and kwargs["workers"] == 2
    assert settings_of(args)["checkpoint_dir"] == "/tmp/x"


def test_problem_options_build_each_run():
    import torch

    from benchmarks.nuts_common import add_problem_args, build_problem
    from pyro_gpn.models.nonparametric import NonParametricGPN
    from pyro_gpn.models.sampled_targets import SampledTargetsGPN

    parser = argparse.ArgumentParser()
    add_problem_args(parser)
    parser.add_argument("--seed", type=int, default=0)
    model, x, y, x_test, y_test, y_std, task = build_problem(
        parser.parse_args(["--run", "moons", "--model", "sampled-u", "--n-train", "30"])
    )
    assert isinstance(model, SampledTargetsGPN) and model.likelihood == "bernoulli"
    assert x.shape == (30, 2) and x_test.shape == (200, 2) and task == "classification"
    assert set(y.unique().tolist()) <= {0.0, 1.0} and y_std == 1.0
    torch.testing.assert_close(x.mean(0), torch.zeros(2, dtype=x.dtype), atol=1e-12, rtol=0)
    model, x, *_ = build_problem(
        parser.parse_args(["--run", "synthetic", "--sizes", "1", "4", "1"])
    )
    assert isinstance(model, NonParametricGPN) and model.sizes == [1, 4, 1] and x.shape[1] == 1
    for flag, want in (([], "whitened"), (["--activations", "centred"], "centred")):
        model, *_ = build_problem(parser.parse_args(["--run", "synthetic", *flag]))
        assert model.activations == want


def test_vgpn_comparison_summary_against_scipy():
    import numpy as np
    import scipy.stats
    import torch

    from benchmarks.nuts_vs_vgpn import _summary

    g = torch.Generator().manual_seed(0)
    mean = torch.randn(50, generator=g, dtype=torch.float64)
    std = torch.rand(50, generator=g, dtype=torch.float64) + 0.5
    y = mean + std * torch.randn(50, generator=g, dtype=torch.float64)
    got = _summary(mean, std, y, y_std=2.0)
    want = scipy.stats.norm.logpdf(y.numpy(), mean.numpy(), std.numpy()).mean() - np.log(2.0)
    assert abs(got["test_ll_gauss"] - want) < 1e-12
    low, high = scipy.stats.norm.interval(0.9, mean.numpy(), std.numpy())
    assert got["coverage90"] == ((y.numpy() >= low) & (y.numpy() <= high)).mean()
    assert abs(got["test_rmse"] - 2.0 * float((mean - y).square().mean().sqrt())) < 1e-12
