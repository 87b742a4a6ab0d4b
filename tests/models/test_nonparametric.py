"""Tests of the non-parametric GPN model: site shapes, the prior covariance of
eq:gpn_output_marginal, the train/test factorisation, and argument checks."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import Predictive

from pyro_gpn.kernels import gpn_kernel
from pyro_gpn.models.nonparametric import NonParametricGPN, conditional_rows, layer_cholesky

F64 = torch.float64


@pytest.fixture(autouse=True)
def _validation():
    pyro.enable_validation(True)
    pyro.set_rng_seed(0)
    yield


def _data(num_train: int = 6, num_test: int = 4, m: int = 2, n_out: int = 1):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(num_train, m, generator=g, dtype=F64)
    y = torch.randn(num_train, n_out, generator=g, dtype=F64).squeeze(-1)
    x_test = torch.randn(num_test, m, generator=g, dtype=F64)
    return x, y, x_test


def _sites(trace):
    return {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not name.startswith("units")
    }


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("with_test", [True, False])
def test_trace_sites_and_shapes(whiten, with_test):
    x, y, x_test = _data(m=2)
    gpn = NonParametricGPN([2, 3, 2, 1], whiten=whiten)
    trace = poutine.trace(gpn.model).get_trace(x, y, x_test if with_test else None)
    trace.compute_log_prob()
    sites = _sites(trace)
    prefix = "Z" if whiten else "X"
    want = {"W1": (3, 2), "sigma1": (3,), f"{prefix}1_train": (3, 6)}
    want |= {"W2": (2, 3), "sigma2": (2,), f"{prefix}2_train": (2, 6)}
    want |= {"W3": (1, 2), "sigma3": (1,), "y_train": (1, 6)}
    if with_test:
        want |= {f"{prefix}1_test": (3, 4), f"{prefix}2_test": (2, 4), "y_test": (1, 4)}
    assert {k: tuple(s["value"].shape) for k, s in sites.items()} == want
    assert [k for k, s in sites.items() if s["is_observed"]] == ["y_train"]
    assert torch.equal(sites["y_train"]["value"], y[None])
    assert all(s["value"].dtype == F64 for s in sites.values())
    assert torch.isfinite(trace.log_prob_sum())


def test_multi_output_targets_and_sampled_lengthscale():
    x, y, x_test = _data(m=1, n_out=2)
    gpn = NonParametricGPN([1, 2], lengthscale_prior=dist.LogNormal(0.0, 0.5), dtype=torch.float32)
    trace = poutine.trace(gpn.model).get_trace(x, y, x_test)
    sites = _sites(trace)
    assert sites["lengthscale1"]["value"].shape == (2,)
    assert torch.equal(sites["y_train"]["value"], y.float().mT)
    assert sites["y_test"]["value"].shape == (2, 4)
    assert sites["y_test"]["value"].dtype == torch.float32


def test_one_cholesky_factor_gives_the_joint_density():
    """log p(y_train) + log p(y_test | y_train) equals the joint MVN over all rows."""
    x, y, x_test = _data(m=2)
    gpn = NonParametricGPN([2, 1], jitter=0.0)
    weight, sigma = torch.tensor([[0.7, -1.3]], dtype=F64), torch.tensor([0.3], dtype=F64)
    model = poutine.condition(gpn.model, {"W1": weight, "sigma1": sigma})
    trace = poutine.trace(model).get_trace(x, y, x_test)
    y_test = trace.nodes["y_test"]["value"][0]
    x_all = torch.cat([x, x_test])
    cov = gpn_kernel(x_all, None, weight[0]) + sigma.square() * torch.eye(len(x_all), dtype=F64)
    joint = dist.MultivariateNormal(torch.zeros(len(x_all), dtype=F64), cov)
    got = sum(
        trace.nodes[k]["fn"].log_prob(trace.nodes[k]["value"]).sum() for k in ("y_train", "y_test")
    )
    torch.testing.assert_close(got, joint.log_prob(torch.cat([y, y_test])))


def test_conditional_rows_is_gp_regression():
    """eq:gp_f_reg_mean_var: mean K21 K11^-1 x1, covariance K22 - K21 K11^-1 K12."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(7, 7, generator=g, dtype=F64)
    cov = a @ a.mT + 0.1 * torch.eye(7, dtype=F64)
    x1 = torch.randn(4, generator=g, dtype=F64)
    loc, scale_tril = conditional_rows(torch.linalg.cholesky(cov), 4, x1)
    k11, k21, k22 = cov[:4, :4], cov[4:, :4], cov[4:, 4:]
    torch.testing.assert_close(loc, k21 @ torch.linalg.solve(k11, x1))
    torch.testing.assert_close(
        scale_tril @ scale_tril.mT, k22 - k21 @ torch.linalg.solve(k11, k21.mT)
    )


def _fixed_draws(gpn, params, x, x_test, sites, num=20000):
    """Draw ``sites`` from the prior with the global parameters fixed to ``params``."""
    fixed = {k: v.expand(num, *v.shape) for k, v in params.items()}
    draws = Predictive(gpn.model, posterior_samples=fixed, return_sites=sites, parallel=True)
    return draws(x, None, x_test)


def _empirical_cov(samples):
    """``[D, N, S]`` draws -> ``[N, S, S]`` covariance about zero (the model mean is zero)."""
    return torch.einsum("dni,dnj->nij", samples, samples) / samples.shape[0]


@pytest.mark.parametrize("layer", ["output", "hidden"])
def test_prior_covariance_of_a_unit(layer):
    """Outputs of unit n over all rows ~ N(0, K_w(X, X) + sigma_n^2 I) (eq:gpn_output_marginal)."""
    x, _, x_test = _data(num_train=5, num_test=3, m=2)
    x_all = torch.cat([x, x_test])
    weight = torch.tensor([[0.8, -0.5], [1.5, 0.3], [-0.2, 2.0]], dtype=F64)  # [N, M]
    sigma = torch.tensor([0.1, 0.5, 0.3], dtype=F64)
    if layer == "output":
        gpn = NonParametricGPN([2, 3])
        draws = _fixed_draws(gpn, {"W1": weight, "sigma1": sigma}, x, x_test, ["y_train", "y_test"])
        rows = torch.cat([draws["y_train"], draws["y_test"]], dim=-1)
    else:
        gpn = NonParametricGPN([2, 3, 1], whiten=False)
        draws = _fixed_draws(
            gpn, {"W1": weight, "sigma1": sigma}, x, x_test, ["X1_train", "X1_test"]
        )
        rows = torch.cat([draws["X1_train"], draws["X1_test"]], dim=-1)
    want = gpn_kernel(x_all, None, weight.mT) + sigma[:, None, None] ** 2 * torch.eye(8, dtype=F64)
    got = _empirical_cov(rows)
    # standard error of an empirical covariance entry <= sqrt(2 / 20000) = 0.01
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.0)
    torch.testing.assert_close(rows.mean(0), torch.zeros_like(rows[0]), atol=0.05, rtol=0.0)


def test_whitened_and_centred_parametrisations_agree():
    """Same prior over the network outputs whether hidden outputs are sampled as X or L Z."""
    x, _, x_test = _data(num_train=4, num_test=2, m=1)
    params = {
        "W1": torch.tensor([[1.2], [-0.7]], dtype=F64),
        "sigma1": torch.tensor([0.2, 0.4], dtype=F64),
        "W2": torch.tensor([[0.9, 1.1]], dtype=F64),
        "sigma2": torch.tensor([0.1], dtype=F64),
    }
    covs = []
    for whiten in (True, False):
        gpn = NonParametricGPN([1, 2, 1], whiten=whiten)
        draws = _fixed_draws(gpn, params, x, x_test, ["y_train", "y_test"])
        covs.append(_empirical_cov(torch.cat([draws["y_train"], draws["y_test"]], dim=-1)))
    torch.testing.assert_close(covs[0], covs[1], atol=0.05, rtol=0.0)


def test_layer_cholesky_reports_failure_as_nan():
    x = torch.zeros(3, 1, dtype=F64)  # identical rows: rank-one kernel matrix
    chol = layer_cholesky(
        x, torch.ones(2, 1, dtype=F64), torch.tensor([0.0, 0.5], dtype=F64), 1.0, 0.0
    )
    assert torch.isnan(chol[0]).all()
    torch.testing.assert_close(
        chol[1] @ chol[1].mT, torch.ones(3, 3, dtype=F64) + 0.25 * torch.eye(3, dtype=F64)
    )


def test_too_many_samples_raises():
    gpn = NonParametricGPN([1, 1], max_samples=10)
    x = torch.zeros(8, 1, dtype=F64)
    gpn.model(x, None, torch.zeros(2, 1, dtype=F64))  # 10 rows: fine
    with pytest.raises(ValueError, match="max_samples=10"):
        gpn.model(x, None, torch.zeros(3, 1, dtype=F64))
    with pytest.raises(ValueError, match="max_samples=500"):
        NonParametricGPN([1, 1]).model(torch.zeros(501, 1, dtype=F64))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((torch.zeros(4, 3), None, None), "x_train must have 2 columns"),
        ((torch.zeros(4), None, None), "x_train must have 2 dimensions"),
        ((torch.zeros(4, 2), torch.zeros(5), None), "y_train must have shape"),
        ((torch.zeros(4, 2), None, torch.zeros(2, 1)), "x_test must have 2 columns"),
        ((torch.full((4, 2), float("nan")), None, None), "x_train contains NaN"),
        ((torch.zeros(4, 2), torch.tensor([0.0, 1.0, float("inf"), 0.0]), None), "y_train"),
    ],
)
def test_bad_data_raises(args, match):
    with pytest.raises(ValueError, match=match):
        NonParametricGPN([2, 1]).model(*args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sizes": [3]}, "sizes"),
        ({"sizes": [2, 0, 1]}, "sizes"),
        ({"weight_scale": -1.0}, "weight_scale"),
        ({"lengthscale": 0.0}, "lengthscale"),
        ({"jitter": -1e-3}, "jitter"),
        ({"dtype": torch.int64}, "dtype"),
        ({"noise_prior": [dist.HalfNormal(1.0)]}, "noise_prior"),
        ({"noise_prior": 0.1}, "noise_prior"),
        (
            {"lengthscale_prior": dist.MultivariateNormal(torch.zeros(2), torch.eye(2))},
            "lengthscale_prior",
        ),
        ({"max_samples": 1}, "max_samples"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    kwargs = {"sizes": [2, 3, 1]} | kwargs
    with pytest.raises(ValueError, match=match):
        NonParametricGPN(**kwargs)
