"""A network computes with its own parameters, whatever Pyro's global param store holds
(:mod:`pyro_gpn.pyro_module`). Each test builds two networks with the same layer names in one
process: before the fix, a network took the other's ``PyroParam`` tensors (lengthscales, noise,
``q(U)`` and ``q(W)``) from the store, and every test here failed but the parametric route's
(its network reaches the store only through ``pyro.module``; kept as a guard)."""

from __future__ import annotations

import copy
import io

import pyro
import pytest
import torch
from pyro.infer import SVI
from pyro.optim import Adam

from pyro_gpn import GPNLayer, GPNNet
from pyro_gpn.inference import ClosedFormELBO, fit_svi, fit_vgpn
from pyro_gpn.models import ParametricGPN, VariationalGPN
from pyro_gpn.pyro_module import GPNModule, release_foreign_params, store_names


def _data(seed: int = 0, rows: int = 60):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 3, generator=gen, dtype=torch.float64)
    y = x[:, :1].sin() + 0.1 * torch.randn(rows, 1, generator=gen, dtype=torch.float64)
    return x, y


def _vgpn(seed: int) -> VariationalGPN:
    torch.manual_seed(seed)
    return VariationalGPN([3, 5, 1]).double()


def _snapshot(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


@pytest.fixture(autouse=True)
def _empty_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def test_fitting_a_second_network_leaves_the_first_ones_predictions():
    x, y = _data()
    first = _vgpn(0)
    fit_vgpn(first, x, y, num_steps=30, seed=0)
    before = first.predict(x)
    own = {name: tensor for name, tensor in store_names(first).items()}
    second = _vgpn(1)
    fit_vgpn(second, x, y, num_steps=30, seed=1)
    after = first.predict(x)
    assert torch.equal(after.mean, before.mean) and torch.equal(after.std, before.std)
    # the first network still holds its own tensors, none of the second's
    assert all(store_names(first)[name] is tensor for name, tensor in own.items())
    assert not {id(p) for p in first.parameters()} & {id(p) for p in second.parameters()}
    # and the second one's predictions are its own, not the first's
    assert not torch.allclose(second.predict(x).mean, before.mean)


def test_a_network_fitted_without_clearing_the_store_trains_its_own_parameters():
    x, y = _data()
    first = _vgpn(0)
    fit_vgpn(first, x, y, num_steps=30, seed=0)
    first_state = _snapshot(first)
    second = _vgpn(1)
    start = _snapshot(second)
    fit_vgpn(second, x, y, num_steps=30, seed=1, clear_param_store=False)
    # every parameter of the second network moved, none of the first's did
    moved = [not torch.equal(a, b) for a, b in zip(start, second.parameters(), strict=True)]
    assert all(moved)
    assert all(torch.equal(a, b) for a, b in zip(first_state, first.parameters(), strict=True))
    # the store now holds the second network's tensors under the shared names
    held = dict(pyro.get_param_store().named_parameters())
    assert all(held[name] is tensor for name, tensor in store_names(second).items())


def test_svi_still_finds_and_trains_every_parameter_through_the_store():
    x, y = _data()
    first = _vgpn(0)
    fit_vgpn(first, x, y, num_steps=10, seed=0)  # its tensors are in the store
    first_state = _snapshot(first)
    second = _vgpn(1)
    start = _snapshot(second)
    svi = SVI(second.model, second.guide, Adam({"lr": 0.01}), loss=ClosedFormELBO(second))
    for _ in range(5):
        svi.step(x, y)
    assert all(not torch.equal(a, b) for a, b in zip(start, second.parameters(), strict=True)), (
        "SVI left a parameter of the network untrained"
    )
    assert all(torch.equal(a, b) for a, b in zip(first_state, first.parameters(), strict=True))


def test_parametric_networks_fitted_by_svi_keep_their_own_predictions():
    x, y = _data()
    torch.manual_seed(0)
    first = ParametricGPN([3, 4, 1], head="gaussian").double()
    fit_svi(first.model, first.guide, x, y, num_steps=20, seed=0, progress=False)
    torch.manual_seed(5)
    before = first.predict(x, num_samples=20)
    torch.manual_seed(1)
    second = ParametricGPN([3, 4, 1], head="gaussian").double()
    fit_svi(second.model, second.guide, x, y, num_steps=20, seed=1, progress=False)
    torch.manual_seed(5)
    after = first.predict(x, num_samples=20)
    assert torch.equal(after.mean, before.mean)


def _perturb(module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.rand(p.shape, generator=gen, dtype=p.dtype))


@pytest.mark.parametrize("build", [lambda: GPNLayer(3, 4), lambda: GPNNet([3, 4, 2])])
def test_standalone_layers_and_networks_use_their_own_tensors(build):
    """A module called after another one with the same names registered its tensors (its
    ``PyroParam`` lengthscales and noise would be the other's)."""
    x, _ = _data()
    torch.manual_seed(0)
    a, b = build().double(), build().double()
    _perturb(a, 1), _perturb(b, 2)
    own_b = b(x).mean.clone()  # alone in the store
    pyro.clear_param_store()
    own_a = a(x).mean.clone()
    assert torch.equal(b(x).mean, own_b)
    assert torch.equal(a(x).mean, own_a)


def test_release_drops_only_foreign_entries_and_nothing_in_local_mode():
    x, y = _data()
    first, second = _vgpn(0), _vgpn(1)
    first.predict(x)  # registers the first network's tensors
    assert release_foreign_params(first) == []
    dropped = release_foreign_params(second)
    assert dropped and set(dropped) <= set(store_names(second))
    assert not set(dropped) & set(pyro.get_param_store().keys())
    with pyro.settings.context(module_local_params=True):
        first.predict(x)
        assert release_foreign_params(second) == []


def test_copies_and_saved_networks_own_their_parameters():
    x, y = _data()
    net = _vgpn(0)
    fit_vgpn(net, x, y, num_steps=10, seed=0)
    twin = copy.deepcopy(net)
    assert twin._pyro_context.owner is twin and net._pyro_context.owner is net
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(0.01)
    expected = net.predict(x).mean.clone()
    shifted = twin.predict(x).mean.clone()
    assert torch.equal(net.predict(x).mean, expected)
    assert not torch.allclose(shifted, expected)
    buffer = io.BytesIO()
    torch.save(net, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded._pyro_context.owner is loaded
    assert torch.equal(loaded.predict(x).mean, expected)


def test_every_pyro_module_of_the_package_is_a_gpn_module():
    """The networks and their layers, responses and sequential containers."""
    import pyro_gpn.layers as layers
    import pyro_gpn.models as models
    from pyro_gpn import GPNSequential

    classes = [GPNNet, GPNSequential, models.NonParametricGPN, models.SampledTargetsGPN]
    classes += [models.ParametricGPN, models.VariationalGPN, layers.GPNLayerBase]
    classes += [layers.VariationalGPNLayer, layers.base.Response]
    assert all(issubclass(c, GPNModule) for c in classes)
