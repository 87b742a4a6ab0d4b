"""Tests of the non-parametric GPN model: site shapes, the prior covariance of
eq:gpn_output_marginal, the train/test factorisation, the exactness of the collapsed last hidden
layer and of the integrated last layer, the leave-one-out terms, classification, and argument
checks."""

from __future__ import annotations

import math

import numpy as np
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
    gpn = NonParametricGPN([2, 3, 2, 1], whiten=whiten, collapse=False)
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


def _hand_kernel(x, w, lengthscale):
    """k_w(x, x') = exp(-[sum_m w_m (x_m - x'_m)]^2 / (2 lambda^2)) (eq:gpn_cov_fn) for one unit
    ``w [M]``, written out over every pair of rows."""
    proj = ((x[:, None, :] - x[None, :, :]) * w).sum(-1)
    return torch.exp(-0.5 * proj.square() / lengthscale**2)


@pytest.mark.parametrize("how", ["fixed", "sampled"])
def test_lengthscale_sets_the_output_density(how):
    """A lengthscale other than 1, fixed (``lengthscale=0.6``) or a conditioned
    ``lengthscale1`` site (one per unit, 0.6 and 1.7): log p(y_train) of each output is
    N(0, K_w(X, X) + (sigma^2 + jitter) I) with the kernel at that unit's lengthscale."""
    x, y, _ = _data(num_train=6, m=2, n_out=2)
    weight = torch.tensor([[0.7, -1.3], [1.1, 0.4]], dtype=F64)
    sigma = torch.tensor([0.3, 0.5], dtype=F64)
    values = {"W1": weight, "sigma1": sigma}
    if how == "fixed":
        gpn = NonParametricGPN([2, 2], lengthscale=0.6)
        scales = torch.tensor([0.6, 0.6], dtype=F64)
    else:
        prior = dist.LogNormal(torch.tensor(0.0, dtype=F64), torch.tensor(0.5, dtype=F64))
        gpn = NonParametricGPN([2, 2], lengthscale_prior=prior)
        scales = torch.tensor([0.6, 1.7], dtype=F64)
        values["lengthscale1"] = scales
    trace = poutine.trace(poutine.condition(gpn.model, values)).get_trace(x, y)
    if how == "sampled":
        assert torch.equal(trace.nodes["lengthscale1"]["value"], scales)
    site = trace.nodes["y_train"]
    got = site["fn"].log_prob(site["value"])  # [N_L]
    assert got.shape == (2,)
    eye = torch.eye(6, dtype=F64)
    for n in range(2):
        cov = _hand_kernel(x, weight[n], scales[n]) + (sigma[n] ** 2 + gpn.jitter) * eye
        want = dist.MultivariateNormal(torch.zeros(6, dtype=F64), cov).log_prob(y[:, n])
        torch.testing.assert_close(got[n], want)


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
        gpn = NonParametricGPN([2, 3, 1], whiten=False, collapse=False)
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
        gpn = NonParametricGPN([1, 2, 1], whiten=whiten, collapse=False)
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


def _collapsed_sites(whiten: bool, with_test: bool) -> dict:
    x, y, x_test = _data(m=2)
    gpn = NonParametricGPN([2, 3, 2, 1], whiten=whiten)
    trace = poutine.trace(gpn.model).get_trace(x, y, x_test if with_test else None)
    trace.compute_log_prob()
    assert torch.isfinite(trace.log_prob_sum())
    return {k: tuple(s["value"].shape) for k, s in _sites(trace).items()}


@pytest.mark.parametrize("whiten", [True, False])
def test_collapsed_sites_replace_the_last_hidden_layer(whiten):
    """collapse=True (default): the last hidden layer's outputs give way to the last layer's
    activations, one per row and output unit."""
    p = "Za3" if whiten else "A3"
    want = {"W1": (3, 2), "sigma1": (3,), ("Z1_train" if whiten else "X1_train"): (3, 6)}
    want |= {"W2": (2, 3), "sigma2": (2,), "W3": (1, 2), f"{p}_train": (6,), "sigma3": (1,)}
    want |= {"y_train": (1, 6)}
    assert _collapsed_sites(whiten, False) == want
    with_test = _collapsed_sites(whiten, True)
    assert with_test[f"{p}_test"] == (4,) and with_test["y_test"] == (1, 4)


def _log_evidence_collapsed(gpn, params, x, y, grid):
    """log p(y | theta) of a [1, N, 1] network on two rows by 2-D quadrature over the two
    activations of the collapsed model (a Gaussian in A, then the output layer's MVN)."""
    model = poutine.condition(gpn.model, params)
    nodes, weights = np.polynomial.hermite_e.hermegauss(grid)
    nodes, weights = torch.as_tensor(nodes), torch.as_tensor(weights / math.sqrt(2 * math.pi))
    z = torch.stack(torch.meshgrid(nodes, nodes, indexing="ij"), -1).reshape(-1, 2)
    w = (weights[:, None] * weights[None, :]).reshape(-1)
    terms = []
    for zi in z:  # whitened activations: A = L z with z ~ N(0, I) exactly
        trace = poutine.trace(poutine.condition(model, {"Za2_train": zi})).get_trace(x, y)
        terms.append(trace.nodes["y_train"]["fn"].log_prob(trace.nodes["y_train"]["value"]).sum())
    return torch.logsumexp(torch.stack(terms) + w.log(), 0)


def test_collapsed_last_hidden_layer_is_exact():
    """p(y | theta) is the same whether the hidden outputs X^1 (4 dimensions here) or the
    activations A^2 = X^1 W^2 (2 dimensions) are integrated: quadrature of the collapsed model
    against a Monte Carlo average over X^1 of the uncollapsed one (standard error < 0.3 %)."""
    x = torch.tensor([[-0.4], [0.9]], dtype=F64)
    y = torch.tensor([0.3, -0.5], dtype=F64)
    params = {
        "W1": torch.tensor([[1.3], [-0.6]], dtype=F64),
        "sigma1": torch.tensor([0.3, 0.2], dtype=F64),
        "W2": torch.tensor([[0.8, 1.4]], dtype=F64),
        "sigma2": torch.tensor([0.25], dtype=F64),
    }
    quad = _log_evidence_collapsed(NonParametricGPN([1, 2, 1]), params, x, y, 40)
    full = NonParametricGPN([1, 2, 1], collapse=False)
    num = 200_000
    fixed = {k: v.expand(num, *v.shape) for k, v in params.items()}
    trace = Predictive(
        full.model, posterior_samples=fixed, parallel=True, return_sites=[]
    ).get_vectorized_trace(x, y)
    log_lik = trace.nodes["y_train"]["fn"].log_prob(trace.nodes["y_train"]["value"]).reshape(num)
    mc = torch.logsumexp(log_lik, 0) - math.log(num)
    assert abs(float(mc - quad)) < 0.01, (float(mc), float(quad))


def test_integrated_last_layer_matches_its_latent_function():
    """The Gaussian last layer is integrated in closed form. With its latent function values F
    explicit, p(y) = p(y | F) p(F) / p(F | y) for every F (the identity of Bayes' rule): the
    model's MVN log density equals that ratio at random F, built from the un-marginalised
    pieces (F ~ N(0, K), y | F ~ N(F, sigma^2 I))."""
    x, y, _ = _data(num_train=5, m=2)
    gpn = NonParametricGPN([2, 1], jitter=1e-3)
    weight, sigma = torch.tensor([[2.5, -1.7]], dtype=F64), torch.tensor([0.35], dtype=F64)
    trace = poutine.trace(poutine.condition(gpn.model, {"W1": weight, "sigma1": sigma})).get_trace(
        x, y
    )
    marginal = trace.nodes["y_train"]["fn"].log_prob(trace.nodes["y_train"]["value"]).sum()
    k = gpn_kernel(x, None, weight[0]) + 1e-3 * torch.eye(5, dtype=F64)  # the model's jitter
    noise = sigma.square() * torch.eye(5, dtype=F64)
    prior = dist.MultivariateNormal(torch.zeros(5, dtype=F64), k)
    post_cov = k - k @ torch.linalg.solve(k + noise, k)
    post_mean = k @ torch.linalg.solve(k + noise, y)
    posterior = dist.MultivariateNormal(post_mean, post_cov)
    for seed in range(3):
        f = torch.randn(5, generator=torch.Generator().manual_seed(seed), dtype=F64) * 0.3
        f = post_mean + f
        joint = dist.Normal(f, sigma).log_prob(y).sum() + prior.log_prob(f)
        torch.testing.assert_close(joint - posterior.log_prob(f), marginal, rtol=0, atol=1e-5)


@pytest.mark.parametrize("n_out", [1, 2])
def test_pointwise_log_likelihood_is_leave_one_out(n_out):
    """Regression terms are log p(y_s | y_-s, theta) of the marginal MVN: log p(y) minus the
    log density of y without row s, summed over the outputs (each its own MVN)."""
    x, y, _ = _data(num_train=6, m=2, n_out=n_out)
    gpn = NonParametricGPN([2, n_out])
    samples = {
        "W1": torch.tensor([[[0.9, -0.4], [-1.1, 0.5]], [[0.3, 1.2], [0.8, 0.7]]], dtype=F64)[
            :, :n_out
        ],
        "sigma1": torch.tensor([[0.35, 0.2], [0.6, 0.45]], dtype=F64)[:, :n_out],
    }
    terms = gpn.pointwise_log_likelihood(samples, x, y)
    assert terms.shape == (2, 6)
    ys = y.reshape(6, n_out)
    for d in range(2):
        want = torch.zeros(6, dtype=F64)
        for n in range(n_out):
            w, s = samples["W1"][d, n], samples["sigma1"][d, n]
            cov = _hand_kernel(x, w, 1.0) + (s.square() + gpn.jitter) * torch.eye(6, dtype=F64)
            full = dist.MultivariateNormal(torch.zeros(6, dtype=F64), cov).log_prob(ys[:, n])
            for row in range(6):
                keep = [i for i in range(6) if i != row]
                rest = dist.MultivariateNormal(
                    torch.zeros(5, dtype=F64), cov[keep][:, keep]
                ).log_prob(ys[keep, n])
                want[row] += full - rest
        torch.testing.assert_close(terms[d], want)


@pytest.mark.parametrize("likelihood", ["bernoulli", "categorical"])
def test_classification_sites(likelihood):
    x, _, x_test = _data(m=2)
    n_out = 1 if likelihood == "bernoulli" else 3
    labels = torch.tensor([0, 1, 0, 1, 1, 0]) if n_out == 1 else torch.tensor([0, 2, 1, 2, 1, 0])
    gpn = NonParametricGPN([2, 3, n_out], likelihood=likelihood)
    trace = poutine.trace(gpn.model).get_trace(x, labels, x_test)
    trace.compute_log_prob()
    sites = {k: tuple(s["value"].shape) for k, s in _sites(trace).items()}
    # no output noise: the latent function is the last layer's (whitened) output
    assert "sigma2" not in sites and sites["Z2_train"] == (n_out, 6)
    assert sites["y_train"] == (6,) and sites["y_test"] == (4,)
    probs = trace.nodes["p_test"]["value"]
    assert probs.shape == (4, 2 if n_out == 1 else 3)
    torch.testing.assert_close(probs.sum(-1), torch.ones(4, dtype=F64))
    assert torch.isfinite(trace.log_prob_sum())
    with pytest.raises(ValueError, match="y_train must hold integer class labels"):
        gpn.model(x, labels + 5)


@pytest.mark.parametrize("whiten", [True, False])
def test_vectorised_predictive_matches_draw_by_draw(whiten):
    """Predictive(parallel=True) over several draws (as run_nuts and NUTSResult use it) gives
    each draw the densities of a trace of that draw alone; the centred collapsed sites once got
    a [D, D] batch here."""
    x, y, x_test = _data(m=2)
    gpn = NonParametricGPN([2, 3, 1], whiten=whiten)
    draws = Predictive(gpn.model, num_samples=3)(x, y)
    post = {k: v for k, v in draws.items() if k != "y_train"}
    site = "Za2_test" if whiten else "A2_test"
    trace = Predictive(
        gpn.model, posterior_samples=post, parallel=True, return_sites=[]
    ).get_vectorized_trace(x, y, x_test)
    values = {k: trace.nodes[k]["value"] for k in [*post, site, "y_test"]}
    vec = trace.nodes[site]["fn"].log_prob(values[site]).reshape(-1)
    vec_y = trace.nodes["y_test"]["fn"].log_prob(values["y_test"]).reshape(-1)
    assert vec.shape == vec_y.shape == (3,)
    shapes = {
        k: s["value"].shape
        for k, s in _sites(poutine.trace(gpn.model).get_trace(x, y, x_test)).items()
    }
    for d in range(3):
        one = {k: v[d].reshape(shapes[k]) for k, v in values.items()}
        single = poutine.trace(poutine.condition(gpn.model, data=one)).get_trace(x, y, x_test)
        got = single.nodes[site]["fn"].log_prob(single.nodes[site]["value"]).sum()
        torch.testing.assert_close(vec[d], got)
        got_y = single.nodes["y_test"]["fn"].log_prob(single.nodes["y_test"]["value"]).sum()
        torch.testing.assert_close(vec_y[d], got_y)


def _random_parameters(sizes, num_test, generator):
    """Random values of a ``[M, N, D]`` network's parameter sites (and ``y_test``), float64,
    for density comparisons at points away from any fit."""
    m, width, n_out = sizes
    g = generator
    return {
        "W1": torch.randn(width, m, generator=g, dtype=F64),
        "sigma1": 0.05 + torch.rand(width, generator=g, dtype=F64),
        "W2": torch.randn(n_out, width, generator=g, dtype=F64),
        "sigma2": 0.05 + torch.rand(n_out, generator=g, dtype=F64),
        "y_test": torch.randn(n_out, num_test, generator=g, dtype=F64),
    }


@pytest.mark.parametrize("sizes", [[1, 3, 1], [2, 3, 2]])
def test_centred_and_whitened_activations_are_one_density(sizes):
    """``activations="centred"`` samples ``A`` where ``"whitened"`` samples ``z`` with ``A = L z``
    (``L`` the Cholesky factor of the activations' covariance given the parameters): the joint
    densities must agree after the change of variables, ``log p_c(theta, L z) + log|det L| =
    log p_w(theta, z)``, at random points -- train and test rows, observed and predicted
    outputs -- so that both parametrisations have the same posterior of every model quantity."""
    from pyro_gpn.models.gp_rows import activation_cholesky

    x, _, x_test = _data(num_train=5, num_test=3, m=sizes[0])
    g = torch.Generator().manual_seed(11)
    n_out = sizes[-1]
    y = torch.randn(5, n_out, generator=g, dtype=F64).squeeze(-1)
    for _ in range(3):
        params = _random_parameters(sizes, num_test=3, generator=g)
        z = torch.randn(8 * n_out, generator=g, dtype=F64)
        gpn_w = NonParametricGPN(sizes, activations="whitened")
        gpn_c = NonParametricGPN(sizes, activations="centred")
        chol = activation_cholesky(
            torch.cat([x, x_test]), params["W1"], params["sigma1"], 1.0, params["W2"], gpn_w.jitter
        )
        a = chol @ z
        n = 5 * n_out
        white = {**params, "Za2_train": z[:n], "Za2_test": z[n:]}
        centred = {**params, "A2_train": a[:n], "A2_test": a[n:]}
        logp = []
        for gpn, values in ((gpn_w, white), (gpn_c, centred)):
            trace = poutine.trace(poutine.condition(gpn.model, values)).get_trace(x, y, x_test)
            assert set(values) <= set(_sites(trace))
            logp.append(trace.log_prob_sum())
        log_det = chol.diagonal().log().sum()
        torch.testing.assert_close(logp[1] + log_det, logp[0], rtol=0.0, atol=1e-8)
        # and the change of variables matters: without the Jacobian they differ
        assert abs(float(logp[1] - logp[0])) > 1.0


def test_activations_argument_is_checked():
    with pytest.raises(ValueError, match="activations"):
        NonParametricGPN([1, 3, 1], activations="white")
    assert NonParametricGPN([1, 3, 1], whiten=False).activations == "centred"


def test_activation_sites():
    assert NonParametricGPN([1, 3, 1]).activation_sites() == ["Za2_train"]
    gpn = NonParametricGPN([2, 3, 2, 1], activations="centred")
    assert gpn.activation_sites(with_test=True) == ["A3_train", "A3_test"]
    assert NonParametricGPN([1, 3, 1], collapse=False).activation_sites() == []
    assert NonParametricGPN([1, 1]).activation_sites() == []


@pytest.mark.parametrize("sizes", [[1, 3, 1], [2, 3, 2]])
def test_likelihood_informed_activations_are_the_centred_density(sizes):
    """``activations="likelihood-informed"`` samples ``e`` with ``A = L M^{-T}(e + c)`` on the
    training rows (whitened test rows). Against the centred density and an autograd Jacobian of
    the map ``e -> A`` (read from the deterministic site ``A2``, not from the model's own log
    determinant): ``log p_i(theta, e) = log p_c(theta, A(e)) + log|det dA/de|`` to 1e-8 at random
    points, with anchors far from the activations and large curvature weights, so that the mean
    shift and the Jacobian factor both matter."""
    x, _, x_test = _data(num_train=5, num_test=3, m=sizes[0])
    g = torch.Generator().manual_seed(12)
    n_out = sizes[-1]
    y = torch.randn(5, n_out, generator=g, dtype=F64).squeeze(-1)
    n, n_all = 5 * n_out, 8 * n_out
    for _ in range(3):
        params = _random_parameters(sizes, num_test=3, generator=g)
        gpn_i = NonParametricGPN(sizes, activations="likelihood-informed")
        gpn_i.set_activation_anchor(
            2 * torch.randn(5, n_out, generator=g, dtype=F64),
            0.5 + 5 * torch.rand(5, n_out, generator=g, dtype=F64),
        )
        gpn_c = NonParametricGPN(sizes, activations="centred")
        e = torch.randn(n_all, generator=g, dtype=F64)

        def trace_of(e_all, params=params, gpn_i=gpn_i):
            values = {**params, "Ea2_train": e_all[:n], "Ea2_test": e_all[n:]}
            return poutine.trace(poutine.condition(gpn_i.model, values)).get_trace(x, y, x_test)

        def activations(e_all, trace_of=trace_of):
            return trace_of(e_all).nodes["A2"]["value"].reshape(-1)

        trace = trace_of(e)
        a = activations(e)
        jac = torch.autograd.functional.jacobian(activations, e)
        log_det = torch.linalg.slogdet(jac)[1]
        centred = {**params, "A2_train": a[:n], "A2_test": a[n:]}
        trace_c = poutine.trace(poutine.condition(gpn_c.model, centred)).get_trace(x, y, x_test)
        torch.testing.assert_close(
            trace.log_prob_sum(), trace_c.log_prob_sum() + log_det, rtol=0.0, atol=1e-8
        )
        # neither the Jacobian nor the mean shift is trivial here
        m, c = gpn_i.informed_factor(trace_c.nodes["A2_train"]["fn"].scale_tril, params["sigma2"])
        assert float(m.diagonal().log().sum()) > 1.0 and float(c.abs().max()) > 1.0


def test_likelihood_informed_without_anchor_is_whitened():
    """No anchor (or ``kappa = 0`` with any ``a_hat``): ``e = z``, the whitened density."""
    x, y, x_test = _data(num_train=5, num_test=3, m=1)
    g = torch.Generator().manual_seed(13)
    params = {
        "W1": torch.randn(3, 1, generator=g, dtype=F64),
        "sigma1": 0.05 + torch.rand(3, generator=g, dtype=F64),
        "W2": torch.randn(1, 3, generator=g, dtype=F64),
        "sigma2": 0.05 + torch.rand(1, generator=g, dtype=F64),
        "y_test": torch.randn(1, 3, generator=g, dtype=F64),
    }
    z = torch.randn(8, generator=g, dtype=F64)
    white = {**params, "Za2_train": z[:5], "Za2_test": z[5:]}
    informed = {**params, "Ea2_train": z[:5], "Ea2_test": z[5:]}
    gpn_w = NonParametricGPN([1, 3, 1])
    gpn_i = NonParametricGPN([1, 3, 1], activations="likelihood-informed")
    ref = poutine.trace(poutine.condition(gpn_w.model, white)).get_trace(x, y, x_test)
    for anchor in (None, (torch.randn(5, generator=g, dtype=F64), 0.0)):
        if anchor is not None:
            gpn_i.set_activation_anchor(*anchor)
        trace = poutine.trace(poutine.condition(gpn_i.model, informed)).get_trace(x, y, x_test)
        torch.testing.assert_close(trace.log_prob_sum(), ref.log_prob_sum(), rtol=0.0, atol=1e-10)


def test_activation_anchor_is_checked():
    gpn = NonParametricGPN([1, 3, 1], activations="likelihood-informed")
    with pytest.raises(ValueError, match="a_hat"):
        gpn.set_activation_anchor(torch.zeros(4, 2))
    with pytest.raises(ValueError, match="kappa"):
        gpn.set_activation_anchor(torch.zeros(4), -torch.ones(4))
    with pytest.raises(ValueError, match="kappa"):
        gpn.set_activation_anchor(torch.zeros(4), torch.ones(3))
    with pytest.raises(ValueError, match="likelihood-informed"):
        NonParametricGPN([1, 3, 1]).set_activation_anchor(torch.zeros(4))
    with pytest.raises(ValueError, match="likelihood"):
        NonParametricGPN([1, 3, 1], likelihood="bernoulli", activations="likelihood-informed")
    gpn.set_activation_anchor(torch.zeros(4), 1.0)
    x, y, _ = _data(num_train=6, num_test=1, m=1)
    with pytest.raises(ValueError, match="anchor"):
        poutine.trace(gpn.model).get_trace(x, y)
    assert gpn.activation_sites(with_test=True) == ["Ea2_train", "Ea2_test"]


def test_weight_prior_is_fan_in_scaled():
    """``W^l_{mn} ~ N(0, weight_scale^2 / M_l)``: every layer's weight site has the log density
    of that normal (scipy), fan-ins 3 and 4 so that ``1 / M`` and ``1 / sqrt(M)`` differ."""
    import scipy.stats

    x, y, _ = _data(num_train=4, m=3)
    gpn = NonParametricGPN([3, 4, 1], weight_scale=1.5, collapse=False)
    trace = poutine.trace(gpn.model).get_trace(x, y)
    trace.compute_log_prob()
    for name, fan_in in (("W1", 3), ("W2", 4)):
        value = trace.nodes[name]["value"].numpy()
        want = scipy.stats.norm(0.0, 1.5 / math.sqrt(fan_in)).logpdf(value).sum()
        assert float(trace.nodes[name]["log_prob_sum"]) == pytest.approx(want, rel=1e-12)


def test_classification_jitter_is_the_latent_functions_variance():
    """Classification: the last layer's latent function over the rows is ``L z`` with
    ``L L^T = K_w(X, X) + (classification_jitter + jitter) I`` -- the jitter is a variance --
    against a NumPy Cholesky factor of that matrix."""
    x, _, _ = _data(num_train=5, m=2)
    labels = torch.tensor([0, 1, 1, 0, 1])
    gpn = NonParametricGPN([2, 1], likelihood="bernoulli", classification_jitter=0.25)
    w = torch.tensor([[0.7, -1.3]], dtype=F64)
    z = torch.tensor([[0.5, -1.0, 0.3, 1.2, -0.4]], dtype=F64)
    conditioned = poutine.condition(gpn.model, {"W1": w, "Z1_train": z})
    logits = poutine.trace(conditioned).get_trace(x, labels).nodes["y_train"]["fn"].logits
    xs = x.numpy()
    proj = (xs[:, None, :] - xs[None, :, :]) @ w.numpy()[0]
    cov = np.exp(-0.5 * proj**2) + (0.25 + gpn.jitter) * np.eye(5)
    want = np.linalg.cholesky(cov) @ z.numpy()[0]
    np.testing.assert_allclose(logits.numpy(), want, rtol=1e-10, atol=1e-12)
