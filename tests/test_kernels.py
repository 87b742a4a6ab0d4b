import math

import pytest
import torch

from pyro_gpn import settings
from pyro_gpn.kernels import gpn_kernel, squared_exponential


def test_squared_exponential_values_and_unit_amplitude():
    a, b = torch.tensor([0.0, 1.0]), torch.tensor([0.0, 2.0, -1.0])
    k = squared_exponential(a, b, 0.5)
    torch.testing.assert_close(k, torch.exp(-0.5 * ((a[:, None] - b[None]) / 0.5) ** 2))
    assert torch.allclose(torch.diagonal(squared_exponential(a, a, 2.0)), torch.ones(2))


def test_gpn_kernel_projects_before_squaring():
    g = torch.Generator().manual_seed(0)
    x, x2 = torch.randn(5, 3, generator=g), torch.randn(4, 3, generator=g)
    w = torch.randn(3, 2, generator=g)
    ls = torch.tensor([0.7, 1.3])
    k = gpn_kernel(x, x2, w, ls)
    assert k.shape == (2, 5, 4)
    for n in range(2):
        proj = ((x[:, None, :] - x2[None, :, :]) @ w[:, n]) ** 2
        torch.testing.assert_close(k[n], torch.exp(-proj / (2 * ls[n] ** 2)))
    kxx = gpn_kernel(x, None, w[:, 0])
    assert torch.linalg.eigvalsh(kxx.double()).min() > -1e-6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((torch.zeros(2), torch.ones(3), 0.0), "lengthscale must be positive"),
        ((torch.zeros(2), torch.ones(3), -1.0), "lengthscale must be positive"),
        ((torch.zeros(2), torch.ones(3), math.nan), "lengthscale must be positive"),
        ((torch.zeros(2), torch.ones(3), torch.tensor(0.0)), "lengthscale must be positive"),
        ((torch.tensor([math.nan]), torch.ones(3), 1.0), "a contains NaN"),
        ((torch.zeros(2), torch.ones(3, dtype=torch.float64), 1.0), "b has dtype"),
        ((torch.zeros(2, 2), torch.ones(3, 3), 1.0), "do not broadcast: a \\(2,\\), b \\(3,\\)"),
        ((torch.zeros(4, 2), torch.ones(4, 3), torch.ones(3)), "do not broadcast"),
        ((torch.tensor(0.0), torch.ones(3), 1.0), "a must have shape"),
    ],
)
def test_squared_exponential_refuses_bad_arguments_naming_them(args, message):
    with pytest.raises(ValueError, match=message):
        squared_exponential(*args)
    with pytest.raises(TypeError, match="lengthscale must be a real number"):
        squared_exponential(torch.zeros(2), torch.ones(3), "1")


def test_gpn_kernel_refuses_bad_arguments_naming_them():
    x, w = torch.randn(3, 2), torch.randn(2, 4)
    with pytest.raises(ValueError, match="weight \\(3, 4\\) projects M = 3 inputs but x has 2"):
        gpn_kernel(x, None, torch.randn(3, 4))  # a raw matmul error before
    with pytest.raises(ValueError, match="x2 has 3 columns"):
        gpn_kernel(x, torch.randn(5, 3), w)
    with pytest.raises(ValueError, match="lengthscale must be positive"):
        gpn_kernel(x, None, w, 0.0)
    with pytest.raises(ValueError, match="lengthscale must be positive"):
        gpn_kernel(x, None, w, -torch.ones(4))  # NaN before
    with pytest.raises(ValueError, match="lengthscale and the units"):
        gpn_kernel(x, None, w, torch.ones(3))
    with pytest.raises(ValueError, match="x contains NaN"):
        gpn_kernel(torch.full((3, 2), math.nan), None, w)
    with pytest.raises(ValueError, match="x must have shape"):
        gpn_kernel(torch.randn(2), None, torch.randn(2))
    with pytest.raises(ValueError, match="weight has dtype"):
        gpn_kernel(x, None, w.double())
    with settings.validation(False):  # value checks follow the switch, shape checks do not
        assert torch.isnan(gpn_kernel(torch.full((3, 2), math.nan), None, w)).all()
        with pytest.raises(ValueError, match="projects M = 3"):
            gpn_kernel(x, None, torch.randn(3, 4))


def test_gpn_kernel_takes_batches_of_weights_and_lengthscales():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(5, 3, generator=g), torch.randn(4, 3, 2, generator=g)
    ls = torch.rand(4, 2, generator=g) + 0.5
    k = gpn_kernel(x, None, w, ls)
    assert k.shape == (4, 2, 5, 5)
    torch.testing.assert_close(k[1, 0], gpn_kernel(x, None, w[1, :, 0], ls[1, 0]))


def test_numpy_scalar_lengthscales_are_real_numbers():
    import numpy as np

    a, b = torch.randn(4, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    expected = squared_exponential(a, b, 0.5)
    assert torch.equal(squared_exponential(a, b, np.float32(0.5)), expected)
    assert torch.equal(squared_exponential(a, b, np.float64(0.5)), expected)
    x, w = torch.randn(4, 2, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    assert torch.equal(gpn_kernel(x, None, w, np.int64(2)), gpn_kernel(x, None, w, 2.0))
    with pytest.raises(TypeError, match="lengthscale must be a real number"):
        squared_exponential(a, b, np.bool_(True))


def test_gpn_kernel_refuses_a_lengthscale_that_adds_dimensions():
    """A [N, 1] lengthscale passed the broadcast check and returned [N, N, S, S]."""
    x, w = torch.randn(4, 2), torch.randn(2, 3)
    assert gpn_kernel(x, None, w, torch.ones(3)).shape == (3, 4, 4)
    assert gpn_kernel(x, None, w, torch.ones(1)).shape == (3, 4, 4)
    for lengthscale in (torch.ones(3, 1), torch.ones(7, 3)):
        with pytest.raises(ValueError, match="lengthscale .* must broadcast to the units"):
            gpn_kernel(x, None, w, lengthscale)
    batched = torch.randn(7, 2, 3)
    assert gpn_kernel(x, None, batched, torch.ones(7, 3)).shape == (7, 3, 4, 4)
