"""VariationalGPN: site structure, model/guide match, prior, scaling, prediction."""

import warnings

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import Predictive, Trace_ELBO
from pyro.util import check_model_guide_match

from pyro_gpn.models.variational import VariationalGPN
from tests.mc import assert_mc_mean, assert_mc_variance

DT = torch.float64

CONFIGS = [
    dict(sizes=[2, 1], head="gaussian"),
    dict(sizes=[2, 3, 2], head="gaussian", whiten=True),
    dict(sizes=[2, 3, 2], head="gaussian", q_cov="diag", share="layer"),
    dict(sizes=[2, 3, 4], head="softmax"),
    dict(sizes=[2, 3, 2, 4], head="softmax", whiten=True, q_cov="diag", mode="cov"),
    dict(sizes=[2, 3, 1], head="gaussian", weights="point"),
    dict(sizes=[2, 3, 1], head="gaussian", weights=("variational", "point")),
]


@pytest.fixture(autouse=True)
def _fresh_param_store():
    pyro.clear_param_store()
    with pyro.validation_enabled(True):
        yield
    pyro.clear_param_store()


def _data(config, batch=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    sizes = config["sizes"]
    x = torch.rand(batch, sizes[0], dtype=DT, generator=gen) * 2 - 1
    if config["head"] == "gaussian":
        y = torch.randn(batch, sizes[-1], dtype=DT, generator=gen)
    else:
        y = torch.randint(0, sizes[-1], (batch,), generator=gen)
    return x, y


def _net(config, **extra):
    torch.manual_seed(0)
    return VariationalGPN(**config, num_inducing=5, dtype=DT, **extra)


@pytest.mark.parametrize("config", CONFIGS)
def test_trace_elbo_runs_without_site_mismatch(config):
    vgpn = _net(config)
    x, y = _data(config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = Trace_ELBO().loss(vgpn.model, vgpn.guide, x, y)
        vectorized = Trace_ELBO(num_particles=4, vectorize_particles=True, max_plate_nesting=1)
        loss_v = vectorized.loss(vgpn.model, vgpn.guide, x, y)
    assert torch.isfinite(torch.tensor([loss, loss_v])).all()
    guide_trace = poutine.trace(vgpn.guide).get_trace(x, y)
    model_trace = poutine.trace(poutine.replay(vgpn.model, trace=guide_trace)).get_trace(x, y)
    check_model_guide_match(model_trace, guide_trace, max_plate_nesting=1)
    latent = {n for n, s in model_trace.iter_stochastic_nodes()}
    guide_latent = {n for n, s in guide_trace.iter_stochastic_nodes()}
    assert latent == guide_latent
    num_layers = vgpn.num_layers
    assert {f"layer{l}.targets" for l in range(num_layers)} <= latent
    assert {f"layer{l}.response" for l in range(num_layers)} <= latent
    treatment = config.get("weights", "variational")
    per_layer = [treatment] * num_layers if isinstance(treatment, str) else list(treatment)
    weights = {f"layer{l}.weight" for l in range(num_layers)}
    # W is latent (q(W) in the guide, outside the data plate) exactly where it is variational
    expected = {f"layer{l}.weight" for l, t in enumerate(per_layer) if t == "variational"}
    assert weights & latent == expected
    if expected:
        assert model_trace.nodes["layer0.weight"]["value"].shape == vgpn.layers[0].weight.shape
        assert model_trace.nodes["layer0.weight"]["scale"] == 1.0
    assert model_trace.nodes["obs"]["is_observed"]
    # the local sites have identical densities in model and guide: they cancel in Trace_ELBO
    model_trace.compute_log_prob()
    guide_trace.compute_log_prob()
    for name in latent:
        if not name.endswith((".targets", ".weight")):
            torch.testing.assert_close(
                model_trace.nodes[name]["log_prob"], guide_trace.nodes[name]["log_prob"]
            )


def test_missing_local_sites_in_the_guide_would_be_detected():
    """The site-match check is not vacuous: a guide that samples only U is reported."""
    config = CONFIGS[1]
    vgpn = _net(config)
    x, y = _data(config)

    def targets_only_guide(x, y=None):
        for l, layer in enumerate(vgpn.layers):
            pyro.sample(f"layer{l}.targets", layer.target_posterior().to_event(1))

    with pytest.warns(UserWarning, match="model but not guide"):
        Trace_ELBO().loss(vgpn.model, targets_only_guide, x, y)


def test_mini_batch_scaling():
    config = CONFIGS[0]
    vgpn = _net(config, num_data=70)
    x, y = _data(config, batch=7)
    trace = poutine.trace(vgpn.model).get_trace(x, y)
    assert trace.nodes["obs"]["scale"] == pytest.approx(10.0)
    assert trace.nodes["layer0.response"]["scale"] == pytest.approx(10.0)
    assert trace.nodes["layer0.targets"]["scale"] == 1.0
    x_big, y_big = _data(config, batch=71)
    with pytest.raises(ValueError, match="num_data"):
        vgpn.model(x_big, y_big)
    # predictions may cover more rows than the training set (num_data scales observed data only)
    assert vgpn(x_big).mean.shape[0] == 71
    assert poutine.trace(vgpn.model).get_trace(x_big).nodes["obs"]["value"].shape[0] == 71


@pytest.mark.parametrize("whiten", [False, True])
def test_prior_predictive_is_the_gp_prior(whiten):
    """Under the model's prior over U, each response F is N(0, 1) (the unit-amplitude GP)."""
    vgpn = _net(dict(sizes=[2, 3], head="gaussian", whiten=whiten))
    x, _ = _data(dict(sizes=[2, 3], head="gaussian"), batch=4)
    predictive = Predictive(
        vgpn.model, num_samples=4000, return_sites=["layer0.response"], parallel=True
    )
    samples = predictive(x)
    f = samples["layer0.response"]  # [4000, 4, 3]
    assert_mc_mean(f, torch.zeros(4, 3, dtype=DT), n_se=4.5)
    assert_mc_variance(f, torch.ones(4, 3, dtype=DT), n_se=4.5)


def test_predict_agrees_with_predictive_moments_for_one_layer():
    """One layer with observed inputs: the propagated moments are exact, the head's noise
    included (large enough here, about half the variance, that the draws resolve it)."""
    config = dict(sizes=[2, 2], head="gaussian")
    vgpn = _net(config, targets_scale_init=0.5, weight_scale_init=0.8, noise_std_init=0.8)
    x, _ = _data(config, batch=5)
    samples = vgpn.sample_predictive(x, num_samples=4000)
    assert samples["obs"].shape == (4000, 5, 2)
    assert samples["layer0.weight"].shape == (4000, 1, 2, 2)  # q(W) reaches the predictive
    assert samples["layer0.targets"].shape == (4000, 1, 2, 5)  # plate-aligned
    moments = vgpn(x)
    features = vgpn.hidden(x)
    torch.testing.assert_close(moments.var, features.var + vgpn.head.noise_std.square())
    assert_mc_mean(samples["obs"], moments.mean, n_se=4.5)
    assert_mc_variance(samples["obs"], moments.var, n_se=4.5)
    # the draws resolve the noise: the noise-free variance is rejected
    with pytest.raises(AssertionError):
        assert_mc_variance(samples["obs"], features.var, n_se=4.5)


def test_predict_softmax_shapes_and_moments():
    config = CONFIGS[3]
    vgpn = _net(config)
    x, _ = _data(config, batch=5)
    samples = vgpn.sample_predictive(x, num_samples=10)
    assert samples["obs"].shape == (10, 5)
    assert samples["layer0.output"].shape == (10, 5, 3)
    logits = vgpn(x)
    assert logits.mean.shape == (5, 4) and logits.cov.shape == (5, 4, 4)


def test_parameters_are_registered_with_the_param_store():
    config = CONFIGS[3]
    vgpn = _net(config)
    x, y = _data(config)
    with poutine.trace(param_only=True) as capture:
        Trace_ELBO().loss(vgpn.model, vgpn.guide, x, y)
    names = set(capture.trace.nodes)
    expected = {
        "layers.0.weight",
        "layers.0.weight_scale",
        "layers.0.lengthscales",
        "layers.0.noise_std",
        "layers.0.response.targets_loc",
        "layers.0.response.targets_scale_tril",
        "head$$$weight",  # the head is a plain module: registered by pyro.module
        "head$$$bias",
    }
    assert expected <= names


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(sizes=[2]),
        dict(sizes=[2, 3], head="softmax"),
        dict(sizes=[2, 3], head="poisson"),
        dict(sizes=[2, 3], mode="mean"),
        dict(sizes=[2, 3], num_data=0),
    ],
)
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        VariationalGPN(**kwargs)


@pytest.mark.parametrize("whiten", ["yes", "false", 1])
def test_whiten_must_be_a_bool(whiten):
    with pytest.raises(ValueError, match="whiten must be True, False or None"):
        VariationalGPN([2, 3, 1], whiten=whiten)


def test_invalid_data():
    vgpn = _net(CONFIGS[0])
    with pytest.raises(ValueError, match="x"):
        vgpn.model(torch.rand(4, 3, dtype=DT))
    with pytest.raises(ValueError, match="y"):
        vgpn.model(torch.rand(4, 2, dtype=DT), torch.rand(4, dtype=DT))


def test_per_layer_weights_keep_q_w_where_asked_and_reject_bad_sequences():
    """``weights=("variational", "point")``: q(W) (and its KL) in the first layer only; the
    heteroscedastic head's two layers ``M -> N -> 2``; bad sequences raise naming ``weights``."""
    from pyro_gpn.heads import HeteroscedasticGaussianHead

    def build(weights):
        torch.manual_seed(0)  # the same W, q(U) and head in both networks
        head = HeteroscedasticGaussianHead(1, dtype=DT)
        return VariationalGPN(
            [3, 4, 1], head=head, weights=weights, num_inducing=5, weight_scale_init=0.5, dtype=DT
        )

    vgpn, point = build(("variational", "point")), build("point")
    assert [layer.weight_treatment for layer in vgpn.layers] == ["variational", "point"]
    assert [layer.variational_weights for layer in vgpn.layers] == [True, False]
    assert float(vgpn.layers[0].weight_kl_divergence()) > 0
    assert float(vgpn.layers[1].weight_kl_divergence()) == 0
    x = torch.rand(6, 3, dtype=DT)
    out = vgpn(x)
    assert out.mean.shape == (6, 1) and out.variance.shape == (6, 1)
    torch.testing.assert_close(vgpn.layers[0].weight, point.layers[0].weight)
    # q(W) spreads the first layer's activations (Var[A] = sum_m x_m^2 v_mn), point weights not
    from pyro_gpn.moments.gaussian import Moments

    spread = vgpn.layers[0].activation_moments(Moments(x), "meanvar").variance
    torch.testing.assert_close(spread, (x.square() @ vgpn.layers[0].weight_var()))
    assert bool((spread > 0).all())
    assert bool((point.layers[0].activation_moments(Moments(x), "meanvar").variance == 0).all())
    for bad in [("point",), ("variational", "point", "point"), ("variational", "map"), 3]:
        with pytest.raises(ValueError, match="weights"):
            VariationalGPN([3, 4, 1], weights=bad, num_inducing=5, dtype=DT)


def _independent_kl(vgpn):
    """sum over layers of KL(q(U) || N(0, K)) + KL(q(W) || N(0, s^2)), from the raw parameters
    (K rebuilt by hand, q(U) mapped to U coordinates, torch's KL): independent of the library's
    KL code."""
    total = torch.zeros((), dtype=DT)
    for layer in vgpn.layers:
        v, ls = layer.inducing_points, layer.lengthscales
        r = v.shape[-1]
        sq = (v[:, :, None] - v[:, None, :]) ** 2
        gram = torch.exp(-sq / (2 * ls[:, None, None] ** 2)) + layer.jitter * torch.eye(r, dtype=DT)
        loc, tril = layer.targets_loc, layer.variational_scale_tril()
        if layer.whiten:
            chol = torch.linalg.cholesky(gram)
            loc, tril = (chol @ loc.unsqueeze(-1)).squeeze(-1), chol @ tril
        q = torch.distributions.MultivariateNormal(loc, covariance_matrix=tril @ tril.mT)
        p = torch.distributions.MultivariateNormal(torch.zeros_like(loc), covariance_matrix=gram)
        total = total + torch.distributions.kl_divergence(q, p).sum()
        if layer.variational_weights:
            prior_std = 1.0 / layer.in_features**0.5  # weight_prior_scale 1 (the default)
            qw = torch.distributions.Normal(layer.weight, layer.weight_scale)
            pw = torch.distributions.Normal(torch.zeros_like(layer.weight), prior_std)
            total = total + torch.distributions.kl_divergence(qw, pw).sum()
    return total


@pytest.mark.parametrize("whiten", [False, True])
def test_network_kl_is_the_sum_of_every_layers_kl(whiten):
    """vgpn.kl_divergence() = sum over all layers of the KL of q(U) and q(W), each layer's
    term non-negligible (a KL of one layer only, or of the last, would fail)."""
    vgpn = _net(
        dict(sizes=[2, 3, 2, 2], head="gaussian", whiten=whiten, targets_init="random"),
        targets_scale_init=0.3,
        weight_scale_init=0.4,
    )
    per_layer = [float(layer.kl_divergence().detach()) for layer in vgpn.layers]
    assert min(per_layer) > 0.5
    expected = _independent_kl(vgpn)
    torch.testing.assert_close(vgpn.kl_divergence(), expected)


def test_loss_divides_the_kl_by_num_data_not_by_the_batch():
    """loss(x, y) = mean_s E[-log p(y_s)] + KL / num_data with num_data (60) != batch (6)."""
    config = dict(sizes=[2, 3, 1], head="gaussian")
    vgpn = _net(config, num_data=60, targets_scale_init=0.3, weight_scale_init=0.4)
    x, y = _data(config, batch=6)
    kl = _independent_kl(vgpn)
    assert float(kl) > 1.0  # large enough that KL / 6 and KL / 60 differ visibly
    got = vgpn.loss(x, y) - vgpn.expected_nll(x, y)
    torch.testing.assert_close(got, kl / 60)
    vgpn.num_data = None  # then the batch is the data set
    torch.testing.assert_close(vgpn.loss(x, y) - vgpn.expected_nll(x, y), kl / 6)
