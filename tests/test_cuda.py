"""The blocks of issue 17 and the training routes on a CUDA device agree with the CPU.

The layer-level CUDA checks (the Triton kernels against the float64 reference) live in
``tests/moments/test_fused.py`` and ``tests/layers/test_respond.py``; these tests add what sits
above them: a convolutional and a recurrent GPN stack (values and gradients), the
:class:`~pyro_gpn.inference.Trainer` with ``device="cuda"`` and :func:`~pyro_gpn.inference.fit_svi`
with the closed-form ELBO on CUDA tensors, each against the same run on the CPU. Every function
below takes the device, so the comparison itself is exercised on the CPU too (``"cpu"`` against
``"cpu"``, in ``test_the_comparisons_run_on_the_cpu``); on a machine without CUDA the device cases
are skipped.
"""

import copy

import pyro
import pytest
import torch

from pyro_gpn import GPNSequential, Moments
from pyro_gpn.layers import (
    GPNConv2d,
    GPNLayer,
    GPNRecurrent,
    MomentAvgPool2d,
    MomentFlatten,
    MomentLinear,
)

pytestmark = pytest.mark.usefixtures("fresh_param_store")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _cnn() -> GPNSequential:
    torch.manual_seed(0)
    blocks = [
        GPNConv2d(1, 3, 3, (7, 7), padding=1, stride=2),
        MomentAvgPool2d(2),
        MomentFlatten(),
        GPNLayer(12, 5),
    ]
    return GPNSequential(blocks, input_shape=(1, 7, 7), num_outputs=3)


def _rnn() -> GPNSequential:
    torch.manual_seed(0)
    return GPNSequential(
        [GPNRecurrent(2, 5), MomentLinear(5, 1)], input_shape=(6, 2), head="gaussian"
    )


def _images(rows: int = 24):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(rows, 49, generator=g)
    y = (x[:, :24].mean(1) > x[:, 25:].mean(1)).long() + (x[:, 24] > 0.7).long()
    return x, y


def _sequences(rows: int = 24):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, 12, generator=g)
    y = x.reshape(rows, 6, 2)[:, -1].sum(1, keepdim=True).tanh()
    return x, y


def _loss_and_grads(net: GPNSequential, x, y, device: str):
    net = copy.deepcopy(net).to(device)
    loss = net.loss(x.to(device), y.to(device))
    grads = torch.autograd.grad(loss, [p for p in net.parameters() if p.requires_grad])
    return loss.detach().cpu(), [g.cpu() for g in grads]


def compare_stacks(device: str) -> None:
    """The loss and every gradient of a GPN CNN and a GPN RNN on ``device`` equal the CPU's."""
    for make, data in ((_cnn, _images), (_rnn, _sequences)):
        net = make()
        x, y = data()
        loss_cpu, grads_cpu = _loss_and_grads(net, x, y, "cpu")
        loss_dev, grads_dev = _loss_and_grads(net, x, y, device)
        assert torch.isfinite(loss_dev)
        torch.testing.assert_close(loss_dev, loss_cpu, rtol=1e-5, atol=1e-6)
        for g_dev, g_cpu in zip(grads_dev, grads_cpu, strict=True):
            torch.testing.assert_close(g_dev, g_cpu, rtol=1e-4, atol=1e-6)


def compare_moments(device: str) -> None:
    """A convolutional layer's output moments for a Gaussian input on ``device`` equal the CPU's,
    in ``meanvar`` mode, with activations far outside the inducing range among them."""
    torch.manual_seed(3)
    layer = GPNConv2d(2, 3, 3, (5, 5), padding=1)
    mean = torch.randn(4, 50) * 3.0
    var = torch.rand(4, 50) * 0.5 + 1e-4
    out_cpu = layer(Moments(mean, var=var))
    dev_layer = copy.deepcopy(layer).to(device)
    out_dev = dev_layer(Moments(mean.to(device), var=var.to(device)))
    torch.testing.assert_close(out_dev.mean.cpu(), out_cpu.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_dev.variance.cpu(), out_cpu.variance, rtol=1e-5, atol=1e-7)


def compare_trainer(device: str, tmp_path) -> None:
    """Three epochs of the :class:`Trainer` on ``device`` end at the CPU run's parameters."""
    from pyro_gpn.inference import TrainConfig, Trainer

    x, y = _images(48)
    states = []
    for where in ("cpu", device):
        net = _cnn()
        config = TrainConfig(
            lr=1e-2,
            batch_size=16,
            max_epochs=3,
            progress=False,
            seed=0,
            device=where,
            out_dir=str(tmp_path / where.replace(":", "_") / str(len(states))),
        )
        result = Trainer(net, config).fit((x, y), (x[:16], y[:16]))
        assert result.epochs == 3
        states.append({k: v.detach().cpu() for k, v in net.state_dict().items()})
    for name, value in states[0].items():
        torch.testing.assert_close(states[1][name], value, rtol=1e-4, atol=1e-6, msg=name)


def compare_svi(device: str) -> None:
    """Twenty steps of :func:`fit_svi` with the closed-form ELBO on ``device`` end at the CPU
    run's parameters and losses."""
    from pyro_gpn.inference import ClosedFormELBO, fit_svi
    from pyro_gpn.models import VariationalGPN

    g = torch.Generator().manual_seed(4)
    x = torch.rand(40, 3, generator=g, dtype=torch.float64)
    y = (x[:, :1] - x[:, 1:2]).sin()
    runs = []
    for where in ("cpu", device):
        pyro.clear_param_store()
        torch.manual_seed(0)
        vgpn = VariationalGPN([3, 4, 1], num_data=40).to(where)
        fit = fit_svi(
            vgpn.model,
            vgpn.guide,
            x.to(where),
            y.to(where),
            loss=ClosedFormELBO(vgpn),
            num_steps=20,
            batch_size=40,
            lr=1e-2,
            seed=3,
            progress=False,
        )
        runs.append((fit.losses, {k: v.detach().cpu() for k, v in vgpn.state_dict().items()}))
    (losses_cpu, state_cpu), (losses_dev, state_dev) = runs
    assert all(torch.isfinite(torch.tensor(losses_dev)))
    torch.testing.assert_close(
        torch.tensor(losses_dev), torch.tensor(losses_cpu), rtol=1e-5, atol=1e-6
    )
    for name, value in state_cpu.items():
        torch.testing.assert_close(state_dev[name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_the_comparisons_run_on_the_cpu(tmp_path):
    compare_stacks("cpu")
    compare_moments("cpu")
    compare_trainer("cpu", tmp_path)
    compare_svi("cpu")


@pytest.mark.gpu
@needs_cuda
def test_conv_and_recurrent_stacks_on_cuda():
    compare_stacks("cuda")


@pytest.mark.gpu
@needs_cuda
def test_conv_moments_on_cuda():
    compare_moments("cuda")


@pytest.mark.gpu
@needs_cuda
def test_trainer_on_cuda(tmp_path):
    compare_trainer("cuda", tmp_path)


@pytest.mark.gpu
@needs_cuda
def test_closed_form_svi_on_cuda():
    compare_svi("cuda")
