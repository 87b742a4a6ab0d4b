"""Every convolutional and recurrent GPN block (point-estimated and variational) under every
head of the package, in a :class:`~pyro_gpn.GPNSequential`: the training loss is finite and its
gradient reaches every trainable parameter (a head that cut a path would leave a parameter
untrained), ``predict`` has the head's shapes, the closed-form ELBO of the variational blocks is
finite and differentiable, and the :class:`~pyro_gpn.inference.Trainer` trains each stack (the
issue's "each works with every head, the closed-form ELBO and the trainer"). Tiny shapes: the
point is the plumbing between blocks and heads, not accuracy."""

import math

import pytest
import torch

from pyro_gpn import GPNSequential
from pyro_gpn.heads import HeteroscedasticGaussianHead, StudentTHead
from pyro_gpn.inference import TrainConfig, Trainer
from pyro_gpn.inference.closed_form import closed_form_elbo
from pyro_gpn.layers import (
    GPNConv2d,
    GPNRecurrent,
    MomentFlatten,
    VariationalGPNConv2d,
    VariationalGPNRecurrent,
)

DT = torch.float64
ROWS = 6
CLASSES = 3

pytestmark = pytest.mark.usefixtures("fresh_param_store")

#: the block at the top of the stack; its output width (conv: 2 channels of 2 x 2 positions)
BLOCKS = {
    "conv": (GPNConv2d, (1, 4, 4), 8),
    "variational_conv": (VariationalGPNConv2d, (1, 4, 4), 8),
    "recurrent": (GPNRecurrent, (3, 1), 4),
    "variational_recurrent": (VariationalGPNRecurrent, (3, 1), 4),
}

#: every head: a name the networks accept, or a Head built for the features' width
HEADS = {
    "softmax": lambda width: "softmax",
    "gaussian": lambda width: "gaussian",
    "heteroscedastic": lambda width: HeteroscedasticGaussianHead(width // 2, dtype=DT),
    "heteroscedastic_t": lambda width: HeteroscedasticGaussianHead(width // 2, df=5.0, dtype=DT),
    "student_t": lambda width: StudentTHead(width, df=4.0, dtype=DT),
}


def _stack(block: str, head: str, seed: int = 0):
    """A one-block stack under ``head``, and inputs and targets of ``ROWS`` samples."""
    cls, shape, width = BLOCKS[block]
    torch.manual_seed(seed)
    built = HEADS[head](width)
    noisy = head == "softmax"  # a regression head owns the observation noise
    if cls in (GPNConv2d, VariationalGPNConv2d):
        blocks = [cls(1, 2, 3, shape[1:], num_inducing=5, output_noise=noisy, dtype=DT)]
        blocks.append(MomentFlatten())
    else:
        blocks = [cls(1, width, num_inducing=5, output_noise=noisy, dtype=DT)]
    net = GPNSequential(
        blocks, shape, head=built, num_outputs=CLASSES if noisy else None, num_data=50
    )
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.rand(ROWS, math.prod(shape), dtype=DT, generator=g) * 2 - 1
    if noisy:
        y = torch.arange(ROWS) % CLASSES
    else:
        y = torch.randn(ROWS, getattr(net.head, "num_outputs", width), dtype=DT, generator=g)
    return net, x, y


def _assert_gradient_reaches_every_parameter(net, objective: torch.Tensor) -> None:
    params = {n: p for n, p in net.named_parameters() if p.requires_grad}
    grads = torch.autograd.grad(objective, list(params.values()), allow_unused=True)
    for (name, _), grad in zip(params.items(), grads, strict=True):
        assert grad is not None, f"{name} gets no gradient"
        assert bool(torch.isfinite(grad).all()), name
        assert float(grad.abs().sum()) > 0, f"{name} has a zero gradient"


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("block", list(BLOCKS))
def test_loss_gradient_predict_and_elbo(block, head):
    """The training loss (each block's default objective) is finite with a gradient for every
    parameter of blocks and head; ``predict`` gives ``[S, C]`` probabilities or ``[S, D]``
    regression moments; for variational blocks the closed-form ELBO (and its gradient) too."""
    net, x, y = _stack(block, head)
    loss = net.loss(x, y)
    assert loss.shape == () and math.isfinite(float(loss.detach()))
    _assert_gradient_reaches_every_parameter(net, loss)

    prediction = net.predict(x)
    width = CLASSES if head == "softmax" else y.shape[1]
    assert prediction.task == ("classification" if head == "softmax" else "regression")
    assert prediction.mean.shape == prediction.std.shape == (ROWS, width)
    assert bool(torch.isfinite(prediction.std).all() and (prediction.std > 0).all())
    if head == "softmax":
        torch.testing.assert_close(prediction.probs.sum(-1), torch.ones(ROWS, dtype=DT))

    if block.startswith("variational"):
        elbo = closed_form_elbo(net, x, y)
        assert math.isfinite(float(elbo.detach())) and float(net.kl_divergence().detach()) > 0
        _assert_gradient_reaches_every_parameter(net, elbo)


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("block", list(BLOCKS))
def test_trainer_trains_each_stack(block, head):
    """One epoch of the :class:`Trainer` (two steps) moves every parameter and reports finite
    training and validation losses and the head's validation metrics."""
    net, x, y = _stack(block, head)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    config = TrainConfig(lr=1e-2, batch_size=ROWS // 2, max_epochs=1, progress=False)
    result = Trainer(net, config).fit((x, y), (x, y))
    (row,) = result.history
    assert row["step"] == 2 and result.best_epoch == 1
    metrics = ["val_error"] if head == "softmax" else ["val_rmse", "val_log_likelihood"]
    for key in ["train_loss", "val_loss", *metrics]:
        assert math.isfinite(row[key]), key
    for name, param in net.named_parameters():
        assert not torch.equal(param.detach(), before[name]), f"{name} was not trained"
