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
from tests.mc import assert_mc_covariance, assert_mc_mean, assert_mc_variance

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


def _sample(layer, x, generator, response=False):
    """Draw every state for input sequences ``x [K, S, T D]`` through ``layer.conditional``;
    with ``response``, also a draw of the last noise-free response ``F_T [K, S, N]`` given the
    same last activation (``h_T = F_T + noise``, the noise independent)."""
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
    states = torch.stack(states, 1).reshape(k, s, -1)
    if not response:
        return states
    mean, var = layer.conditional(a, noise=False)
    eps = torch.randn(mean.shape, dtype=DT, generator=generator)
    return states, (mean + var.sqrt() * eps).reshape(k, s, -1)


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("mode", ["meanvar", "cov"])
@pytest.mark.parametrize(
    ("cls", "share"),
    [(GPNRecurrent, "none"), (GPNRecurrent, "layer"), (VariationalGPNRecurrent, "none")],
)
def test_exact_for_one_and_two_observed_steps(steps, mode, cls, share):
    layer = _rnn(cls, share=share, return_sequence=True)
    with torch.no_grad():  # a common part correlates h_2's units (an orthogonal U would map
        layer.recurrent_weight.add_(0.4)  # h_1's near-equal variances to a near-diagonal Cov)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, steps * 2, dtype=DT, generator=g)
    with torch.no_grad():
        out = layer.propagate(x, mode)
        draws, responses = _sample(layer, x.expand(30000, -1, -1), g, response=True)
    assert out.mean.shape == (4, steps * 3)
    assert_mc_mean(draws, out.mean)
    assert_mc_variance(draws, out.var)
    if mode == "cov":
        # the last state's full covariance over units (return_sequence=False) -- correlated
        # through U at t = 2 -- and the noise-free response's (h_T's minus diag(sigma^2)),
        # against the sample covariances of the draws, within 5 Monte Carlo s.e. per entry
        layer.return_sequence = False
        with torch.no_grad():
            last, response = layer.propagate(x, mode), layer.propagate(x, mode, noise=False)
        assert_mc_covariance(draws[..., -3:], last.cov)
        assert_mc_covariance(responses, response.cov)


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


def _long_sequence_errors(layer, x, draws):
    """Each mode's largest mean error (in units of the mean Monte Carlo sd) and median
    relative variance error against ``draws [K, S, N]`` of ``h_T``, and ``"cov"`` mode's
    largest correlation error (its covariance less the sample one, over the sample sds)."""
    mc_mean, mc_var = draws.mean(0), draws.var(0)
    centred = draws - mc_mean
    mc_cov = torch.einsum("ksi,ksj->sij", centred, centred) / (draws.shape[0] - 1)
    sd = mc_var.sqrt()
    sd_outer = sd.unsqueeze(-1) * sd.unsqueeze(-2)
    errors = {}
    for mode in ("meanvar", "cov"):
        out = layer.propagate(x, mode)
        errors[mode] = (
            float((out.mean - mc_mean).abs().max() / sd.mean()),
            float(((out.variance - mc_var) / mc_var).abs().median()),
        )
    errors["corr"] = float(((out.cov - mc_cov) / sd_outer).abs().max())  # out: "cov" mode's
    errors["mc_corr"] = float((mc_cov / sd_outer - torch.eye(4, dtype=DT)).abs().max())
    return errors


@pytest.mark.parametrize("weights", ["orthogonal", "correlated"])
def test_long_sequence_close_and_cov_mode_at_least_as_close(weights):
    """Approximate from t = 3 on (``h_{t-1}`` no longer Gaussian): both modes against 20000
    draws of ``h_T``, bounds about 3x the errors observed. Monte Carlo s.e.: 0.007 sd on a mean,
    0.01 on a relative variance, <= 0.007 on a correlation; every bound is >= 4 s.e.

    ``"orthogonal"`` (the default ``U``, random activation functions, six steps): the states
    stay nearly uncorrelated and both modes are close (observed mean error 0.03, variance
    0.01, ``"cov"``'s correlation error 0.04). ``"correlated"`` (a common part in ``U``,
    near-identity functions, four steps): the states correlate (up to ~0.5); ``"meanvar"``
    drops that and errs (observed 0.15, 0.22), ``"cov"`` carries it (0.07, 0.012, 0.06)."""
    if weights == "orthogonal":
        layer, steps = _rnn(d=1, n=4, seed=3), 6
    else:
        layer, steps = _rnn(d=1, n=4, seed=3, targets_init="identity"), 4
        with torch.no_grad():
            layer.recurrent_weight.mul_(0.5).add_(0.3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, steps, dtype=DT, generator=g)
    with torch.no_grad():
        draws = _sample(layer, x.expand(20000, -1, -1), g)[..., -4:]
        errors = _long_sequence_errors(layer, x, draws)
    if weights == "orthogonal":
        assert errors["meanvar"][0] < 0.09 and errors["meanvar"][1] < 0.04, errors
        assert errors["cov"][0] < 0.09 and errors["cov"][1] < 0.04, errors
        assert errors["corr"] < 0.12, errors
    else:
        assert errors["meanvar"][0] < 0.45 and errors["meanvar"][1] < 0.65, errors
        assert errors["cov"][0] < 0.2 and errors["cov"][1] < 0.04, errors
        assert errors["corr"] < 0.17 and errors["mc_corr"] > 0.4, errors
        # carrying the correlations is what makes "cov" the closer: at most a quarter of
        # "meanvar"'s variance error, and no more of a mean error
        assert errors["cov"][1] < errors["meanvar"][1] / 4, errors
        assert errors["cov"][0] <= errors["meanvar"][0], errors


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
