"""GPNSequential's training objectives: the closed-form expected loss (the negative ELBO with
variational blocks) and the predictive one, against their definitions written out here,
Jensen's inequality between them, the softmax head's log-space predictive where probabilities
underflow, gradcheck, and the argument check."""

import pytest
import torch
from torch.autograd import gradcheck
from torch.func import functional_call

from pyro_gpn import GPNSequential, Moments
from pyro_gpn.heads import SoftmaxHead
from pyro_gpn.layers import (
    MomentAvgPool2d,
    MomentFlatten,
    MomentLinear,
    VariationalGPNConv2d,
    VariationalGPNRecurrent,
)

DT = torch.float64

pytestmark = pytest.mark.usefixtures("fresh_param_store")


def _cnn(objective=None, seed=0):
    torch.manual_seed(seed)
    net = GPNSequential(
        [
            VariationalGPNConv2d(1, 3, 3, (6, 6), padding=1, dtype=DT),
            MomentAvgPool2d(2),
            MomentFlatten(),
        ],
        input_shape=(1, 6, 6),
        num_outputs=4,
        num_data=200,
        objective=objective,
    )
    with torch.no_grad():  # a readout that makes the logits' spread matter
        net.head.weight.mul_(4.0)
    x = torch.rand(7, 36, dtype=DT)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    return net, x, y


def _rnn(objective=None, seed=0):
    torch.manual_seed(seed)
    net = GPNSequential(
        [VariationalGPNRecurrent(1, 3, dtype=DT), MomentLinear(3, 1, dtype=DT)],
        input_shape=(5, 1),
        head="gaussian",
        num_data=50,
        objective=objective,
    )
    x = torch.randn(6, 5, dtype=DT)
    y = torch.randn(6, 1, dtype=DT)
    return net, x, y


def test_default_objective_follows_the_recommendation():
    """Variational blocks: the Bayesian GPN's recommended objective (predictive); point
    estimates: the paper's expected loss."""
    from pyro_gpn.layers import GPNConv2d, GPNRecurrent

    assert _cnn()[0].objective == "predictive" == _rnn()[0].objective
    plain = GPNSequential([GPNConv2d(1, 2, 3, (4, 4)), MomentFlatten()], (1, 4, 4), num_outputs=3)
    rnn = GPNSequential([GPNRecurrent(1, 2), MomentLinear(2, 1)], (3, 1), head="gaussian")
    assert plain.objective == "closed_form" == rnn.objective


def test_default_objective_reads_the_recommendation(monkeypatch):
    import dataclasses

    import pyro_gpn.sequential as sequential

    monkeypatch.setattr(
        sequential, "VGPN", dataclasses.replace(sequential.VGPN, elbo="closed_form")
    )
    assert _cnn()[0].objective == "closed_form"
    monkeypatch.setattr(sequential, "VGPN", dataclasses.replace(sequential.VGPN, elbo="trace"))
    assert _cnn()[0].objective == "closed_form"  # no Monte Carlo objective here


def test_closed_form_objective_is_the_negative_elbo_per_sample():
    net, x, y = _cnn("closed_form")
    expected = net.expected_nll(x, y) + net.kl_divergence() / 200
    torch.testing.assert_close(net.loss(x, y), expected, rtol=1e-14, atol=0)


def test_predictive_objective_softmax_against_its_definition():
    net, x, y = _cnn("predictive")
    features = net.hidden(x)
    logits, weights = net.head.point_logits(features)  # [S, P, C], [P]
    probs = (weights.view(1, -1, 1) * logits.softmax(-1)).sum(1)
    log_pred = probs[torch.arange(7), y].log()
    torch.testing.assert_close(net.log_predictive(x, y), log_pred, rtol=1e-12, atol=0)
    expected = -log_pred.mean() + net.kl_divergence() / 200
    torch.testing.assert_close(net.loss(x, y), expected, rtol=1e-12, atol=0)


def test_predictive_objective_gaussian_against_its_definition():
    net, x, y = _rnn("predictive")
    features = net.hidden(x)
    var = features.variance + net.head.noise_std.square()
    log_pred = torch.distributions.Normal(features.mean, var.sqrt()).log_prob(y).sum(-1)
    torch.testing.assert_close(net.log_predictive(x, y), log_pred, rtol=1e-12, atol=0)
    torch.testing.assert_close(
        net.loss(x, y), -log_pred.mean() + net.kl_divergence() / 50, rtol=1e-12, atol=0
    )


@pytest.mark.parametrize("build", [_cnn, _rnn])
def test_predictive_data_term_is_at_least_the_expected_one(build):
    """Jensen: ``log E[p] >= E[log p]`` per sample (exact for the Gaussian head's closed form,
    and for the unscented points' non-negative weights), strictly where the features vary."""
    net, x, y = build()
    log_pred = net.log_predictive(x, y)
    expected = -net.expected_nll(x, y, reduction="none")
    assert torch.all(log_pred >= expected - 1e-12)
    assert float((log_pred - expected).detach().min()) > 1e-6
    closed = build("closed_form")[0].loss(x, y)
    predictive = build("predictive")[0].loss(x, y)
    assert float(predictive) < float(closed)


def test_softmax_log_predictive_finite_where_probabilities_underflow():
    """Labels the logits rule out by ~200 nats: the probability underflows float32 (and the
    old ``log(clamp(p))`` returned ``log(1e-45)`` or ``-inf``); the log-space form gives the
    float64 value in float32 too, with a gradient."""
    head64 = SoftmaxHead(3, 2, dtype=DT)
    with torch.no_grad():
        head64.weight.copy_(torch.tensor([[60.0, -60.0], [30.0, -30.0], [0.0, 0.0]], dtype=DT))
    mean = torch.tensor([[2.0, 1.0, 0.0], [1.5, 0.5, 0.3]], dtype=DT)
    var = torch.tensor([[1e-4, 4e-4, 1.0], [1e-4, 1e-4, 1e-4]], dtype=DT)
    y = torch.tensor([1, 1])
    ref = head64.log_predictive(Moments(mean, var=var), y)
    assert torch.all(ref < -100) and torch.all(torch.isfinite(ref))
    head32 = SoftmaxHead(3, 2, dtype=torch.float32)
    head32.load_state_dict(head64.state_dict())
    mean32 = mean.float().requires_grad_()
    got = head32.log_predictive(Moments(mean32, var=var.float()), y)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=0)
    got.sum().backward()
    assert torch.all(torch.isfinite(mean32.grad)) and float(mean32.grad.abs().sum()) > 0


def test_softmax_log_predictive_negative_kappa_sums_probabilities():
    """``kappa < 0`` (the paper's ``3 - N``) has a negative centre weight: no log-space form;
    the sum of the weighted probabilities, as defined."""
    head = SoftmaxHead(5, 3, unscented_kappa=-2.0, dtype=DT)
    torch.manual_seed(1)
    features = Moments(torch.randn(4, 5, dtype=DT), var=torch.rand(4, 5, dtype=DT))
    y = torch.tensor([0, 1, 2, 1])
    logits, weights = head.point_logits(features)
    assert float(weights[0]) < 0
    probs = (weights.view(1, -1, 1) * logits.softmax(-1)).sum(1)
    torch.testing.assert_close(
        head.log_predictive(features, y), probs[torch.arange(4), y].log(), rtol=1e-12, atol=0
    )


class _Loss(torch.nn.Module):
    def __init__(self, net, x, y):
        super().__init__()
        self.net, self.x, self.y = net, x, y

    def forward(self):
        return self.net.loss(self.x, self.y)


@pytest.mark.parametrize("build", [_cnn, _rnn])
def test_predictive_objective_gradcheck_float64(build):
    """Through the log-sum-exp of the sigma points (softmax) and the Gaussian head's density,
    with respect to the readout / head parameters."""
    net, x, y = build("predictive")
    loss = _Loss(net, x, y)
    names = [
        n
        for n, _ in loss.named_parameters()
        if n.startswith("net.head.") or n.startswith("net.blocks.1.")
    ]
    assert names
    params = {
        n: p.detach().clone().requires_grad_() for n, p in loss.named_parameters() if n in names
    }

    def f(*values):
        return functional_call(loss, dict(zip(names, values, strict=True)), ())

    assert gradcheck(f, tuple(params[n] for n in names))


@pytest.mark.parametrize("objective", ["elbo", "trace", 1, "Predictive"])
def test_bad_objective_names_the_argument(objective):
    with pytest.raises(ValueError, match="objective"):
        _cnn(objective)


def test_repr_names_the_objective():
    assert "objective='predictive'" in repr(_cnn("predictive")[0])
    assert "objective='closed_form'" in repr(_cnn("closed_form")[0])


@pytest.mark.parametrize("build", [_cnn, _rnn])
def test_training_loss_ignores_the_predictive_scale(build):
    """A calibrated head (temperature / sigma-scale fitted after training) must not change
    what training optimises; log_predictive itself does use the scale."""
    net, x, y = build("predictive")
    before = net.loss(x, y).detach()
    scored = net.log_predictive(x, y).detach()
    with torch.no_grad():
        net.head.predictive_scale.fill_(3.0)
    torch.testing.assert_close(net.loss(x, y).detach(), before, rtol=0, atol=0)
    assert not torch.allclose(net.log_predictive(x, y).detach(), scored)


def test_objective_is_checked_when_set():
    net = _cnn()[0]
    net.objective = "closed_form"
    with pytest.raises(ValueError, match="objective"):
        net.objective = "bogus"
    assert net.objective == "closed_form"


def test_fused_and_reference_gradients_agree_for_every_parameter():
    """The predictive loss of the variational CNN: the fused CPU kernels (layer and head)
    against the PyTorch reference path, every parameter's gradient, float64."""
    from pyro_gpn.moments.backend import backend

    grads = {}
    for name in ("cpu", "reference"):
        net, x, y = _cnn("predictive")
        with backend(name):
            loss = net.loss(x, y)
        params = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
        grads[name] = dict(
            zip([n for n, _ in params], torch.autograd.grad(loss, [p for _, p in params]))
        )
    assert len(grads["cpu"]) >= 4
    for n, g in grads["reference"].items():
        assert float(g.abs().max()) > 0, n
        torch.testing.assert_close(grads["cpu"][n], g, rtol=1e-9, atol=1e-12, msg=n)


def _conv_net():
    from pyro_gpn.layers import GPNConv2d

    torch.manual_seed(0)
    return GPNSequential(
        [GPNConv2d(1, 2, 3, input_size=(5, 5)), MomentFlatten()],
        input_shape=(1, 5, 5),
        num_outputs=3,
    )


def test_inputs_follow_the_dtype_rule():
    """x in float64, float16 or NumPy is cast to the parameters' dtype (GPNNet's rule) in
    predict and loss, not refused from inside conv2d."""
    net = _conv_net()
    x, y = torch.rand(2, 25), torch.tensor([0, 1])
    want = net.predict(x).probs
    for given in (x.double(), x.numpy()):
        torch.testing.assert_close(net.predict(given).probs, want)
        torch.testing.assert_close(net.loss(given, y), net.loss(x, y))
    half = x.half()
    torch.testing.assert_close(net.predict(half).probs, net.predict(half.float()).probs)
    rnn, xs, ys = _rnn()  # float64 parameters, float32 data and float32 targets
    torch.testing.assert_close(rnn.loss(xs.float(), ys.float()), rnn.loss(xs, ys))
    with pytest.raises(ValueError, match="x must be a floating-point tensor"):
        net.predict(torch.ones(2, 25, dtype=torch.long))


def test_empty_batch_predicts_nothing_and_has_no_mean_loss():
    """As GPNNet: 0 rows predict an empty result; the mean loss over them is refused (NaN)."""
    net = _conv_net()
    assert net.predict(torch.rand(0, 25)).probs.shape == (0, 3)
    empty = torch.zeros(0, dtype=torch.long)
    with pytest.raises(ValueError, match="x has 0 samples"):
        net.loss(torch.rand(0, 25), empty)
    net.objective = "predictive"
    with pytest.raises(ValueError, match="x has 0 samples"):
        net.loss(torch.rand(0, 25), empty)
    assert net.expected_nll(torch.rand(0, 25), empty, reduction="none").shape == (0,)


def test_gaussian_head_from_its_name_takes_noise_std_init():
    net = GPNSequential([MomentLinear(2, 3, dtype=DT)], (2,), head="gaussian", noise_std_init=0.3)
    torch.testing.assert_close(net.head.noise_std, torch.full((3,), 0.3, dtype=DT))
