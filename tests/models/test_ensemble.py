"""NetworkEnsemble: the mixture's density against scipy, its moments against Monte Carlo draws
from the members' own predictives, and its checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import special, stats

from pyro_gpn import GPNNet, HeteroscedasticGaussianHead
from pyro_gpn.models import NetworkEnsemble, VariationalGPN


def _members(head="gaussian", k: int = 3, sizes=(2, 4, 1)):
    out = []
    for seed in range(k):
        torch.manual_seed(seed)
        h = HeteroscedasticGaussianHead(1) if head == "heteroscedastic" else head
        net = VariationalGPN(list(sizes), head=h).double()
        with torch.no_grad():  # members in different modes: perturb every parameter
            for p in net.parameters():
                p.add_(0.2 * torch.randn_like(p))
        out.append(net)
    return out


def _rows(seed: int = 7, rows: int = 9, width: int = 2):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    y = torch.randn(rows, 1, generator=gen, dtype=torch.float64)
    return x, y


@pytest.mark.parametrize("mixing", [None, (0.2, 0.5, 0.3)])
@pytest.mark.parametrize("head", ["gaussian", "heteroscedastic"])
def test_log_predictive_is_the_mixture_density_by_scipy(head, mixing):
    members = _members(head)
    x, y = _rows()
    ensemble = NetworkEnsemble(members, mixing)
    got = ensemble.log_predictive(x, y).detach().numpy()
    # scipy over every member's Gaussian components, the members weighted as given
    shares = np.full(3, 1 / 3) if mixing is None else np.array(mixing)
    terms = []
    for net in members:
        with torch.no_grad():
            w, m, v = net.head.predictive_mixture(net.hidden(x))
        w, m, v = w.numpy(), m[..., 0].numpy(), v[..., 0].numpy()  # [T], [T, S]
        logpdf = stats.norm.logpdf(y.numpy()[:, 0][None], m, np.sqrt(v))
        terms.append(special.logsumexp(logpdf + np.log(w)[:, None], axis=0))
    expected = special.logsumexp(np.stack(terms) + np.log(shares)[:, None], axis=0)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    weights, mean, var = ensemble.predictive_mixture(x)
    assert abs(float(weights.sum()) - 1.0) < 1e-12 and mean.shape[0] == weights.shape[0]
    mean, var = mean.detach(), var.detach()
    comp = stats.norm.logpdf(y.numpy()[:, 0][None], mean[..., 0], var[..., 0].sqrt())
    from_components = special.logsumexp(comp + np.log(weights.numpy())[:, None], axis=0)
    np.testing.assert_allclose(from_components, expected, rtol=1e-10, atol=1e-12)
    # the moments by the law of total variance over the weighted components
    pred = ensemble.predict(x)
    mix_mean = torch.einsum("k,ksd->sd", weights, mean)
    mix_var = torch.einsum("k,ksd->sd", weights, var + mean.square()) - mix_mean.square()
    torch.testing.assert_close(pred.mean, mix_mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(pred.std, mix_var.sqrt(), rtol=1e-9, atol=1e-12)


def test_a_member_of_weight_zero_takes_no_part():
    members = _members("heteroscedastic")
    x, y = _rows()
    with_zero = NetworkEnsemble(members, [0.4, 0.0, 0.6])
    without = NetworkEnsemble([members[0], members[2]], [0.4, 0.6])
    torch.testing.assert_close(
        with_zero.log_predictive(x, y), without.log_predictive(x, y), rtol=1e-13, atol=0
    )
    torch.testing.assert_close(with_zero.predict(x).std, without.predict(x).std)
    torch.testing.assert_close(with_zero.predict(x).mean, without.predict(x).mean)


def test_weighted_ensemble_round_trips_and_old_states_load_as_equal_weight():
    members = _members()
    ensemble = NetworkEnsemble(members, torch.tensor([0.1, 0.6, 0.3]))
    state = ensemble.state_dict()
    again = NetworkEnsemble(_members(), None)
    again.load_state_dict(state)
    torch.testing.assert_close(again.mixture_weights, ensemble.mixture_weights)
    del state["mixture_weights"]  # a state saved before the ensemble had mixture weights
    again.load_state_dict(state)
    assert torch.equal(again.mixture_weights, torch.full((3,), 1 / 3, dtype=torch.float64))
    assert "weights=[0.1, 0.6, 0.3]" in repr(ensemble)


def test_predict_moments_match_draws_from_the_members():
    members = _members("heteroscedastic")
    x, _ = _rows()
    pred = NetworkEnsemble(members).predict(x)
    gen = np.random.default_rng(0)
    draws = []
    for net in members:  # 40,000 draws from each member's own mixture
        with torch.no_grad():
            w, m, v = (t.numpy() for t in net.head.predictive_mixture(net.hidden(x)))
        comp = gen.choice(len(w), size=40_000, p=w / w.sum())
        draws.append(m[comp, :, 0] + np.sqrt(v[comp, :, 0]) * gen.standard_normal((40_000, 9)))
    draws = np.concatenate(draws)  # [120,000, S]
    se = draws.std(0) / math.sqrt(draws.shape[0])
    assert np.all(np.abs(pred.mean[:, 0].numpy() - draws.mean(0)) < 5 * se)
    np.testing.assert_allclose(pred.std[:, 0].numpy(), draws.std(0), rtol=0.02)


def test_one_member_is_the_member_itself():
    (net,) = _members(k=1)
    x, y = _rows()
    ensemble = NetworkEnsemble([net])
    assert torch.equal(ensemble.predict(x).mean, net.predict(x).mean)
    torch.testing.assert_close(ensemble.predict(x).std, net.predict(x).std, rtol=1e-12, atol=0)
    own = net.head.log_predictive(net.hidden(x), y)
    torch.testing.assert_close(ensemble.log_predictive(x, y), own, rtol=0, atol=1e-12)


def test_classifiers_mix_their_class_probabilities():
    x, _ = _rows(width=3)
    labels = torch.tensor([0, 1, 2, 1, 0, 2, 2, 1, 0])
    members = []
    for seed in range(3):
        torch.manual_seed(seed)
        members.append(GPNNet([3, 4, 3], head="softmax").double())
    probs = torch.stack([m.predict(x).probs for m in members])  # [K, S, C]
    for given in (None, [0.5, 0.1, 0.4]):
        ensemble = NetworkEnsemble(members, given)
        shares = torch.tensor([1 / 3] * 3 if given is None else given, dtype=torch.float64)
        mixed = torch.einsum("k,ksc->sc", shares, probs)
        pred = ensemble.predict(x)
        torch.testing.assert_close(pred.probs, mixed, rtol=1e-12, atol=1e-14)
        expected = mixed[torch.arange(9), labels].log()
        got = ensemble.log_predictive(x, labels)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=0)
        # the spread by the law of total variance over the members' own predictives
        stds = torch.stack([m.predict(x).std for m in members])
        total = torch.einsum("k,ksc->sc", shares, stds.square() + (probs - mixed).square())
        torch.testing.assert_close(pred.std, total.sqrt(), rtol=1e-10, atol=1e-13)
    with pytest.raises(ValueError, match="regression heads only"):
        ensemble.predictive_mixture(x)


def test_bad_members_are_named():
    with pytest.raises(ValueError, match="at least one"):
        NetworkEnsemble([])
    with pytest.raises(TypeError, match=r"members\[1\]"):
        NetworkEnsemble([_members(k=1)[0], torch.nn.Linear(2, 1)])
    with pytest.raises(ValueError, match="one task, input width and output width"):
        NetworkEnsemble([_members(k=1)[0], GPNNet([2, 4, 3], head="softmax").double()])
    with pytest.raises(ValueError, match="one task, input width and output width"):
        NetworkEnsemble([_members(k=1)[0], _members(k=1, sizes=(3, 4, 1))[0]])


@pytest.mark.parametrize(
    "weights, match",
    [
        ([0.5, 0.5], "one number per member"),
        ([0.5, 0.7, -0.2], "non-negative"),
        ([0.5, float("nan"), 0.5], "finite"),
        ([0.2, 0.2, 0.2], "sum to 1"),
        (["a", 0.5, 0.5], "sequence of numbers"),
    ],
)
def test_bad_weights_are_named(weights, match):
    with pytest.raises(ValueError, match=match):
        NetworkEnsemble(_members(), weights)


# --------------------------------------------------------------------- the mixture's own scale


def _numpy_mixture(members, x, shares=None):
    """Every member's components together, member ``k`` weighted ``shares[k]`` (``None``:
    equally): weights ``[KT]`` and means and standard deviations ``[KT, S]`` (numpy, output 0)."""
    shares = [1 / len(members)] * len(members) if shares is None else shares
    ws, ms, vs = [], [], []
    for net, share in zip(members, shares):
        with torch.no_grad():
            w, m, v = (t.numpy() for t in net.head.predictive_mixture(net.hidden(x)))
        ws.append(w * share)
        ms.append(m[..., 0])
        vs.append(v[..., 0])
    return np.concatenate(ws), np.concatenate(ms), np.sqrt(np.concatenate(vs))


@pytest.mark.parametrize("mixing", [None, (0.2, 0.5, 0.3)])
@pytest.mark.parametrize("head", ["gaussian", "heteroscedastic"])
@pytest.mark.parametrize("scale", [0.6, 1.7])
def test_scaled_mixture_is_the_mixture_stretched_about_its_mean(head, scale, mixing):
    """``log p_s(y) = log p_1(m + (y - m) / s) - log s`` with ``m`` the mixture's mean, by scipy
    over the members' components; the moments scale by ``s``; the components agree."""
    members = _members(head)
    x, y = _rows()
    ensemble = NetworkEnsemble(members, mixing)
    plain = ensemble.predict(x)
    ensemble.predictive_scale.fill_(scale)
    w, m, sd = _numpy_mixture(members, x, mixing)
    centre = (w[:, None] * m).sum(0)
    u = centre + (y.numpy()[:, 0] - centre) / scale
    expected = special.logsumexp(
        stats.norm.logpdf(u[None], m, sd) + np.log(w)[:, None], axis=0
    ) - math.log(scale)
    got = ensemble.log_predictive(x, y).detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        weights, mean, var = ensemble.predictive_mixture(x)
    comp = stats.norm.logpdf(
        y.numpy()[:, 0][None], mean[..., 0].numpy(), var[..., 0].sqrt().numpy()
    )
    from_components = special.logsumexp(comp + np.log(weights.numpy())[:, None], axis=0)
    np.testing.assert_allclose(from_components, expected, rtol=1e-10, atol=1e-12)
    pred = ensemble.predict(x)
    torch.testing.assert_close(pred.mean, plain.mean, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(pred.std, scale * plain.std, rtol=1e-12, atol=1e-14)
    mix_mean = torch.einsum("k,ksd->sd", weights, mean)
    mix_var = torch.einsum("k,ksd->sd", weights, var + mean.square()) - mix_mean.square()
    torch.testing.assert_close(mix_var.sqrt(), pred.std, rtol=1e-9, atol=1e-12)


def test_scaled_mixture_of_two_outputs_stretches_each_output_by_its_scale():
    """``D = 2`` with a scale per output: ``log p_s(y) = log p_1(m + (y - m) / s) - sum_d log
    s_d``, each member's density the product over its outputs, by scipy."""
    members = _members(sizes=(2, 4, 2))
    x, _ = _rows()
    y = torch.randn(9, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ensemble = NetworkEnsemble(members, (0.2, 0.5, 0.3))
    scale = np.array([0.6, 1.7])
    ensemble.predictive_scale.copy_(torch.as_tensor(scale))
    parts = []
    for net in members:
        with torch.no_grad():
            _, m, v = (t.numpy() for t in net.head.predictive_mixture(net.hidden(x)))
        parts.append((m[0], np.sqrt(v[0])))  # one component a member: [S, 2]
    centre = sum(share * m for share, (m, _) in zip((0.2, 0.5, 0.3), parts))
    u = centre + (y.numpy() - centre) / scale
    terms = [stats.norm.logpdf(u, m, sd).sum(1) for m, sd in parts]
    expected = special.logsumexp(np.stack(terms) + np.log([0.2, 0.5, 0.3])[:, None], axis=0)
    expected -= np.log(scale).sum()
    got = ensemble.log_predictive(x, y).detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    # the standard deviations stretch per output
    plain = NetworkEnsemble(members, (0.2, 0.5, 0.3)).predict(x)
    torch.testing.assert_close(
        ensemble.predict(x).std, plain.std * torch.as_tensor(scale), rtol=1e-12, atol=1e-14
    )


def test_scale_one_changes_no_bit_and_members_keep_their_scales():
    members = _members("heteroscedastic")
    members[1].head.predictive_scale.fill_(1.3)  # a calibrated member acts as it is
    x, y = _rows()
    ensemble = NetworkEnsemble(members)
    before = (ensemble.log_predictive(x, y), ensemble.predict(x), ensemble.predictive_mixture(x))
    ensemble.predictive_scale.fill_(0.5)
    ensemble.predictive_scale.fill_(1.0)
    assert torch.equal(ensemble.log_predictive(x, y), before[0])
    assert torch.equal(ensemble.predict(x).std, before[1].std)
    assert all(torch.equal(a, b) for a, b in zip(ensemble.predictive_mixture(x), before[2]))
    assert float(members[1].head.predictive_scale) == 1.3


@pytest.mark.parametrize("true_scale", [0.5, 2.0])
def test_fit_predictive_scale_recovers_the_scale_rows_were_drawn_with(true_scale):
    """Rows drawn from the mixture stretched by ``s``: the scale fitted on 4,000 of them is
    ``s`` within 4 %, the members' own scales untouched; fresh rows' 90 % coverage and log
    density improve over the unscaled mixture's."""
    from pyro_gpn.inference import fit_predictive_scale

    members = _members("heteroscedastic")
    ensemble = NetworkEnsemble(members)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5_000, 2, generator=gen, dtype=torch.float64)
    ensemble.predictive_scale.fill_(true_scale)
    with torch.no_grad():
        w, m, v = ensemble.predictive_mixture(x)
    comp = torch.multinomial(w, x.shape[0], replacement=True, generator=gen)
    rows = torch.arange(x.shape[0])
    y = m[comp, rows] + v[comp, rows].sqrt() * torch.randn(x.shape[0], 1, generator=gen)
    ensemble.predictive_scale.fill_(1.0)
    fit_x, fit_y, new_x, new_y = x[:4000], y[:4000], x[4000:], y[4000:]
    raw = ensemble.log_predictive(new_x, new_y).mean()
    scale = fit_predictive_scale(ensemble, fit_x, fit_y)
    assert abs(float(scale) / true_scale - 1) < 0.04  # 3.5 standard errors at 4,000 rows
    assert float(ensemble.predictive_scale) == float(scale)
    assert all(float(net.head.predictive_scale) == 1.0 for net in members)
    assert ensemble.log_predictive(new_x, new_y).mean() > raw + 0.05


def test_fit_predictive_scale_of_an_ensemble_maximises_scipys_log_density():
    from scipy.optimize import minimize_scalar

    from pyro_gpn.inference import fit_predictive_scale

    members = _members("gaussian")
    x, y = _rows(rows=40)
    y = 3.0 * y  # a mixture too narrow for these rows
    w, m, sd = _numpy_mixture(members, x)
    centre = (w[:, None] * m).sum(0)

    def nll(log_s):
        s = math.exp(log_s)
        u = centre + (y.numpy()[:, 0] - centre) / s
        dens = special.logsumexp(stats.norm.logpdf(u[None], m, sd) + np.log(w)[:, None], axis=0)
        return -(dens - log_s).mean()

    best = minimize_scalar(nll, bounds=(math.log(0.01), math.log(100)), method="bounded")
    ensemble = NetworkEnsemble(members)
    got = fit_predictive_scale(ensemble, x, y)
    assert abs(float(got.log()) - best.x) < 1e-4


def test_classifier_ensemble_temperature():
    """Temperature ``T``: every member's sigma-point logits over ``T`` (after its own), the
    labels' log probability from those probabilities; a temperature fitted on labels drawn at
    ``T = 2.5`` is 2.5 within 10 %."""
    from pyro_gpn.inference import fit_predictive_scale

    members = []
    for seed in range(3):
        torch.manual_seed(seed)
        members.append(GPNNet([3, 4, 3], head="softmax").double())
    members[0].head.predictive_scale.fill_(0.8)
    ensemble = NetworkEnsemble(members)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4_000, 3, generator=gen, dtype=torch.float64) * 3
    ensemble.predictive_scale.fill_(2.5)
    probs = []
    for net in members:
        logits, pw = net.head.point_logits(net.hidden(x))
        p = (logits / (net.head.predictive_scale * 2.5)).softmax(-1)
        probs.append((pw.view(1, -1, 1) * p).sum(1))
    expected = torch.stack(probs).mean(0)
    torch.testing.assert_close(ensemble.predict(x).probs, expected, rtol=1e-10, atol=1e-12)
    labels = torch.multinomial(expected, 1, generator=gen).squeeze(-1)
    torch.testing.assert_close(
        ensemble.log_predictive(x, labels), expected[torch.arange(4000), labels].log()
    )
    ensemble.predictive_scale.fill_(1.0)
    temperature = fit_predictive_scale(ensemble, x, labels)
    assert abs(float(temperature) / 2.5 - 1) < 0.1
    with pytest.raises(ValueError, match="classification heads only"):
        NetworkEnsemble(_members(k=1)).point_logits(x[:, :2])


def test_ensemble_scale_is_saved_and_old_states_load_uncalibrated():
    members = _members(k=2)
    ensemble = NetworkEnsemble(members)
    ensemble.predictive_scale.fill_(0.7)
    state = ensemble.state_dict()
    fresh = NetworkEnsemble(_members(k=2))
    fresh.load_state_dict(state)
    assert float(fresh.predictive_scale) == pytest.approx(0.7)
    del state["predictive_scale"]
    fresh.load_state_dict(state)
    assert float(fresh.predictive_scale) == 1.0


def test_fit_predictive_scale_names_a_bad_target_of_an_ensemble():
    from pyro_gpn.inference import fit_predictive_scale

    ensemble = NetworkEnsemble(_members(k=2))
    x, y = _rows()
    with pytest.raises(ValueError, match=r"y must be \[9, 1\]"):
        fit_predictive_scale(ensemble, x, torch.zeros(9, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="bounds"):
        fit_predictive_scale(ensemble, x, y, bounds=(2.0, 3.0))


def test_one_classifier_member_is_itself_where_probabilities_underflow():
    """A readout scaled up until labels are ruled out by hundreds of nats: the ensemble's log
    probability is still its member's (both a log-sum-exp; a clamped probability would give
    log(1e-300) = -690.8)."""
    torch.manual_seed(0)
    net = GPNNet([3, 4, 3], head="softmax").double()
    with torch.no_grad():
        net.head.weight.mul_(2000.0)
    x, _ = _rows(width=3)
    labels = torch.tensor([0, 1, 2, 1, 0, 2, 2, 1, 0])
    own = net.head.log_predictive(net.hidden(x), labels)
    assert float(own.min()) < -1000
    ensemble = NetworkEnsemble([net])
    torch.testing.assert_close(ensemble.log_predictive(x, labels), own, rtol=1e-12, atol=1e-9)
