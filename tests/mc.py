"""Monte Carlo helpers shared by the tests: compare closed forms with sample averages."""

from __future__ import annotations

import torch
from torch import Tensor


def assert_mc_mean(
    samples: Tensor, expected: Tensor, dim: int = 0, n_se: float = 5.0, atol: float = 1e-8
):
    """Assert ``samples.mean(dim)`` agrees with ``expected`` within ``n_se`` standard errors."""
    n = samples.shape[dim]
    mean = samples.mean(dim)
    se = samples.std(dim) / n**0.5
    err = (mean - expected).abs()
    bad = err > n_se * se + atol
    assert not bool(bad.any()), (
        f"Monte Carlo disagreement: max |err| / se = {(err / (se + atol)).max().item():.2f} "
        f"(max |err| {err.max().item():.3g})"
    )


def assert_mc_variance(
    samples: Tensor, expected: Tensor, dim: int = 0, n_se: float = 5.0, atol: float = 1e-8
):
    """Assert the sample variance along ``dim`` agrees with ``expected`` within ``n_se`` SE.

    The standard error of the variance estimate is taken from the fourth central moment.
    """
    n = samples.shape[dim]
    centred = samples - samples.mean(dim, keepdim=True)
    sq = centred.square()
    assert_mc_mean(sq * n / (n - 1), expected, dim=dim, n_se=n_se, atol=atol)


def assert_mcmc_mean(
    draws: Tensor, expected: Tensor, n_se: float = 4.0, min_ess: float = 0.0, name: str = ""
) -> Tensor:
    """Assert the mean of Markov-chain draws ``[chains, draws, *shape]`` agrees with
    ``expected [*shape]`` within ``n_se`` Monte Carlo standard errors, elementwise.

    The standard errors are ArviZ's ``mcse(method="mean")``, from each element's effective sample
    size across the chains, not from the number of draws (which would overstate the precision of
    autocorrelated draws). ``min_ess``: the ESS of the mean (the one the mcse uses) every element
    must reach, so that the tolerance cannot widen unnoticed when the chains mix worse. Returns
    ``|error| / mcse``.
    """
    mean, mcse, ess = _mcmc_mean_and_mcse(draws)
    err = (mean - expected.double().reshape(-1)).abs()
    z = err / mcse
    _assert_within_mcse(
        z, ess, err, n_se, min_ess, f"{name}: " if name else "", "MCMC disagreement"
    )
    return z.reshape(draws.shape[2:])


def _assert_within_mcse(
    z: Tensor, ess: Tensor, err: Tensor, n_se: float, min_ess: float, label: str, failure: str
) -> None:
    """The ESS floor first (so that a worse-mixing run cannot pass on a wider tolerance), then
    ``z = |err| / mcse <= n_se`` elementwise."""
    assert bool((ess >= min_ess).all()), (
        f"{label}ESS of the mean {ess.min().item():.0f} < {min_ess}"
    )
    assert not bool((z > n_se).any()), (
        f"{label}{failure}: max |err| / mcse = {z.max().item():.2f} "
        f"(max |err| {err.max().item():.3g}, ESS of the mean >= {ess.min().item():.0f})"
    )


def _mcmc_mean_and_mcse(draws: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Mean, ArviZ ``mcse(method="mean")`` and ESS of the mean of ``draws [chains, draws, *shape]``,
    each flattened over ``shape``."""
    import arviz as az

    values = draws.detach().cpu().double().numpy()
    dataset = az.convert_to_dataset(values.reshape(*values.shape[:2], -1))
    mcse = torch.as_tensor(az.mcse(dataset, method="mean")["x"].values)
    ess = torch.as_tensor(az.ess(dataset, method="mean")["x"].values)
    return draws.double().mean((0, 1)).reshape(-1), mcse, ess


def mcmc_runs_difference(draws_a: Tensor, draws_b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Two independent Markov-chain runs ``[chains, draws, *shape]`` (the same ``shape``):
    ``|mean_a - mean_b| / sqrt(mcse_a^2 + mcse_b^2)`` (ArviZ's mcse of each run from its own
    chains' ESS; the runs are independent, so their errors add in quadrature), the smaller of
    the two runs' ESS of the mean and ``|mean_a - mean_b|``, each flattened over ``shape``."""
    assert draws_a.shape[2:] == draws_b.shape[2:], (
        f"runs of different shapes: {tuple(draws_a.shape)} and {tuple(draws_b.shape)}"
    )
    mean_a, mcse_a, ess_a = _mcmc_mean_and_mcse(draws_a)
    mean_b, mcse_b, ess_b = _mcmc_mean_and_mcse(draws_b)
    difference = (mean_a - mean_b).abs()
    z = difference / (mcse_a.square() + mcse_b.square()).sqrt()
    return z, torch.minimum(ess_a, ess_b), difference


def assert_mcmc_runs_agree(
    draws_a: Tensor, draws_b: Tensor, n_se: float = 4.0, min_ess: float = 0.0, name: str = ""
) -> Tensor:
    """Assert two independent Markov-chain runs ``[chains, draws, *shape]`` estimate the same
    mean, elementwise, within ``n_se`` combined Monte Carlo standard errors
    (:func:`mcmc_runs_difference`). ``min_ess``: the ESS of the mean every element must reach in
    each run, checked first, so that a run that mixes worse cannot pass by widening the
    tolerance. Returns ``|difference| / combined mcse``."""
    z, ess, difference = mcmc_runs_difference(draws_a, draws_b)
    _assert_within_mcse(
        z, ess, difference, n_se, min_ess, f"{name}: " if name else "", "runs disagree"
    )
    return z.reshape(draws_a.shape[2:])


def assert_mc_covariance(samples: Tensor, expected: Tensor, n_se: float = 5.0, atol: float = 1e-8):
    """``samples [K, S, N]``, ``expected [S, N, N]``: sample covariance within ``n_se`` SE."""
    n = samples.shape[0]
    centred = samples - samples.mean(0, keepdim=True)
    products = centred.unsqueeze(-1) * centred.unsqueeze(-2) * n / (n - 1)
    assert_mc_mean(products, expected, dim=0, n_se=n_se, atol=atol)


def random_covariance(
    batch: int, size: int, dtype=torch.float64, scale: float = 0.5, generator=None
) -> Tensor:
    a = torch.randn(batch, size, size, dtype=dtype, generator=generator) * scale / size**0.5
    return a @ a.mT + 0.05 * scale * torch.eye(size, dtype=dtype)
