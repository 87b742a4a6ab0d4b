"""GPNRecurrent: Monte Carlo through the layer's own conditional (exact for sequences of one
and two observed steps, close for longer ones), modes, gradcheck, shapes and argument errors."""

import pytest
import torch
from torch.autograd import gradcheck

from pyro_gpn import GPNSequential, Moments
from pyro_gpn.layers import GPNRecurrent, MomentLinear, VariationalGPNRecurrent
from pyro_gpn.layers.recurrent import add_independent
from tests.dtype_rule import assert_follows_dtype_rule
from tests.gradients import assert_gradcheck, gradcheck_parameters
from tests.mc import assert_mc_mean, assert_mc_variance

DT = torch.float64


pytestmark = pytest.mark.usefixtures("fresh_param_store")


def _rnn(cls=GPNRecurrent, d=2, n=3, seed=0, **kwargs):
    torch.manual_seed(seed)
    layer = cls(d, n, dtype=DT, **kwargs)
    with torch.no_grad():
        layer.lengthscales = torch.rand(layer.num_functions, dtype=DT) * 0.5 + 0.4
        layer.noise_std = torch.rand(layer.num_functions, dtype=DT) * 0.2 + 0.05
        layer.recurrent_weight.mul_(1.2)
    return layer


def _sample(layer, x, generator):
    """Draw every state for input sequences ``x [K, S, T D]`` through ``layer.conditional``."""
    k, s = x.shape[:2]
    seq = x.reshape(k * s, -1, layer.in_features)
    state, states = None, []
    for t in range(seq.shape[1]):
        a = seq[:, t] @ layer.weight
        if state is not None:
            a = a + state @ layer.recurrent_weight
        mean, var = layer.conditional(a)
        eps = torch.randn(mean.shape, dtype=DT, generator=generator)
        state = mean + var.sqrt() * eps
        states.append(state)
    return torch.stack(states, 1).reshape(k, s, -1)


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("mode", ["meanvar", "cov"])
@pytest.mark.parametrize(
    ("cls", "share"),
    [(GPNRecurrent, "none"), (GPNRecurrent, "layer"), (VariationalGPNRecurrent, "none")],
)
def test_exact_for_one_and_two_observed_steps(steps, mode, cls, share):
    layer = _rnn(cls, share=share, return_sequence=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, steps * 2, dtype=DT, generator=g)
    with torch.no_grad():
        out = layer.propagate(x, mode)
        draws = _sample(layer, x.expand(30000, -1, -1), g)
    assert out.mean.shape == (4, steps * 3)
    assert_mc_mean(draws, out.mean)
    assert_mc_variance(draws, out.var)


def test_gaussian_input_one_step_exact_and_noise_free_output():
    layer = _rnn(d=3, n=2)
    g = torch.Generator().manual_seed(2)
    inputs = Moments(
        torch.randn(3, 3, dtype=DT, generator=g), var=torch.rand(3, 3, dtype=DT, generator=g)
    )
    with torch.no_grad():
        out = layer.propagate(inputs)
        response = layer.propagate(inputs, noise=False)
        x = inputs.mean + inputs.var.sqrt() * torch.randn(30000, 3, 3, dtype=DT, generator=g)
        draws = _sample(layer, x, g)
    assert_mc_mean(draws, out.mean)
    assert_mc_variance(draws, out.var)
    torch.testing.assert_close(response.mean, out.mean)
    torch.testing.assert_close(response.var, out.var - layer.noise_std.square().detach())


def test_long_sequence_close_and_cov_mode_at_least_as_close():
    layer = _rnn(d=1, n=4, seed=3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 6, dtype=DT, generator=g)
    with torch.no_grad():
        draws = _sample(layer, x.expand(20000, -1, -1), g)[..., -4:]
        mc_mean, mc_var = draws.mean(0), draws.var(0)
        errors = {}
        for mode in ("meanvar", "cov"):
            out = layer.propagate(x, mode)
            errors[mode] = (
                float((out.mean - mc_mean).abs().max() / mc_var.sqrt().mean()),
                float(((out.variance - mc_var) / mc_var).abs().median()),
            )
    assert errors["meanvar"][0] < 0.15 and errors["meanvar"][1] < 0.15, errors
    assert errors["cov"][0] < 0.15 and errors["cov"][1] < 0.15, errors


def test_mean_mode_is_the_mean_recursion():
    layer = _rnn()
    x = torch.randn(2, 8, dtype=DT)
    out = layer.propagate(x, "mean")
    assert out.is_deterministic
    # the recursion of the conditional means (no variance carried)
    state = None
    for t in range(4):
        a = x[:, 2 * t : 2 * t + 2] @ layer.weight
        if state is not None:
            a = a + state @ layer.recurrent_weight
        state = layer.conditional(a)[0]
    torch.testing.assert_close(out.mean, state)


def test_gradcheck_float64():
    layer = _rnn(num_inducing=5)
    g = torch.Generator().manual_seed(5)
    mean = torch.randn(2, 6, dtype=DT, generator=g).requires_grad_()
    var = (torch.rand(2, 6, dtype=DT, generator=g) * 0.3).requires_grad_()
    u = layer.recurrent_weight.detach().clone().requires_grad_()

    def outputs(m, v, u):
        moments = Moments(m, var=v, validate=False)
        out = torch.func.functional_call(layer, {"recurrent_weight": u}, (moments,))
        return out.mean, out.var

    assert gradcheck(outputs, (mean, var, u))


def _sequence_moments(samples=2, features=6, seed=5):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(samples, features, dtype=DT, generator=g)
    var = torch.rand(samples, features, dtype=DT, generator=g) * 0.3 + 0.05
    return Moments(mean, var=var)


@pytest.mark.parametrize("cls", [GPNRecurrent, VariationalGPNRecurrent])
def test_gradcheck_gp_parameters_float64(cls):
    """Every parameter -- ``W``, ``U``, the lengthscales, the output noise, and the targets and
    target variances (``GPNRecurrent``) or ``q(U)``'s mean and Cholesky factor with the KL
    term (``VariationalGPNRecurrent``) -- through three time steps of Gaussian inputs (float64,
    finite differences; the state fed back makes every parameter enter every step)."""
    layer = _rnn(cls, num_inducing=4)
    with torch.no_grad():  # a non-default q(U) (a unit prior scale would be a special point)
        for p in layer.response.parameters():
            p.add_(0.1 * torch.randn_like(p))
    names = {n for n, _ in layer.named_parameters()}
    assert {"recurrent_weight", "lengthscales_unconstrained", "noise_std_unconstrained"} < names
    gradcheck_parameters(layer, _sequence_moments())


@pytest.mark.parametrize("cls", [GPNRecurrent, VariationalGPNRecurrent])
def test_gradcheck_cov_mode_float64(cls):
    """``"cov"`` mode (the state's covariance over units carried through time): the output
    mean and covariance with respect to the input moments and to every parameter."""
    layer = _rnn(cls, num_inducing=4)
    inputs = _sequence_moments()
    mean = inputs.mean.clone().requires_grad_()
    var = inputs.var.clone().requires_grad_()

    def outputs(m, v):
        out = layer.propagate(Moments(m, var=v, validate=False), "cov")
        return out.mean, out.cov

    assert layer.propagate(inputs, "cov").cov.shape == (2, 3, 3)
    assert_gradcheck(outputs, (mean, var))
    gradcheck_parameters(layer, inputs, mode="cov")


@pytest.mark.parametrize(("batch", "steps"), [(1, 1), (1, 5), (3, 1)])
def test_shapes(batch, steps):
    layer = _rnn(d=2, n=3)
    x = torch.randn(batch, 2 * steps, dtype=DT)
    assert layer(x).mean.shape == (batch, 3)
    assert layer.output_shape((steps, 2)) == (3,)
    seq = _rnn(d=2, n=3, return_sequence=True)
    assert seq(x).var.shape == (batch, 3 * steps)
    assert seq.output_shape((steps, 2)) == (steps, 3)
    assert layer.propagate(x, "cov").cov.shape == (batch, 3, 3)


def test_add_independent():
    a = Moments(torch.ones(2, 2), var=torch.ones(2, 2))
    b = Moments(torch.ones(2, 2), cov=torch.eye(2).expand(2, 2, 2) * 2)
    s = add_independent(a, b)
    torch.testing.assert_close(s.cov, torch.eye(2).expand(2, 2, 2) * 3)
    assert add_independent(Moments(torch.ones(1, 2)), Moments(torch.ones(1, 2))).is_deterministic


def test_network_regression_trains(tmp_path):
    from pyro_gpn.inference import TrainConfig, Trainer
    from pyro_gpn.inference.closed_form import closed_form_elbo

    torch.manual_seed(0)
    t = torch.linspace(0, 6, 12)
    starts = torch.rand(64, 1) * 6
    x = torch.sin(starts + t[:-1])
    y = torch.sin(starts + t[-1:])
    net = GPNSequential(
        [
            GPNRecurrent(1, 6),
            MomentLinear(6, 1),
        ],
        input_shape=(11, 1),
        head="gaussian",
    )
    before = float(net.loss(x, y).detach())
    config = TrainConfig(
        lr=1e-2, batch_size=16, max_epochs=3, progress=False, out_dir=str(tmp_path)
    )
    assert Trainer(net, config).fit((x, y), (x, y)).best_val_loss < before
    vnet = GPNSequential(
        [VariationalGPNRecurrent(1, 4, output_noise=False)], (11, 1), head="gaussian", num_data=64
    )
    elbo = closed_form_elbo(vnet, x, y.expand(-1, 4))
    assert torch.isfinite(elbo) and float(vnet.kl_divergence().detach()) > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="hidden_size|out_features"):
        GPNRecurrent(2, 0)
    with pytest.raises(ValueError, match="return_sequence"):
        GPNRecurrent(2, 3, return_sequence="yes")
    layer = GPNRecurrent(2, 3)
    with pytest.raises(ValueError, match="T \\* 2 features"):
        layer(torch.randn(2, 5))
    with pytest.raises(ValueError, match="mode"):
        layer(torch.randn(2, 4), mode="full")
    with pytest.raises(ValueError, match="inputs"):
        layer(torch.full((2, 4), float("inf")))
    with pytest.raises(ValueError, match="T, 2"):
        layer.output_shape((3, 3))


def test_inputs_follow_the_dtype_rule():
    """float64, float16 and NumPy sequences are cast to the parameters' dtype (GPNLayer's
    rule), not refused with a message about the weight's dtype."""
    torch.manual_seed(0)
    assert_follows_dtype_rule(GPNRecurrent(2, 3), torch.rand(2, 10))


def test_unscaled_inputs_warn_and_empty_batches_are_empty():
    from pyro_gpn._validation import UnscaledInputWarning

    layer = GPNRecurrent(2, 3, return_sequence=True)
    with pytest.warns(UnscaledInputWarning, match="inputs"):
        layer(torch.rand(2, 10) * 1e3)
    for mode in ("mean", "meanvar"):
        assert layer(torch.rand(0, 10), mode=mode).mean.shape == (0, 15)
    assert GPNRecurrent(2, 3)(torch.rand(0, 10)).mean.shape == (0, 3)
