"""The validation switch: value checks on by default, off inside the training loops."""

import math

import pyro
import pytest
import torch

import pyro_gpn
from pyro_gpn import GPNNet, settings
from pyro_gpn.inference import TrainConfig, Trainer, fit_svi
from pyro_gpn.models import ParametricGPN
from tests.syncs import count_syncs


def test_value_checks_follow_the_switch_and_form_checks_do_not():
    net = GPNNet([2, 3, 1], head="gaussian")
    bad = torch.tensor([[math.nan, 0.0]])
    assert settings.is_validation_enabled()
    with pytest.raises(ValueError, match="x contains NaN"):
        net(bad)
    with settings.validation(False):
        assert not settings.is_validation_enabled()
        assert not pyro.infer.util.is_validation_enabled()  # Pyro's checks too
        assert torch.isnan(net(bad).mean).all()  # no check: NaN travels
        with pytest.raises(ValueError, match="x must have shape|x must have 2"):
            net(torch.zeros(3))  # form checks stay
    assert settings.is_validation_enabled()


def test_switch_restores_after_an_exception_and_global_setter():
    with pytest.raises(RuntimeError), settings.validation(False):
        raise RuntimeError
    assert settings.is_validation_enabled()
    settings.enable_validation(False)
    try:
        assert not settings.is_validation_enabled()
    finally:
        settings.enable_validation(True)
    assert pyro_gpn.settings is settings


def test_training_loops_run_with_checks_off():
    seen = []
    net = GPNNet([2, 3, 1], head="gaussian")
    original = net.loss

    def loss(x, y):
        seen.append(settings.is_validation_enabled())
        return original(x, y)

    net.loss = loss
    x, y = torch.rand(8, 2), torch.randn(8, 1)
    Trainer(net, TrainConfig(batch_size=4, max_epochs=1, progress=False)).fit((x, y), (x, y))
    assert seen and not any(seen)
    assert settings.is_validation_enabled()
    with pytest.raises(ValueError, match="train x contains NaN"):
        Trainer(net, TrainConfig(max_epochs=1, progress=False)).fit(
            (torch.full((4, 2), math.nan), torch.zeros(4, 1)), (x, y)
        )


def test_training_step_syncs_once():
    """One read-back per step: the Trainer's loss, and fit_svi's loss with its finite flag."""
    torch.manual_seed(0)
    net = GPNNet([2, 3, 1], head="gaussian")
    x, y = torch.rand(16, 2), torch.randn(16, 1)
    trainer = Trainer(net, TrainConfig(batch_size=4, progress=False))
    optimizer = torch.optim.Adam(net.parameters())
    with count_syncs() as counter:
        trainer._train_epoch(optimizer, torch.Generator().manual_seed(0), x, y, 1, 0)
    assert counter["n"] == 4
    pyro.clear_param_store()
    gpn = ParametricGPN([2, 3, 1], head="gaussian", penalty=False)
    fit_svi(gpn.model, gpn.guide, x, y, num_steps=1, progress=False)
    with count_syncs(within="pyro_gpn") as counter:  # Pyro's Trace_ELBO adds its own
        fit_svi(
            gpn.model,
            gpn.guide,
            x,
            y,
            num_steps=4,
            progress=False,
            batch_size=4,
            clear_param_store=False,
        )
    assert counter["n"] == 4 + 2  # one per step, and x and y checked once on entry
