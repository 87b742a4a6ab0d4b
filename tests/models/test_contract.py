"""The model--inference contract: num_data scales the data plate, forward and predict everywhere."""

import pyro
import pytest
import torch
from pyro import poutine

from pyro_gpn import GPNNet, Moments, Prediction
from pyro_gpn.inference import ClosedFormELBO, fit_svi
from pyro_gpn.inference.closed_form import closed_form_elbo
from pyro_gpn.models import FixedActivationNet, ParametricGPN, VariationalGPN

DT = torch.float64


def _data(head, n=6):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 2, dtype=DT, generator=g)
    y = torch.randn(n, 1, dtype=DT, generator=g) if head == "gaussian" else torch.arange(n) % 3
    return x, y


def _sizes(head):
    return [2, 3, 1] if head == "gaussian" else [2, 3, 3]


def _models(head):
    pyro.clear_param_store()
    torch.manual_seed(0)
    sizes = _sizes(head)
    return {
        "clt": GPNNet(sizes, head=head, dtype=DT),
        "parametric": ParametricGPN(sizes, head=head, dtype=DT),
        "variational": VariationalGPN(sizes, head=head, dtype=DT),
        "fixed": FixedActivationNet(sizes, head=head).double(),
    }


@pytest.mark.parametrize("head", ["gaussian", "softmax"])
def test_forward_is_the_predictive_moments_and_predict_a_prediction_on_every_route(head):
    x, _ = _data(head)
    for name, model in _models(head).items():
        moments = model(x)
        assert isinstance(moments, Moments), name
        width = 1 if head == "gaussian" else 3
        assert moments.mean.shape == (6, width), name
        prediction = model.predict(x)
        assert isinstance(prediction, Prediction), name
        assert prediction.mean.shape == prediction.std.shape == (6, width), name
        assert prediction.task == ("regression" if head == "gaussian" else "classification")
        if head == "softmax":
            torch.testing.assert_close(prediction.probs.sum(-1), torch.ones(6, dtype=DT))


@pytest.mark.parametrize("head", ["gaussian", "softmax"])
@pytest.mark.parametrize("route", ["parametric", "variational"])
def test_num_data_scales_the_data_plate(route, head):
    x, y = _data(head)
    model = _models(head)[route]
    batch = poutine.trace(model.model).get_trace(x[:2], y[:2], num_data=6)
    full = poutine.trace(model.model).get_trace(x[:2], y[:2])
    assert batch.nodes["y" if route == "parametric" else "obs"]["scale"] == 3.0
    assert full.nodes["y" if route == "parametric" else "obs"]["scale"] == 1.0
    model.num_data = 6  # the attribute is the default, the call's argument wins
    by_attribute = poutine.trace(model.model).get_trace(x[:2], y[:2])
    assert by_attribute.nodes["y" if route == "parametric" else "obs"]["scale"] == 3.0
    with pytest.raises(ValueError, match="more than num_data"):
        model.model(x, y, num_data=3)


def test_penalty_factor_is_scaled_by_num_data_not_by_the_plate():
    x, y = _data("gaussian")
    gpn = _models("gaussian")["parametric"]
    trace = poutine.trace(gpn.model).get_trace(x[:2], y[:2], num_data=6)
    site = trace.nodes["target_variance_penalty"]
    torch.testing.assert_close(site["fn"].log_factor, -6 * gpn.target_variance_penalty())


def test_closed_form_elbo_takes_num_data_from_the_call():
    x, y = _data("gaussian")
    vgpn = _models("gaussian")["variational"]
    kl = vgpn.kl_divergence()
    batch = closed_form_elbo(vgpn, x[:2], y[:2], num_data=6)
    torch.testing.assert_close(batch + kl, 3 * (closed_form_elbo(vgpn, x[:2], y[:2]) + kl))
    loss = ClosedFormELBO(vgpn).differentiable_loss(None, None, x[:2], y[:2], num_data=6)
    torch.testing.assert_close(loss, -batch)


def test_fit_svi_passes_num_data_to_the_model():
    calls = []

    def model(x, y, num_data=None):
        calls.append((x.shape[0], num_data))
        pyro.param("p", torch.zeros(()))
        with pyro.plate("data", num_data, subsample=torch.arange(x.shape[0])):
            pyro.sample("y", pyro.distributions.Normal(pyro.param("p"), 1.0), obs=y)

    def guide(x, y, num_data=None):
        pass

    x, y = torch.rand(10, 1), torch.randn(10)
    fit_svi(model, guide, x, y, num_steps=2, batch_size=4, progress=False)
    assert calls == [(4, 10), (4, 10)]


def test_deprecated_names_warn():
    vgpn = _models("gaussian")["variational"]
    x, _ = _data("gaussian")
    with pytest.warns(DeprecationWarning, match="predictive_moments"):
        vgpn.predictive_moments(x)
    with pytest.warns(DeprecationWarning, match="ClosedFormELBO"):
        ClosedFormELBO()
    with pytest.warns(DeprecationWarning, match="ELBO_MODES"):
        from pyro_gpn.models.variational import MODES  # noqa: F401
    with pytest.warns(DeprecationWarning, match="VARIATIONAL_TARGET_INITS"):
        from pyro_gpn.layers.variational import TARGETS_INITS  # noqa: F401
    with pytest.warns(DeprecationWarning, match="unscented_kappa"):
        FixedActivationNet([2, 3, 3], kappa=0.5)
    net = GPNNet([2, 3, 3])
    with pytest.warns(DeprecationWarning, match="readout"):
        readout = net.readout
    torch.testing.assert_close(readout.weight, net.head.weight.mT)


def test_parametric_takes_its_network_in_the_constructor():
    net = GPNNet([2, 3, 1], head="gaussian")
    gpn = ParametricGPN(net, likelihood="marginal")
    assert gpn.network is net and gpn.head is net.head
    assert ParametricGPN.from_network(net).network is net
    with pytest.raises(TypeError, match="apply to a network from sizes"):
        ParametricGPN(net, num_inducing=3)


def test_variational_loss_is_the_negative_elbo_per_sample_and_trains_with_the_trainer():
    from pyro_gpn.inference import TrainConfig, Trainer

    x, y = _data("gaussian")
    vgpn = _models("gaussian")["variational"]
    vgpn.num_data = 6
    torch.testing.assert_close(vgpn.loss(x, y), -closed_form_elbo(vgpn, x, y) / 6)
    assert float(vgpn.penalty()) == 0.0
    result = Trainer(vgpn, TrainConfig(batch_size=3, max_epochs=3, progress=False)).fit(
        (x, y), (x, y)
    )
    assert result.epochs == 3 and all(
        torch.isfinite(torch.tensor(r["train_loss"])) for r in result.history
    )


def test_num_data_refuses_bools_and_takes_numpy_integers():
    """num_data=True was taken as 1."""
    import numpy as np

    from pyro_gpn.models._contract import check_num_data

    assert check_num_data(np.int64(5)) == 5 and check_num_data(None) is None
    for bad in (True, False, 2.0, 0):
        with pytest.raises(ValueError, match="num_data must be a positive integer or None"):
            check_num_data(bad)
    x, y = torch.randn(4, 2), torch.randn(4, 1)
    with pytest.raises(ValueError, match="num_data must be a positive integer"):
        closed_form_elbo(VariationalGPN([2, 3, 1], head="gaussian"), x, y, num_data=True)
