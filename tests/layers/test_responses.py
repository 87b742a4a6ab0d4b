"""A layer is projection + grid + response: the two responses, a new one, the delegation."""

import inspect

import pytest
import torch

from pyro_gpn import GPNLayer, Moments, VariationalGPNLayer
from pyro_gpn.kernels import squared_exponential
from pyro_gpn.layers import GPNLayerBase, Response, VariationalTargets, VirtualObservations
from tests.mc import assert_mc_mean, assert_mc_variance

DT = torch.float64


class ExactTargets(Response):
    """Noise-free virtual observations ``f(V) = U`` with ``U`` fixed: ``beta = K^-1 U``,
    ``C = K^-1``. Written against the interface only, as a new response would be."""

    def __init__(self, points, lengthscales, scale=1.0):
        super().__init__()
        self.register_buffer("targets", scale * torch.sin(points))

    def weights(self, points, lengthscales):
        gram = squared_exponential(points, points, lengthscales)
        kinv = torch.linalg.inv(gram + 1e-8 * torch.eye(points.shape[-1], dtype=points.dtype))
        return (kinv @ self.targets.to(points.dtype).unsqueeze(-1)).squeeze(-1), kinv


def test_a_new_response_plugs_into_the_layer_without_an_argument_list():
    torch.manual_seed(0)
    layer = GPNLayerBase(2, 3, num_inducing=9, response=ExactTargets, scale=2.0, dtype=DT)
    # at the inducing points themselves the response interpolates the targets
    points = layer.inducing_points[:, 4]  # one activation per unit
    mean, var = layer.conditional(points.expand(1, 3), noise=False)
    torch.testing.assert_close(mean[0], 2 * torch.sin(points), atol=1e-5, rtol=0)
    assert float(var.detach().max()) < 1e-5
    assert float(layer.kl_divergence().detach()) == 0.0  # point estimates: no KL
    # propagation goes through the same core, and agrees with Monte Carlo
    x = Moments(torch.rand(4, 2, dtype=DT), var=torch.full((4, 2), 0.05, dtype=DT))
    out = layer.propagate(x, "meanvar")
    g = torch.Generator().manual_seed(1)
    xs = x.mean + x.var.sqrt() * torch.randn(40000, 4, 2, dtype=DT, generator=g)
    m, v = layer.conditional((xs @ layer.weight).reshape(-1, 3))
    ys = m + v.sqrt() * torch.randn(m.shape, dtype=DT, generator=g)
    assert_mc_mean(ys.reshape(40000, 4, 3), out.mean)
    assert_mc_variance(ys.reshape(40000, 4, 3), out.var)


def test_the_two_layers_are_the_base_with_their_default_response():
    parametric = GPNLayer(2, 3, targets_init="identity", dtype=DT)
    variational = VariationalGPNLayer(2, 3, q_cov="diag", whiten=True, dtype=DT)
    assert isinstance(parametric.response, VirtualObservations)
    assert isinstance(variational.response, VariationalTargets)
    assert type(parametric).__init__ is GPNLayerBase.__init__  # no argument list of their own
    # the variational layer adds only the treatment of W (q(W), issue 15)
    base = set(inspect.signature(GPNLayerBase.__init__).parameters)
    own = set(inspect.signature(type(variational).__init__).parameters) - base - {"kwargs"}
    assert own == {"weights", "weight_prior_scale", "weight_scale_init"}
    # the same layer class with the other response
    swapped = GPNLayer(2, 3, response=VariationalTargets, whiten=True, dtype=DT)
    assert isinstance(swapped.response, VariationalTargets)
    assert float(swapped.kl_divergence().detach()) > 0


def test_response_attributes_read_and_assign_through_the_layer():
    layer = GPNLayer(2, 3, dtype=DT)
    assert layer.targets is layer.response.targets
    layer.target_variances = torch.full((3, 14), 0.5, dtype=DT)  # a PyroParam of the response
    torch.testing.assert_close(layer.response.target_variances, torch.full((3, 14), 0.5, dtype=DT))
    assert "target_variances" not in layer.__dict__
    torch.testing.assert_close(layer.response.penalised_variances(), layer.target_variances)
    names = dict(layer.named_parameters())
    assert "response.targets" in names and "weight" in names
    with pytest.raises(AttributeError):
        _ = layer.no_such_attribute


def test_response_options_are_checked():
    with pytest.raises(ValueError, match="targets_init"):
        GPNLayer(2, 3, targets_init="zero")  # a variational option, not a parametric one
    with pytest.raises(TypeError, match="unexpected keyword"):
        GPNLayer(2, 3, q_cov="full")
    response = VirtualObservations(torch.zeros(3, 14), torch.ones(3))
    with pytest.raises(TypeError, match="need a response class"):
        GPNLayerBase(2, 3, response=response, targets_init="identity")
    with pytest.raises(TypeError, match="response must be"):
        GPNLayerBase(2, 3, response="virtual")
    with pytest.raises(TypeError, match="response must be"):
        GPNLayerBase(2, 3)  # the base has no default response


def test_a_layer_without_output_noise():
    layer = GPNLayer(2, 3, output_noise=False, dtype=DT)
    assert layer.noise_std is None
    x = torch.rand(5, 2, dtype=DT)
    torch.testing.assert_close(
        layer.propagate(x, "meanvar").var, layer.propagate(x, "meanvar", noise=False).var
    )
