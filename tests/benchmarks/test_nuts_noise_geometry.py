"""The noise-geometry diagnostics of the ``[1, 4, 1]`` NUTS run fold only exact symmetries, and
their effective activation noise is the noise part of the collapsed activations' covariance."""

import numpy as np
import torch

from benchmarks.nuts_noise_geometry import activation_noise, fold, potential, problem


def _point(g):
    return {
        "W1": torch.randn(4, 1, generator=g, dtype=torch.float64),
        "W2": torch.randn(1, 4, generator=g, dtype=torch.float64),
        "sigma1": torch.randn(4, generator=g, dtype=torch.float64) - 2.5,
        "sigma2": torch.randn(1, generator=g, dtype=torch.float64) - 2.0,
        "Za2_train": torch.randn(54, generator=g, dtype=torch.float64),
    }


def test_fold_keeps_the_potential_and_matches_units():
    x, y = problem()
    pot = potential("whitened", x, y)
    g = torch.Generator().manual_seed(0)
    p = _point(g)
    # a copy in another symmetric position: units permuted, signs flipped, z negated
    perm = torch.tensor([3, 1, 0, 2])
    q = {
        "W1": -p["W1"][perm],
        "W2": p["W2"][:, perm] * torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64),
        "sigma1": p["sigma1"][perm],
        "sigma2": p["sigma2"],
        "Za2_train": -p["Za2_train"],
    }
    folded = fold(q, fold(p))
    for k, v in fold(p).items():
        torch.testing.assert_close(folded[k], v, rtol=0, atol=0)
    u = [float(pot(r)) for r in (p, q, folded)]
    assert abs(u[1] - u[0]) < 1e-9 * abs(u[0]) and abs(u[2] - u[0]) < 1e-9 * abs(u[0])
    # a different point is not folded onto p
    assert abs(float(pot(_point(g))) - u[0]) > 1e-3


def test_activation_noise_is_the_covariance_nugget():
    from pyro_gpn.kernels import gpn_kernel

    g = torch.Generator().manual_seed(1)
    p = _point(g)
    x = torch.linspace(-1, 1, 6, dtype=torch.float64)[:, None]
    w2, s1 = p["W2"][0], p["sigma1"].exp()
    kernel = gpn_kernel(x, None, p["W1"].mT, 1.0)  # [4, S, S]
    cov = (w2.square()[:, None, None] * (kernel + s1.square()[:, None, None] * torch.eye(6))).sum(0)
    smooth = (w2.square()[:, None, None] * kernel).sum(0)
    s_a = activation_noise(p["W2"].numpy()[None], s1.numpy()[None])[0]
    np.testing.assert_allclose((cov - smooth).numpy(), s_a**2 * np.eye(6), atol=1e-12)
