"""Convolutional GPN layers and the linear blocks: Monte Carlo through the layer's own
conditional, exactness for observed inputs, gradcheck, shapes and argument errors."""

import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch.autograd import gradcheck
from torch.func import functional_call

from pyro_gpn import GPNSequential, Moments
from pyro_gpn.layers import (
    GPNConv2d,
    GPNLayer,
    MomentAvgPool2d,
    MomentFlatten,
    MomentLinear,
    VariationalGPNConv2d,
)
from tests.dtype_rule import assert_follows_dtype_rule
from tests.gradients import assert_gradcheck, gradcheck_parameters
from tests.mc import assert_mc_mean, assert_mc_variance

DT = torch.float64


pytestmark = pytest.mark.usefixtures("fresh_param_store")


def _conv(cls=GPNConv2d, *args, seed=0, **kwargs):
    torch.manual_seed(seed)
    layer = cls(*args, dtype=DT, **kwargs)
    with torch.no_grad():  # random, non-default parameters
        layer.lengthscales = torch.rand(layer.num_functions, dtype=DT) * 0.5 + 0.4
        layer.noise_std = torch.rand(layer.num_functions, dtype=DT) * 0.2 + 0.05
        layer.weight.mul_(1.5)
    return layer


def _sample_conv(layer, x, generator):
    """Draw the outputs of ``layer`` for input images ``x [K, S, C H W]`` from its conditional."""
    k, s = x.shape[:2]
    images = x.reshape(k * s, *layer.in_shape)
    act = F.conv2d(images, layer.kernel, None, layer.stride, layer.padding)
    rows = act.permute(0, 2, 3, 1).reshape(-1, layer.out_channels)
    mean, var = layer.conditional(rows)
    out = mean + var.sqrt() * torch.randn(mean.shape, dtype=DT, generator=generator)
    out = out.reshape(k * s, *layer.out_shape[1:], layer.out_channels).permute(0, 3, 1, 2)
    return out.reshape(k, s, -1)


def _gaussian_input(s, features, seed=1):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(s, features, dtype=DT, generator=g)
    var = torch.rand(s, features, dtype=DT, generator=g) * 0.5 + 0.05
    return Moments(mean, var=var), g


@pytest.mark.parametrize(
    ("cls", "share"),
    [(GPNConv2d, "none"), (GPNConv2d, "layer"), (VariationalGPNConv2d, "none")],
)
def test_conv_matches_monte_carlo_for_gaussian_input(cls, share):
    layer = _conv(cls, 2, 3, 3, (5, 4), stride=(2, 1), padding=1, share=share)
    inputs, g = _gaussian_input(3, 2 * 5 * 4)
    with torch.no_grad():
        out = layer.propagate(inputs, "meanvar")
        x = inputs.mean + inputs.var.sqrt() * torch.randn(
            20000, *inputs.mean.shape, generator=g, dtype=DT
        )
        draws = _sample_conv(layer, x, g)
    assert out.mean.shape == (3, 3 * 3 * 4)
    assert_mc_mean(draws, out.mean, n_se=5)
    assert_mc_variance(draws, out.var, n_se=5)


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "size", "batch"),
    [
        (3, 1, 0, (7, 7), 4),
        (5, 2, 2, (9, 6), 1),
        ((1, 3), (1, 2), (0, 1), (4, 5), 2),
        (1, 1, 0, (1, 1), 1),
    ],
)
def test_observed_inputs_give_the_conditional_at_the_convolution(
    kernel, stride, padding, size, batch
):
    """Deterministic inputs: exact output moments = the conditional at conv(x) (also the layout)."""
    layer = _conv(GPNConv2d, 2, 3, kernel, size, stride=stride, padding=padding)
    x = torch.rand(batch, 2 * size[0] * size[1], dtype=DT)
    out = layer(x)
    act = F.conv2d(x.reshape(batch, 2, *size), layer.kernel, None, stride, padding)
    mean, var = layer.conditional(act.permute(0, 2, 3, 1).reshape(-1, 3))
    back = lambda t: t.reshape(batch, *act.shape[2:], 3).permute(0, 3, 1, 2).reshape(batch, -1)
    assert out.mean.shape == (batch, math.prod(layer.out_shape))
    assert tuple(act.shape[1:]) == layer.out_shape
    torch.testing.assert_close(out.mean, back(mean), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(out.var, back(var), rtol=1e-9, atol=1e-10)
    # the weight is the unfolded-patch projection: patches @ weight = the convolution
    patches = F.unfold(x.reshape(batch, 2, *size), layer.kernel_size, 1, padding, stride)
    torch.testing.assert_close(
        (patches.mT @ layer.weight).mT.reshape(act.shape), act, rtol=1e-10, atol=1e-12
    )


def test_mean_mode_and_float32():
    layer = _conv(GPNConv2d, 1, 2, 3, (6, 6), padding=1)
    inputs, _ = _gaussian_input(2, 36)
    out = layer.propagate(inputs, "mean")
    assert out.is_deterministic
    torch.testing.assert_close(out.mean, layer.propagate(Moments(inputs.mean), "mean").mean)
    torch.manual_seed(0)
    layer32 = GPNConv2d(1, 2, 3, (6, 6), padding=1)
    out32 = layer32(inputs.to(torch.float32))
    assert out32.mean.dtype == torch.float32 and bool((out32.var > 0).all())


def test_avgpool_matches_monte_carlo_and_overlapping_windows():
    inputs, g = _gaussian_input(2, 3 * 6 * 5)
    x = inputs.mean + inputs.var.sqrt() * torch.randn(40000, 2, 90, dtype=DT, generator=g)
    for pool in (
        MomentAvgPool2d(2, input_shape=(3, 6, 5)),
        MomentAvgPool2d((3, 2), stride=1, input_shape=(3, 6, 5)),
    ):
        out = pool.propagate(inputs)
        draws = F.avg_pool2d(x.reshape(-1, 3, 6, 5), pool.kernel_size, pool.stride).reshape(
            40000, 2, -1
        )
        assert out.mean.shape == (2, math.prod(pool.out_shape))
        assert_mc_mean(draws, out.mean)
        assert_mc_variance(draws, out.var)


def test_linear_blocks():
    inputs, _ = _gaussian_input(4, 6)
    torch.manual_seed(0)
    lin = MomentLinear(6, 3, dtype=DT)
    with torch.no_grad():
        lin.bias.normal_()
    out = lin.propagate(inputs)
    torch.testing.assert_close(out.mean, inputs.mean @ lin.weight + lin.bias)
    torch.testing.assert_close(out.var, inputs.var @ lin.weight.square())
    cov = lin.propagate(inputs, "cov").cov
    torch.testing.assert_close(cov, lin.weight.mT @ torch.diag_embed(inputs.var) @ lin.weight)
    assert MomentFlatten().propagate(inputs) is inputs
    assert MomentFlatten().output_shape((2, 3, 4)) == (24,)


def test_stack_close_to_monte_carlo():
    """conv -> pool -> conv -> pool: each block sampled through its own conditional; the
    propagated moments drop the correlations between positions, so agreement is approximate."""
    conv1 = _conv(GPNConv2d, 1, 3, 3, (8, 8), padding=1, seed=2)
    conv2 = _conv(GPNConv2d, 3, 4, 3, (4, 4), padding=1, seed=3)
    pool1, pool2 = (
        MomentAvgPool2d(2, input_shape=(3, 8, 8)),
        MomentAvgPool2d(2, input_shape=(4, 4, 4)),
    )
    g = torch.Generator().manual_seed(5)
    x = torch.rand(3, 64, dtype=DT, generator=g)
    with torch.no_grad():
        out = pool2.propagate(conv2.propagate(pool1.propagate(conv1.propagate(x))))
        k = 6000
        h = _sample_conv(conv1, x.expand(k, -1, -1), g)
        h = F.avg_pool2d(h.reshape(-1, 3, 8, 8), 2).reshape(k, 3, -1)
        h = _sample_conv(conv2, h, g)
        h = F.avg_pool2d(h.reshape(-1, 4, 4, 4), 2).reshape(k, 3, -1)
    mc_mean, mc_var = h.mean(0), h.var(0)
    scale = mc_var.sqrt().mean()
    assert float((out.mean - mc_mean).abs().max()) < 0.1 * float(scale)
    assert float(((out.var - mc_var) / mc_var).abs().median()) < 0.06


def test_gradcheck_float64():
    """Gradients w.r.t. the input moments and the kernel (float64, finite differences)."""
    layer = _conv(GPNConv2d, 2, 2, 3, (4, 3), stride=(1, 2), padding=(1, 0), num_inducing=5)
    inputs, _ = _gaussian_input(2, 24)
    mean = inputs.mean.clone().requires_grad_()
    var = inputs.var.clone().requires_grad_()
    weight = layer.weight.detach().clone().requires_grad_()

    def outputs(m, v, w):
        moments = Moments(m, var=v, validate=False)
        out = torch.func.functional_call(layer, {"weight": w}, (moments,))
        return out.mean, out.var

    assert gradcheck(outputs, (mean, var, weight))


@pytest.mark.parametrize("cls", [GPNConv2d, VariationalGPNConv2d])
def test_gradcheck_gp_parameters_float64(cls):
    """Every parameter of the layer -- the kernel, the lengthscales, the output noise, and the
    response's targets and target variances (``GPNConv2d``) or ``q(U)``'s mean and Cholesky
    factor with the KL term (``VariationalGPNConv2d``) -- for Gaussian input images (float64,
    finite differences; the fused CPU kernels' hand-written backward included)."""
    layer = _conv(cls, 1, 2, 3, (3, 3), padding=1, num_inducing=4)
    with torch.no_grad():  # a non-default q(U) (a unit prior scale would be a special point)
        for p in layer.response.parameters():
            p.add_(0.1 * torch.randn_like(p))
    inputs, _ = _gaussian_input(2, 9)
    names = {n for n, _ in layer.named_parameters()}
    expected = {"weight", "lengthscales_unconstrained", "noise_std_unconstrained"}
    assert expected < names and len(names) == 5
    gradcheck_parameters(layer, inputs)


def test_gradcheck_avgpool_float64():
    """MomentAvgPool2d's means and variances with respect to the input means and variances
    (overlapping windows: each pixel reaches several outputs)."""
    pool = MomentAvgPool2d((2, 3), stride=1, input_shape=(2, 3, 4))
    inputs, _ = _gaussian_input(2, 24)
    mean = inputs.mean.clone().requires_grad_()
    var = inputs.var.clone().requires_grad_()

    def outputs(m, v):
        out = pool.propagate(Moments(m, var=v, validate=False))
        return out.mean, out.var

    assert_gradcheck(outputs, (mean, var))


@pytest.mark.parametrize("mode", ["meanvar", "cov"])
def test_gradcheck_linear_float64(mode):
    """MomentLinear's output moments (variances; the covariance in ``"cov"`` mode) with
    respect to the input means and variances, the weight and the bias."""
    torch.manual_seed(0)
    lin = MomentLinear(4, 3, dtype=DT)
    with torch.no_grad():
        lin.bias.normal_()
    inputs, _ = _gaussian_input(2, 4)
    mean = inputs.mean.clone().requires_grad_()
    var = inputs.var.clone().requires_grad_()
    weight = lin.weight.detach().clone().requires_grad_()
    bias = lin.bias.detach().clone().requires_grad_()

    def outputs(m, v, w, b):
        moments = Moments(m, var=v, validate=False)
        out = functional_call(lin, {"weight": w, "bias": b}, (moments, mode))
        return out.mean, out.var if mode == "meanvar" else out.cov

    assert_gradcheck(outputs, (mean, var, weight, bias))


def test_variational_kl_and_closed_form_elbo():
    from pyro_gpn.inference.closed_form import closed_form_elbo, predictive_log_likelihood

    torch.manual_seed(0)
    net = GPNSequential(
        [VariationalGPNConv2d(1, 2, 3, (4, 4), dtype=DT), MomentFlatten()],
        input_shape=(1, 4, 4),
        num_outputs=3,
        num_data=100,
        objective="closed_form",
    )
    x, y = torch.rand(5, 16, dtype=DT), torch.tensor([0, 1, 2, 0, 1])
    kl = net.kl_divergence()
    assert float(kl.detach()) > 0
    torch.testing.assert_close(kl, net.blocks[0].kl_divergence())
    elbo = closed_form_elbo(net, x, y)
    torch.testing.assert_close(elbo, 20 * net.expected_log_likelihood(x, y).sum() - kl)
    torch.testing.assert_close(net.loss(x, y), -elbo / 100)
    net.objective = "predictive"  # the default for variational blocks
    pll = predictive_log_likelihood(net, x, y)
    torch.testing.assert_close(pll, 20 * net.log_predictive(x, y).sum() - kl)
    torch.testing.assert_close(net.loss(x, y), -pll / 100)
    assert float(pll) > float(elbo)  # Jensen
    elbo.backward()
    assert net.blocks[0].response.targets_loc.grad is not None


def test_container_trains_with_the_trainer(tmp_path):
    from pyro_gpn.inference import TrainConfig, Trainer

    torch.manual_seed(0)
    x = torch.rand(64, 36)
    y = (x.reshape(64, 6, 6)[:, :3].mean((1, 2)) > x.reshape(64, 6, 6)[:, 3:].mean((1, 2))).long()
    net = GPNSequential(
        [
            GPNConv2d(1, 3, 3, (6, 6), padding=1),
            MomentAvgPool2d(2),
            MomentFlatten(),
            GPNLayer(27, 4),
        ],
        input_shape=(1, 6, 6),
        num_outputs=2,
    )
    before = float(net.loss(x, y).detach())
    config = TrainConfig(
        lr=1e-2, batch_size=16, max_epochs=3, progress=False, out_dir=str(tmp_path)
    )
    result = Trainer(net, config).fit((x, y), (x, y))
    assert result.epochs == 3 and result.best_val_loss < before
    assert net.predict(x).probs.shape == (64, 2)


def test_gaussian_head_and_errors():
    torch.manual_seed(0)
    blocks = [GPNConv2d(1, 2, 3, (4, 4), output_noise=False), MomentFlatten()]
    net = GPNSequential(blocks, (1, 4, 4), head="gaussian")
    assert net(torch.rand(2, 16)).mean.shape == (2, 8)
    with pytest.raises(ValueError, match="output_noise"):
        GPNSequential([GPNConv2d(1, 2, 3, (4, 4)), MomentFlatten()], (1, 4, 4), head="gaussian")
    with pytest.raises(ValueError, match="mode"):
        GPNSequential(blocks, (1, 4, 4), head="gaussian", mode="cov")
    with pytest.raises(ValueError, match="input_shape|inputs must have shape"):
        GPNSequential(blocks, (1, 5, 5), head="gaussian")
    with pytest.raises(ValueError, match="MomentFlatten"):
        GPNSequential([GPNConv2d(1, 2, 3, (4, 4)), GPNLayer(8, 2)], (1, 4, 4), num_outputs=2)
    with pytest.raises(ValueError, match="num_outputs"):
        GPNSequential(blocks[:1] + [MomentFlatten()], (1, 4, 4))
    with pytest.raises(ValueError, match="x must have 16 features"):
        net(torch.rand(2, 15))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"kernel_size": 0}, "kernel_size"),
        ({"kernel_size": (3,)}, "kernel_size"),
        ({"stride": 0}, "stride"),
        ({"padding": -1}, "padding"),
        ({"input_size": (2, 2)}, "kernel_size"),
        ({"in_channels": 0}, "in_channels"),
        ({"out_channels": 1.5}, "out_channels"),
        ({"share": "channel"}, "share"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    args = {"in_channels": 1, "out_channels": 2, "kernel_size": 3, "input_size": (5, 5)} | kwargs
    with pytest.raises(ValueError, match=name):
        GPNConv2d(**args)


def test_bad_inputs_and_modes():
    layer = GPNConv2d(1, 2, 3, (5, 5))
    with pytest.raises(ValueError, match="inputs must have 25 features"):
        layer(torch.rand(2, 24))
    with pytest.raises(ValueError, match="mode"):
        layer(torch.rand(2, 25), mode="cov")
    with pytest.raises(ValueError, match="inputs"):
        layer(torch.full((2, 25), float("nan")))
    with pytest.raises(ValueError, match="kernel_size"):
        MomentAvgPool2d(2).output_shape((1, 1, 1))
    with pytest.raises(ValueError, match="in_shape"):
        MomentAvgPool2d(2).output_shape((4,))
    with pytest.raises(ValueError, match="input_shape"):
        MomentAvgPool2d(2).propagate(torch.rand(2, 4))
    with pytest.raises(ValueError, match="in_features"):
        MomentLinear(0, 2)


@pytest.mark.parametrize("cls", [GPNConv2d, VariationalGPNConv2d])
def test_inputs_follow_the_dtype_rule(cls):
    """Floating tensors, NumPy arrays and Moments in another dtype are cast to the parameters'
    dtype (as GPNLayer and GPNNet do), not refused from inside ``conv2d``."""
    torch.manual_seed(0)
    layer = cls(1, 2, 3, input_size=5)
    x = torch.rand(2, 25)
    assert_follows_dtype_rule(layer, x)
    moments = layer(Moments(x.double(), var=torch.full((2, 25), 0.01, dtype=DT)))
    assert moments.mean.dtype == torch.float32 and moments.var.shape == (2, 18)


def test_empty_batch_gives_empty_outputs():
    layer = GPNConv2d(1, 2, 3, input_size=5)
    for mode in ("mean", "meanvar"):
        out = layer(torch.rand(0, 25), mode=mode)
        assert out.mean.shape == (0, 18)
        assert out.var is None or out.var.shape == (0, 18)


def test_unscaled_inputs_warn_as_a_dense_layer_does():
    from pyro_gpn._validation import UnscaledInputWarning

    layer = GPNConv2d(1, 2, 3, input_size=5)
    with pytest.warns(UnscaledInputWarning, match="inputs"):
        layer(torch.rand(2, 25) * 1e3)


@pytest.mark.parametrize("kernel_size", [2.5, None, (2, True), True])
def test_kernel_size_must_be_integers(kernel_size):
    with pytest.raises(ValueError, match="kernel_size must be an integer"):
        GPNConv2d(1, 2, kernel_size, input_size=(5, 5))


def test_moment_linear_follows_the_dtype_rule():
    torch.manual_seed(0)
    lin = MomentLinear(4, 2)
    x = torch.rand(3, 4)
    want = lin(Moments(x, var=torch.full_like(x, 0.1)))
    got = lin(Moments(x.double(), var=torch.full((3, 4), 0.1, dtype=DT)))
    assert got.mean.dtype == torch.float32
    torch.testing.assert_close(got.mean, want.mean)
    torch.testing.assert_close(lin(x.numpy()).mean, lin(x).mean)
    with pytest.raises(ValueError, match="dtype"):
        MomentLinear(4, 2, dtype=torch.float16)
