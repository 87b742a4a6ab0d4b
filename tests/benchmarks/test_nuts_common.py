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
    for name in ("metric", "max_tree_depth", "target_accept_prob", "init_steps", "workers"):
        assert kwargs[name] == params[name].default, name
    assert kwargs["num_chains"] == 4 and kwargs["num_samples"] == kwargs["warmup_steps"] == 500


def test_options_parse_and_serialise():
    args = _parse(["--chains", "2", "--workers", "2", "--checkpoint-dir", "/tmp/x"])
    kwargs = sampler_kwargs(args)
    assert kwargs["num_chains"] == 2 and kwargs["workers"] == 2
    assert settings_of(args)["checkpoint_dir"] == "/tmp/x"
