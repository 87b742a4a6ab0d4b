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


@pytest.mark.parametrize("head", ["gaussian", "heteroscedastic"])
def test_log_predictive_is_the_mixture_density_by_scipy(head):
    members = _members(head)
    x, y = _rows()
    got = NetworkEnsemble(members).log_predictive(x, y).detach().numpy()
    # scipy over every member's Gaussian components, equal weights across members
    terms = []
    for net in members:
        with torch.no_grad():
            w, m, v = net.head.predictive_mixture(net.hidden(x))
        w, m, v = w.numpy(), m[..., 0].numpy(), v[..., 0].numpy()  # [T], [T, S]
        logpdf = stats.norm.logpdf(y.numpy()[:, 0][None], m, np.sqrt(v))
        terms.append(special.logsumexp(logpdf + np.log(w)[:, None], axis=0))
    expected = special.logsumexp(np.stack(terms), axis=0) - math.log(len(members))
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    weights, mean, var = NetworkEnsemble(members).predictive_mixture(x)
    assert abs(float(weights.sum()) - 1.0) < 1e-12 and mean.shape[0] == weights.shape[0]


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
    ensemble = NetworkEnsemble(members)
    probs = torch.stack([m.predict(x).probs for m in members])  # [K, S, C]
    pred = ensemble.predict(x)
    torch.testing.assert_close(pred.probs, probs.mean(0), rtol=1e-12, atol=1e-14)
    expected = probs.mean(0)[torch.arange(9), labels].log()
    torch.testing.assert_close(ensemble.log_predictive(x, labels), expected, rtol=1e-10, atol=0)
    with pytest.raises(ValueError, match="regression heads only"):
        ensemble.predictive_mixture(x)


def test_bad_members_are_named():
    with pytest.raises(ValueError, match="at least one"):
        NetworkEnsemble([])
    with pytest.raises(TypeError, match=r"members\[1\]"):
        NetworkEnsemble([_members(k=1)[0], torch.nn.Linear(2, 1)])
    with pytest.raises(ValueError, match="one task and input width"):
        NetworkEnsemble([_members(k=1)[0], GPNNet([2, 4, 3], head="softmax").double()])
    with pytest.raises(ValueError, match="one task and input width"):
        NetworkEnsemble([_members(k=1)[0], _members(k=1, sizes=(3, 4, 1))[0]])
