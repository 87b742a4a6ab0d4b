"""``benchmarks/uci_dispersion.py``: the standardised-error and variance-scale diagnosis of a
Bayesian GPN's predictive, checked against direct computations on a small network."""

import math

import pytest
import torch

from benchmarks.uci import metrics_of
from benchmarks.uci_dispersion import TAUS, dispersion, run
from pyro_gpn.heads import HeteroscedasticGaussianHead
from pyro_gpn.models import VariationalGPN

pytestmark = pytest.mark.usefixtures("fresh_param_store")


@pytest.mark.parametrize("head", ["gaussian", "heteroscedastic"])
def test_dispersion_matches_the_predictive_it_scores(head):
    torch.manual_seed(0)
    head = HeteroscedasticGaussianHead(1) if head == "heteroscedastic" else "gaussian"
    net = VariationalGPN([2, 5, 1], head=head)
    x = torch.rand(40, 2) * 2 - 1
    y = torch.sin(3 * x[:, :1])
    out = dispersion(net, x, y, y_std=2.0)
    with torch.no_grad():
        weights, mean, var = net.head.predictive_mixture(net.hidden(x))
    mean, var = mean.reshape(mean.shape[0], -1), var.reshape(var.shape[0], -1)
    mix = (weights[:, None] * mean).sum(0)
    total = (weights[:, None] * (var + mean.square())).sum(0) - mix.square()
    assert math.isclose(out["z2"], float(((y[:, 0] - mix).square() / total).mean()), rel_tol=1e-4)
    for tau in TAUS:
        expected = metrics_of(mean, var * tau, y, 2.0, weights)
        assert math.isclose(out["scaled"][str(tau)]["log_lik"], expected["log_lik"], rel_tol=1e-9)
    # a narrower predictive changes the score: the scale reaches the density
    assert out["scaled"]["0.25"]["log_lik"] != out["scaled"]["1.0"]["log_lik"]


@pytest.mark.parametrize("model", ["mcdrop", "bgpn_trace_pll", "dgp"])
def test_run_rejects_models_that_are_not_bayesian_gpn_columns(model):
    with pytest.raises(ValueError, match="model"):
        run("yacht", 0, model)
