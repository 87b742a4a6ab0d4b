import torch

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
