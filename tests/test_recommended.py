"""The recommendations are the library's defaults, read from one place (issue 15)."""

from dataclasses import replace

import pytest
import torch

import pyro_gpn.layers.variational as variational_layers
import pyro_gpn.models.variational as variational_models
import pyro_gpn.network as network
from pyro_gpn import GPNNet
from pyro_gpn.experiments.cli import build_parser
from pyro_gpn.experiments.runs import ModelSettings, build_model
from pyro_gpn.layers import GPNLayer, VariationalGPNLayer
from pyro_gpn.models import VariationalGPN
from pyro_gpn.recommended import GPN, VGPN

DT = torch.float64


def _identity_targets(layer) -> bool:
    """Whether a parametric layer's targets equal its inducing points (the identity start)."""
    return torch.allclose(layer.response.targets.detach(), layer.inducing_points.detach())


def test_recommendations_are_the_documented_values():
    assert (VGPN.whiten, VGPN.targets_init, VGPN.weights) == (True, "identity", "variational")
    assert VGPN.elbo == "predictive"
    assert GPN.targets_init == "identity"
    assert VGPN.batch_for(VGPN.large_data + 1) == VGPN.large_batch_size
    assert VGPN.batch_for(VGPN.large_data) is None


def test_gpnnet_layers_start_at_the_recommended_targets():
    torch.manual_seed(0)
    net = GPNNet([3, 4, 1], head="gaussian", dtype=DT)
    assert all(layer.response.targets_init == GPN.targets_init for layer in net.layers)
    assert all(_identity_targets(layer) for layer in net.layers)
    random = GPNNet([3, 4, 1], head="gaussian", targets_init="random", dtype=DT)
    assert not any(_identity_targets(layer) for layer in random.layers)
    # a plain GPNLayer keeps its own default: only the network reads the recommendation
    assert GPNLayer(3, 4).response.targets_init == "random"


def test_gpnnet_reads_the_recommendation_not_a_copy(monkeypatch):
    monkeypatch.setattr(network, "GPN", replace(GPN, targets_init="random"))
    net = GPNNet([3, 4, 1], head="gaussian", dtype=DT)
    assert all(layer.response.targets_init == "random" for layer in net.layers)


def test_variational_layer_defaults_are_the_recommendation():
    layer = VariationalGPNLayer(3, 4, dtype=DT)
    assert layer.response.whiten is VGPN.whiten
    assert layer.response.targets_init == VGPN.targets_init
    assert layer.weight_treatment == VGPN.weights
    assert layer.weight_prior_scale == VGPN.weight_prior_scale
    model = VariationalGPN([3, 4, 1], head="gaussian", dtype=DT)
    for layer in model.layers:
        assert layer.response.whiten is VGPN.whiten
        assert layer.weight_treatment == VGPN.weights


def test_variational_defaults_follow_a_changed_recommendation(monkeypatch):
    changed = replace(
        VGPN, whiten=False, targets_init="zero", weights="point", weight_prior_scale=2.0
    )
    monkeypatch.setattr(variational_layers, "VGPN", changed)
    monkeypatch.setattr(variational_models, "VGPN", changed)
    layer = VariationalGPNLayer(3, 4, dtype=DT)
    assert layer.response.whiten is False and layer.response.targets_init == "zero"
    assert layer.weight_treatment == "point" and layer.weight_prior_scale == 2.0
    assert float(layer.response.targets_loc.detach().abs().max()) == 0.0
    model = VariationalGPN([3, 4, 1], head="gaussian", dtype=DT)
    assert all(not layer.response.whiten for layer in model.layers)
    # explicit arguments still win over the recommendation
    explicit = VariationalGPNLayer(3, 4, whiten=True, weights="variational", dtype=DT)
    assert explicit.response.whiten is True and explicit.weight_treatment == "variational"


def test_train_command_defaults_to_the_recommended_start():
    assert ModelSettings().init == GPN.targets_init
    args = build_parser().parse_args(["train", "yacht"])
    assert args.init == GPN.targets_init
    torch.manual_seed(0)
    net = build_model("gpn", [3, 4, 1], "gaussian")
    assert all(_identity_targets(layer) for layer in net.layers)
    explicit = build_model("gpn", [3, 4, 1], "gaussian", init="random")
    assert all(layer.response.targets_init == "random" for layer in explicit.layers)


def test_recommendation_is_immutable():
    with pytest.raises(AttributeError):
        GPN.targets_init = "random"  # type: ignore[misc]
