"""Where NUTS starts: the noise's prior median, fits with held sites, the potential's Hessian,
and the default start's curvature (the fitted start that overfits, ``docs/results/nuts.md``)."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pyro.distributions as dist
import pytest
import scipy.stats
import torch

from pyro_gpn.data import synthetic_1d
from pyro_gpn.inference import nuts_setup
from pyro_gpn.inference.mcmc import INITS, run_nuts
from pyro_gpn.inference.nuts_setup import (
    fit_initial_params,
    hessian_diagonal_inverse_mass,
    laplace_inverse_mass,
    noise_prior_medians,
    potential_hessians,
)
from pyro_gpn.models.nonparametric import NonParametricGPN
from pyro_gpn.models.sampled_targets import SampledTargetsGPN

F64 = torch.float64


def _synthetic(n_train: int = 60):
    data = synthetic_1d(n_train, 10, seed=0)
    return data.x_train.double(), data.y_train.double()[:, 0]


def test_noise_prior_medians_default_and_custom_priors():
    x, _ = _synthetic(10)
    medians = noise_prior_medians(NonParametricGPN([1, 3, 1]), x)
    assert set(medians) == {"sigma1", "sigma2"}
    torch.testing.assert_close(medians["sigma1"], torch.full((3,), math.log(0.1), dtype=F64))
    # Gamma has no icdf in torch: the median of draws, against scipy's exact median
    gamma = dist.Gamma(torch.tensor(2.0, dtype=F64), torch.tensor(20.0, dtype=F64))
    medians = noise_prior_medians(NonParametricGPN([1, 2, 1], noise_prior=gamma), x)
    exact = scipy.stats.gamma(a=2.0, scale=1 / 20.0).median()
    assert abs(medians["sigma2"].exp().item() - exact) < 0.05 * exact
    half = dist.HalfNormal(torch.tensor(0.3, dtype=F64))
    medians = noise_prior_medians(SampledTargetsGPN([1, 2, 1], noise_prior=half), x)
    exact = scipy.stats.halfnorm(scale=0.3).median()
    torch.testing.assert_close(medians["sigma1"].exp(), torch.full((2,), exact, dtype=F64))


def test_fit_holds_the_held_sites_and_moves_the_rest():
    x, y = _synthetic(20)
    model = NonParametricGPN([1, 2, 1])
    held = noise_prior_medians(model, x)
    free = fit_initial_params(model, x, y, num_chains=2, steps=0, seed=3)
    fitted = fit_initial_params(model, x, y, num_chains=2, steps=30, seed=3, hold=held)
    for name, value in held.items():
        torch.testing.assert_close(fitted[name], value.expand(2, -1), rtol=0, atol=0)
    for name in ("W1", "W2", "Za2_train"):
        assert not torch.allclose(fitted[name], free[name])
    with pytest.raises(ValueError, match="hold"):
        fit_initial_params(model, x, y, num_chains=1, steps=1, hold={"sigma9": held["sigma1"]})


def test_best_fit_starts_every_chain_near_the_lowest_energy_fit():
    """``best=True``: the same fits as ``best=False`` (same seed), every chain started within
    ``spread`` of the one of lowest potential energy (computed here independently), the held
    sites at their held values, the chains' starts apart from each other."""
    from pyro.infer.mcmc.util import initialize_model

    x, y = _synthetic(30)
    model = SampledTargetsGPN([1, 2, 1], num_inducing=6)
    held = noise_prior_medians(model, x)
    kwargs = dict(num_chains=3, steps=40, seed=5, hold=held)
    fits = fit_initial_params(model, x, y, **kwargs)
    starts = fit_initial_params(model, x, y, best=True, spread=0.05, **kwargs)
    _, potential_fn, _, _ = initialize_model(model.model, (x, y, None))
    with torch.no_grad():
        energies = [float(potential_fn({k: v[c] for k, v in fits.items()})) for c in range(3)]
    assert len({round(e, 6) for e in energies}) == 3  # the fits differ: the choice matters
    pick = min(range(3), key=energies.__getitem__)
    for name, value in starts.items():
        assert value.shape == fits[name].shape
        if name in held:
            torch.testing.assert_close(value, held[name].expand_as(value), rtol=0, atol=0)
            continue
        offset = value - fits[name][pick]
        assert offset.abs().max() <= 0.05
        assert offset.abs().max() > 0.01  # jittered ...
        assert not torch.equal(value[0], value[1])  # ... each chain on its own
    again = fit_initial_params(model, x, y, best=True, spread=0.05, **kwargs)
    for name, value in starts.items():  # the jitter is seeded too
        torch.testing.assert_close(again[name], value, rtol=0, atol=0)
    for bad in (-0.1, math.inf, math.nan, True, "0.1"):
        with pytest.raises(ValueError, match="spread"):
            fit_initial_params(model, x, y, num_chains=1, steps=1, best=True, spread=bad)
    with pytest.raises(ValueError, match="best"):
        fit_initial_params(model, x, y, num_chains=1, steps=1, best="yes")


def test_best_fit_raises_when_no_fit_is_finite(monkeypatch):
    import pyro.infer.mcmc.util as mcmc_util

    real = mcmc_util.initialize_model

    def nan_potential(*args, **kwargs):
        init, potential_fn, transforms, trace = real(*args, **kwargs)
        return init, lambda params: potential_fn(params) * math.nan, transforms, trace

    monkeypatch.setattr(mcmc_util, "initialize_model", nan_potential)
    x, y = _synthetic(10)
    model = SampledTargetsGPN([1, 1], num_inducing=4)
    starts = fit_initial_params(model, x, y, num_chains=2, steps=3)  # the default: no choice
    assert set(starts) == {"W1", "z1", "sigma1"}
    with pytest.raises(FloatingPointError, match="finite"):
        fit_initial_params(model, x, y, num_chains=2, steps=3, best=True)


@pytest.mark.parametrize("init", ["best-fit-prior-noise", "fit-prior-noise", "fit"])
def test_run_nuts_passes_the_start_options_to_the_fits(init, monkeypatch):
    import pyro_gpn.inference.mcmc as mcmc

    seen = {}
    real = mcmc.fit_initial_params

    def recording(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(mcmc, "fit_initial_params", recording)
    x, y = _synthetic(20)
    result = run_nuts(
        SampledTargetsGPN([1, 1], num_inducing=5), x, y, x[:4], num_samples=5, warmup_steps=5,
        num_chains=2, init=init, init_steps=10, check_convergence=False,
    )  # fmt: skip
    assert seen["best"] is (init == "best-fit-prior-noise")
    assert (seen["hold"] is None) is (init == "fit")
    if seen["hold"] is not None:
        assert set(seen["hold"]) == {"sigma1"}
    assert result.y_test.shape[:2] == (10, 4)
    assert torch.isfinite(result.y_test).all()


def test_potential_hessian_matches_finite_differences_of_the_gradient():
    from pyro.infer.mcmc.util import initialize_model

    x, y = _synthetic(12)
    model = NonParametricGPN([1, 2, 1])
    params = fit_initial_params(model, x, y, num_chains=1, steps=5, seed=1)
    (hess,) = potential_hessians(model, x, y, None, params)
    _, potential_fn, _, _ = initialize_model(model.model, (x, y, None))
    names = sorted(params)
    shapes = [params[k].shape[1:] for k in names]
    flat = torch.cat([params[k][0].reshape(-1) for k in names])

    def grad(v):
        v = v.clone().requires_grad_()
        parts = torch.split(v, [math.prod(s) for s in shapes])
        energy = potential_fn({k: p.reshape(s) for k, p, s in zip(names, parts, shapes)})
        return torch.autograd.grad(energy, v)[0]

    h = 1e-5
    columns = [(grad(flat + h * e) - grad(flat - h * e)) / (2 * h) for e in torch.eye(len(flat))]
    numeric = torch.stack(columns, dim=1)
    torch.testing.assert_close(hess, 0.5 * (numeric + numeric.T), rtol=1e-4, atol=1e-4)


def test_hessian_diagonal_metric_is_the_inverse_curvature_per_site():
    """Per site and chain, ``1 / max(H_ii, 1)`` of each chain's own Hessian (the sites' order
    and the chains kept apart), with the data-pinned coordinates far narrower than the prior."""
    x, y = _synthetic(220)
    model = SampledTargetsGPN([1, 3, 1], num_inducing=6)
    params = fit_initial_params(model, x, y, num_chains=2, steps=100, seed=0)
    metrics = hessian_diagonal_inverse_mass(model, x, y, None, params)
    hessians = potential_hessians(model, x, y, None, params)
    names = sorted(params)
    for c in range(2):
        diag = torch.cat([metrics[c][k] for k in names])
        torch.testing.assert_close(diag, 1 / hessians[c].diagonal().clamp_min(1.0))
        assert set(metrics[c]) == set(params)
        assert all(metrics[c][k].numel() == params[k][c].numel() for k in names)
    assert not torch.equal(metrics[0]["W1"], metrics[1]["W1"])
    everything = torch.cat([m[k] for m in metrics for k in names])
    assert everything.min() < 0.01  # the ~200 rows pin some coordinates far below the prior
    assert (torch.cat([m[k] for m in metrics for k in names]) <= 1.0).all()


def test_default_start_does_not_overfit_the_noise():
    """The default start (``init="fit-prior-noise"``) holds the noise at its prior median; the
    full MAP fit (``init="fit"``) shrinks the output noise far below the data's (0.1) and puts
    the start where the potential's curvature is ~30x larger (measured: 271,132 against 7,890,
    ``docs/results/nuts.md``)."""
    assert inspect.signature(run_nuts).parameters["init"].default == "fit-prior-noise"
    assert INITS[0] == "fit-prior-noise"
    x, y = _synthetic(60)
    model = NonParametricGPN([1, 4, 1])
    held = noise_prior_medians(model, x)
    default = fit_initial_params(model, x, y, num_chains=1, steps=500, seed=0, hold=held)
    overfit = fit_initial_params(model, x, y, num_chains=1, steps=500, seed=0)
    assert default["sigma2"].exp().min() >= 0.1 * (1 - 1e-12)
    assert overfit["sigma2"].exp().max() < 0.05  # what the default avoids
    (h_default,) = potential_hessians(model, x, y, None, default)
    (h_overfit,) = potential_hessians(model, x, y, None, overfit)
    top_default = torch.linalg.eigvalsh(h_default)[-1]
    top_overfit = torch.linalg.eigvalsh(h_overfit)[-1]
    assert top_default < 2e4
    assert top_overfit > 10 * top_default


def test_laplace_metric_is_the_inverse_of_the_clamped_hessian(monkeypatch):
    """Per chain, ``V diag(1 / max(lambda_i, min_curvature)) V^T`` of its Hessian
    ``V diag(lambda) V^T`` (NumPy): the inverse where the curvature exceeds the floor, the
    floor's scale along flat and negatively curved directions (not a flipped curvature)."""
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    evals = np.array([-3.0, 0.2, 4.0, 50.0])
    hessians = [
        torch.tensor(basis @ np.diag(evals) @ basis.T, dtype=F64),
        7.0 * torch.eye(4, dtype=F64),
    ]
    monkeypatch.setattr(nuts_setup, "potential_hessians", lambda *args: hessians)
    for floor in (1.0, 0.1):
        first, second = laplace_inverse_mass(None, None, None, None, {}, min_curvature=floor)
        want = basis @ np.diag(1 / np.maximum(evals, floor)) @ basis.T
        np.testing.assert_allclose(first.numpy(), want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(second.numpy(), np.eye(4) / 7.0, rtol=1e-12)


@pytest.mark.parametrize("entry", [math.nan, math.inf])
def test_laplace_metric_of_a_non_finite_hessian_is_the_identity(monkeypatch, entry):
    """A start where the potential is not finite has a non-finite Hessian (every entry NaN,
    or some infinite): its chain falls back to the identity metric instead of failing in the
    eigendecomposition (torch's ``eigh`` raises on an all-NaN matrix)."""
    whole = torch.full((3, 3), entry, dtype=F64)
    some = torch.eye(3, dtype=F64)
    some[0, 1] = some[1, 0] = entry
    monkeypatch.setattr(nuts_setup, "potential_hessians", lambda *args: [whole, some])
    for metric in laplace_inverse_mass(None, None, None, None, {}):
        torch.testing.assert_close(metric, torch.eye(3, dtype=F64), rtol=0, atol=0)


def test_fit_starts_are_uniform_within_the_radius():
    """With no Adam step the starts are the uniform draws themselves: inside ``(-radius,
    radius)`` on every coordinate, spread over the whole interval (a Kolmogorov-Smirnov test
    against ``U(-radius, radius)``, scipy), not ``(0, radius)`` nor a fixed width."""
    x, y = _synthetic(10)
    starts = fit_initial_params(
        NonParametricGPN([1, 2, 1]), x, y, num_chains=8, steps=0, radius=0.5, seed=1
    )
    values = torch.cat([v.reshape(-1) for v in starts.values()]).numpy()
    assert abs(values).max() < 0.5 and values.min() < -0.4 and values.max() > 0.4
    assert scipy.stats.kstest(values, scipy.stats.uniform(-0.5, 1.0).cdf).pvalue > 0.01
