"""The predictive scale (``sigma``-scaling): ``fit_predictive_scale``, the regression heads'
``predictive_scale`` and ``fit_vgpn(calibrate=True)``.

References that do not share the code under test: for a Gaussian predictive the maximum of the
log density over the scale is ``sqrt(mean(z^2))`` in closed form; for the heteroscedastic
head's mixture, scipy's bounded scalar minimiser on a log density written out in numpy; the
stretched mixture's log density against the change-of-variables formula
``log p_s(y) = log p_1(m + (y - m) / s) - log s``.
"""

import math
import warnings

import numpy as np
import pyro
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

from pyro_gpn.heads import GaussianHead, HeteroscedasticGaussianHead, SoftmaxHead
from pyro_gpn.inference import fit_predictive_scale, fit_vgpn
from pyro_gpn.models.variational import VariationalGPN

DT = torch.float64


pytestmark = pytest.mark.usefixtures("fresh_param_store")


def _data(rows: int, seed: int = 0, noise: float = 0.1, outputs: int = 1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 2, generator=gen, dtype=DT)
    f = torch.cat([torch.sin(2 * x[:, :1] + k) for k in range(outputs)], 1)
    return x, f + noise * torch.randn(rows, outputs, generator=gen, dtype=DT)


def _net(head="gaussian", outputs: int = 1, seed: int = 0) -> VariationalGPN:
    torch.manual_seed(seed)
    if head == "heteroscedastic":
        head = HeteroscedasticGaussianHead(outputs, num_nodes=16, dtype=DT)
    elif head == "gaussian":
        head = GaussianHead(outputs, noise_std_init=0.5, dtype=DT)
    return VariationalGPN([2, 6, outputs], head=head, dtype=DT)


def _unscaled_mixture(net, x):
    kept = net.head.predictive_scale.clone()
    net.head.predictive_scale.fill_(1.0)
    try:
        with torch.no_grad():
            return net.head.predictive_mixture(net.hidden(x))
    finally:
        net.head.predictive_scale.copy_(kept)


def test_gaussian_scale_is_the_closed_form_per_output():
    """Two outputs, each miscalibrated by its own factor: the fitted scales are
    ``sqrt(mean(z^2))`` of each output to the search's tolerance."""
    net = _net(outputs=2)
    x, _ = _data(400, seed=1)
    with torch.no_grad():
        pred = net.head.predictive(net.hidden(x))
    gen = torch.Generator().manual_seed(2)
    factors = torch.tensor([0.3, 2.5], dtype=DT)
    y = pred.mean + factors * pred.variance.sqrt() * torch.randn(400, 2, generator=gen, dtype=DT)
    scale = fit_predictive_scale(net, x, y)
    expected = ((y - pred.mean).square() / pred.variance).mean(0).sqrt()
    torch.testing.assert_close(scale, expected, rtol=1e-7, atol=0)
    torch.testing.assert_close(net.head.predictive_scale, scale)
    assert scale[0] < 0.4 and scale[1] > 2.0  # the sample follows the factors


def test_mixture_scale_maximises_the_numpy_log_density():
    """The heteroscedastic head's Gauss-Hermite mixture: the fitted scale equals scipy's
    maximiser of the stretched mixture's log density written out in numpy."""
    net = _net("heteroscedastic")
    with torch.no_grad():  # a wide, input-dependent noise: a mixture far from one Gaussian
        net.head.noise_slope.fill_(3.0)
    x, y = _data(300, seed=3, noise=0.3)
    w, mean, var = (t.numpy() for t in _unscaled_mixture(net, x))
    yy = y.numpy()[:, 0]
    centre = np.einsum("k,ks->s", w, mean[..., 0])

    def neg_log_density(log_s):
        s = math.exp(log_s)
        u = centre + (yy - centre) / s
        comp = -0.5 * (np.log(2 * np.pi * var[..., 0]) + (u - mean[..., 0]) ** 2 / var[..., 0])
        return -(logsumexp(comp + np.log(w)[:, None], axis=0).mean() - log_s)

    best = minimize_scalar(
        neg_log_density, bounds=(-3, 3), method="bounded", options={"xatol": 1e-10}
    )
    scale = fit_predictive_scale(net, x, y, set_scale=False)
    assert float(scale) == pytest.approx(math.exp(best.x), rel=1e-5)
    assert float(net.head.predictive_scale) == 1.0  # set_scale=False leaves the head alone


@pytest.mark.parametrize("head", ["gaussian", "heteroscedastic"])
def test_scaled_predictive_is_the_stretched_distribution(head):
    """With scale ``s``: the mean is unchanged, every variance is ``s^2`` times, and the log
    density is the change of variables of the unscaled one."""
    net = _net(head)
    x, y = _data(50, seed=4)
    w1, m1, v1 = _unscaled_mixture(net, x)
    with torch.no_grad():
        pred1 = net.head.predictive(net.hidden(x))
        lp1 = net.log_predictive(x, y)
        net.head.predictive_scale.fill_(0.4)
        w, m, v = net.head.predictive_mixture(net.hidden(x))
        pred = net.head.predictive(net.hidden(x))
        lp = net.log_predictive(x, y)
    centre = torch.einsum("k,ksd->sd", w1, m1)
    torch.testing.assert_close(torch.einsum("k,ksd->sd", w, m), centre)
    torch.testing.assert_close(pred.mean, pred1.mean)
    torch.testing.assert_close(pred.variance, 0.16 * pred1.variance)
    total = torch.einsum("k,ksd->sd", w, v + m.square()) - centre.square()
    total1 = torch.einsum("k,ksd->sd", w1, v1 + m1.square()) - centre.square()
    torch.testing.assert_close(total, 0.16 * total1)
    u = centre + (y - centre) / 0.4
    with torch.no_grad():
        net.head.predictive_scale.fill_(1.0)
        expected = net.log_predictive(x, u) - math.log(0.4)
    torch.testing.assert_close(lp, expected)
    assert not torch.allclose(lp, lp1)


@pytest.mark.parametrize("df", [None, 4.0])
def test_scaled_mixture_of_unequal_component_means_is_the_stretched_distribution(df):
    """The heteroscedastic head with ``F`` and its log noise correlated: the Gauss-Hermite
    components have different means, and the scale must move each towards the mixture's mean
    (``s mu_k + (1 - s) m``), so that the calibrated density is the change of variables
    ``log p_1(m + (y - m) / s) - log s`` of the unscaled one, with and without t noise."""
    from pyro_gpn.moments.gaussian import Moments

    head = HeteroscedasticGaussianHead(1, df=df, num_nodes=16, dtype=DT)
    with torch.no_grad():
        head.noise_offset.fill_(-1.0)
        head.noise_slope.fill_(1.5)
    cov = torch.tensor([[0.3, 0.25], [0.25, 0.4]], dtype=DT).expand(3, 2, 2)
    features = Moments(torch.tensor([[0.1, 0.0], [-0.5, 0.3], [1.0, -0.2]], dtype=DT), cov=cov)
    y = torch.tensor([[0.9], [-2.0], [1.2]], dtype=DT)
    with torch.no_grad():
        w, m, _ = head.predictive_mixture(features)
        assert float((m - m[:1]).abs().max()) > 0.1  # the components' means differ
        centre = torch.einsum("k,ksd->sd", w, m)
        u = centre + (y - centre) / 0.4
        expected = head.log_predictive(features, u) - math.log(0.4)
        head.predictive_scale.fill_(0.4)
        got = head.log_predictive(features, y)
        raw = head.log_predictive(features, y, calibrated=False)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(got, raw)


def test_ensemble_scale_with_unequal_weights_maximises_the_numpy_log_density():
    """A mixture of three Gaussian networks weighted 0.7, 0.2, 0.1 (as a stacked selection
    weights them): the scale stretches about the weighted mean, and equals scipy's maximiser
    of the stretched mixture's log density written out in numpy."""
    from pyro_gpn.models import NetworkEnsemble

    members = []
    for seed in range(3):
        torch.manual_seed(seed)
        net = VariationalGPN(
            [2, 4, 1], head=GaussianHead(1, noise_std_init=0.3, dtype=DT), dtype=DT
        )
        with torch.no_grad():  # members in different modes: perturb every parameter
            for p in net.parameters():
                p.add_(0.5 * torch.randn_like(p))
        members.append(net)
    weights = np.array([0.7, 0.2, 0.1])
    x, y = _data(60, seed=8, noise=0.5)
    with torch.no_grad():
        preds = [net.predict(x) for net in members]
    mean = np.stack([p.mean[:, 0].numpy() for p in preds])  # [3, S]
    sd = np.stack([p.std[:, 0].numpy() for p in preds])
    assert np.abs(weights @ mean - mean.mean(0)).mean() > 0.05  # the weights move the centre
    yy = y.numpy()[:, 0]
    centre = weights @ mean

    def neg_log_density(log_s):
        s = math.exp(log_s)
        u = centre + (yy - centre) / s
        comp = -0.5 * (np.log(2 * np.pi * sd**2) + (u - mean) ** 2 / sd**2)
        return -(logsumexp(comp + np.log(weights)[:, None], axis=0).mean() - log_s)

    best = minimize_scalar(
        neg_log_density, bounds=(-3, 3), method="bounded", options={"xatol": 1e-10}
    )
    ensemble = NetworkEnsemble(members, tuple(weights))
    scale = fit_predictive_scale(ensemble, x, y, set_scale=False)
    assert float(scale) == pytest.approx(math.exp(best.x), rel=1e-5)


def test_scale_one_is_the_unscaled_mixture_bit_for_bit():
    net = _net("heteroscedastic")
    x, _ = _data(20)
    with torch.no_grad():
        features = net.hidden(x)
        w, comp_mean, cond_var, noise_var = net.head._nodes(features)
        _, mean, var = net.head.predictive_mixture(features)
    assert torch.equal(mean, comp_mean) and torch.equal(var, cond_var + noise_var)


def test_scale_is_saved_and_old_states_load_uncalibrated():
    net = _net()
    net.head.predictive_scale.fill_(2.0)
    state = net.state_dict()
    other = _net(seed=1)
    other.load_state_dict(state)
    assert float(other.head.predictive_scale) == 2.0
    old = {k: v for k, v in state.items() if not k.endswith("predictive_scale")}
    other.load_state_dict(old)  # strict: the missing key reads as scale 1
    assert float(other.head.predictive_scale) == 1.0


def test_fit_vgpn_calibrate_narrows_an_overdispersed_predictive():
    """The noise held at a start 10x the data's for the whole fit (``noise_warmup``): the
    predictive over-covers; the scale fitted on the validation rows brings fresh rows'
    coverage of the 90 % interval near 0.9 and raises their log density."""
    x, y = _data(600, seed=5)
    x_new, y_new = _data(2000, seed=6)
    results = []
    for calibrate in (False, True):
        pyro.clear_param_store()
        net = _net()
        with torch.no_grad():
            net.head.noise_std_unconstrained.fill_(math.log(1.0))
        fit = fit_vgpn(
            net,
            x[:450],
            y[:450],
            x[450:],
            y[450:],
            num_steps=150,
            noise_warmup=150,
            calibrate=calibrate,
        )
        with torch.no_grad():
            pred = net.head.predictive(net.hidden(x_new))
            inside = ((y_new - pred.mean).abs() <= 1.645 * pred.variance.sqrt()).double().mean()
            results.append((fit, float(inside), float(net.log_predictive(x_new, y_new).mean())))
    (raw, cover_raw, ll_raw), (cal, cover_cal, ll_cal) = results
    assert raw.predictive_scale is None and len(cal.predictive_scale) == 1
    assert cal.predictive_scale[0] < 0.5
    assert cover_raw > 0.99 and abs(cover_cal - 0.9) < 0.04
    assert ll_cal > ll_raw + 0.3
    assert raw.curve == cal.curve  # the fit itself is the same


def test_fit_vgpn_starts_from_scale_one():
    x, y = _data(100)
    net = _net()
    net.head.predictive_scale.fill_(5.0)
    fit_vgpn(net, x[:80], y[:80], x[80:], y[80:], num_steps=10)
    assert float(net.head.predictive_scale) == 1.0


def test_bad_calibration_requests_raise():
    x, y = _data(40)
    net = _net()
    with pytest.raises(ValueError, match="calibrate"):
        fit_vgpn(net, x, y, val_fraction=0.0, num_steps=5, calibrate=True)
    with pytest.raises(ValueError, match="calibrate must be"):
        fit_vgpn(net, x, y, num_steps=5, calibrate="yes")
    softmax = VariationalGPN([2, 4, 3], head=SoftmaxHead(4, 3, dtype=DT), dtype=DT)
    with pytest.raises(ValueError, match="labels"):
        fit_predictive_scale(softmax, x, torch.full((40,), 3))  # class 3 of 3
    with pytest.raises(ValueError, match="y"):
        fit_predictive_scale(softmax, x, y)  # float targets for a classifier
    headless = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="predictive scale"):
        fit_predictive_scale(headless, x, y)
    with pytest.raises(ValueError, match="bounds"):
        fit_predictive_scale(net, x, y, bounds=(2.0, 3.0))
    with pytest.raises(ValueError, match="y must be"):
        fit_predictive_scale(net, x, y[:30])
    with pytest.raises(ValueError, match="at least 2 rows"):
        fit_predictive_scale(net, x[:1], y[:1])
    bad = y.clone()
    bad[3] = float("nan")
    with pytest.raises(ValueError, match="y"):
        fit_predictive_scale(net, x, bad)


def test_a_scale_at_the_bound_warns():
    net = _net()
    x, y = _data(40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scale = fit_predictive_scale(net, x, 1e4 * y, bounds=(0.5, 2.0))
    assert float(scale) == pytest.approx(2.0, rel=0.02)
    assert any("bound" in str(w.message) for w in caught)


def test_a_scale_at_the_lower_bound_warns():
    """Targets at a tenth of a standard deviation from the predictive mean: the closed-form
    optimum ``sqrt(mean(z^2)) = 0.1`` lies below the searched range, so the fit stops at its
    lower end 0.5 and warns, as at the upper end."""
    net = _net()
    x, _ = _data(40)
    weights, mean, var = _unscaled_mixture(net, x)
    assert weights.shape == (1,)  # one Gaussian: the closed form holds
    signs = torch.ones(40, 1, dtype=DT)
    signs[::2] = -1.0
    y = mean[0] + 0.1 * var[0].sqrt() * signs  # z = +-0.1 on every row
    with pytest.warns(UserWarning, match=r"scale of output\(s\) \[0\] reached a bound"):
        scale = fit_predictive_scale(net, x, y, bounds=(0.5, 2.0))
    assert float(scale) == pytest.approx(0.5, rel=0.02)


# ------------------------------------------------------------------------ temperature scaling
class _Features(torch.nn.Module):
    """A stub network: the inputs are the features (their moments given), a softmax head."""

    def __init__(self, head: SoftmaxHead, var: torch.Tensor | None = None) -> None:
        super().__init__()
        self.head = head
        self.var = var

    def hidden(self, x):
        from pyro_gpn.moments.gaussian import Moments

        return Moments(x, var=None if self.var is None else self.var[: x.shape[0]])


def _numpy_log_probability(logits, weights, labels):
    """``T -> mean_s log sum_p w_p softmax(logits[s, p] / T)[y_s]`` in numpy."""

    def mean_log_probability(temperature):
        z = logits / temperature
        logp = z - logsumexp(z, axis=-1, keepdims=True)
        picked = np.take_along_axis(logp, labels[:, None, None].repeat(z.shape[1], 1), -1)[..., 0]
        return np.log(np.exp(picked) @ weights).mean()

    return mean_log_probability


def _classifier(features: int = 3, classes: int = 4, seed: int = 0, kappa=None) -> SoftmaxHead:
    torch.manual_seed(seed)
    return SoftmaxHead(features, classes, unscented_kappa=kappa, dtype=DT)


@pytest.mark.parametrize("random_features", [False, True])
def test_temperature_maximises_the_numpy_log_probability(random_features):
    """Point-mass features (the softmax of the logits) and Gaussian features (the unscented
    points ``mu +- sqrt(N + kappa) sd_i e_i``, written out in numpy, kappa 1): the fitted
    temperature is scipy's maximiser of the mean log probability of the labels."""
    gen = torch.Generator().manual_seed(7)
    rows, n, c, kappa = 300, 3, 4, 1.0
    x = torch.randn(rows, n, generator=gen, dtype=DT) * 2
    var = 0.5 * torch.rand(rows, n, generator=gen, dtype=DT) if random_features else None
    head = _classifier(n, c, kappa=kappa)
    with torch.no_grad():
        head.weight.mul_(3.0)
    with torch.no_grad():  # labels from softer probabilities than the head's: T near 2.5
        labels = torch.multinomial((head.readout(x) / 2.5).softmax(-1), 1, generator=gen)[:, 0]
    model = _Features(head, var)
    mu, w, b = x.numpy(), head.weight.detach().numpy(), head.bias.detach().numpy()
    if random_features:
        offsets = math.sqrt(n + kappa) * np.sqrt(var.numpy())[:, :, None] * np.eye(n)
        points = np.concatenate([mu[:, None], mu[:, None] + offsets, mu[:, None] - offsets], 1)
        weights = np.r_[kappa / (n + kappa), np.full(2 * n, 0.5 / (n + kappa))]
    else:
        points, weights = mu[:, None], np.ones(1)
    score = _numpy_log_probability(points @ w + b, weights, labels.numpy())
    best = minimize_scalar(
        lambda log_t: -score(math.exp(log_t)), bounds=(-4, 4), method="bounded",
        options={"xatol": 1e-10},
    )  # fmt: skip
    temperature = fit_predictive_scale(model, x, labels)
    assert temperature.shape == (1,)
    assert float(temperature) == pytest.approx(math.exp(best.x), rel=1e-5)
    torch.testing.assert_close(head.predictive_scale, temperature)
    # the head's own log predictive at the fitted temperature is the numpy score there
    with torch.no_grad():
        logp = head.log_predictive(model.hidden(x), labels).mean()
    assert float(logp) == pytest.approx(score(float(temperature)), rel=1e-10)


def test_temperature_undoes_overconfident_logits():
    """Labels drawn from ``softmax(l)`` while the model says ``softmax(3 l)``: the fitted
    temperature is near 3, and fresh rows' calibration error and log loss fall."""
    from pyro_gpn.metrics import expected_calibration_error

    gen = torch.Generator().manual_seed(8)
    head = _classifier(2, 3)
    model = _Features(head)

    def draw(rows):
        x = torch.randn(rows, 2, generator=gen, dtype=DT)
        with torch.no_grad():
            true_probs = (head.readout(x)).softmax(-1)
        return 3.0 * x, torch.multinomial(true_probs, 1, generator=gen).squeeze(-1)

    with torch.no_grad():
        head.weight.mul_(2.0)
    x_val, y_val = draw(4000)
    x_new, y_new = draw(4000)
    with torch.no_grad():
        raw = head.predict(model.hidden(x_new)).probs
        ll_raw = head.log_predictive(model.hidden(x_new), y_new).mean()
    temperature = float(fit_predictive_scale(model, x_val, y_val))
    with torch.no_grad():
        cal = head.predict(model.hidden(x_new)).probs
        ll_cal = head.log_predictive(model.hidden(x_new), y_new).mean()
    assert temperature == pytest.approx(3.0, rel=0.08)
    assert torch.equal(raw.argmax(-1), cal.argmax(-1))  # the decisions stay
    ece_raw = float(expected_calibration_error(raw, y_new))
    ece_cal = float(expected_calibration_error(cal, y_new))
    assert ece_raw > 0.08 and ece_cal < 0.03
    assert float(ll_cal) > float(ll_raw) + 0.05


def test_temperature_one_is_bit_identical_and_scales_every_point():
    """``T = 1``: the prediction of the head's points, unchanged to the bit; ``T = 2``: every
    sigma point's logits halved (and the logit moments of :meth:`predictive` too)."""
    net = VariationalGPN([2, 4, 3], head=_classifier(4, 3), dtype=DT)
    x, _ = _data(30, seed=9)
    with torch.no_grad():
        features = net.hidden(x)
        logits, weights = net.head.point_logits(features)
        manual = (weights.view(1, -1, 1) * logits.softmax(-1)).sum(1)
        assert torch.equal(net.head.predict(features).probs, manual)
        moments = net.head.predictive(features)
        net.head.predictive_scale.fill_(2.0)
        halved = (weights.view(1, -1, 1) * (logits / 2).softmax(-1)).sum(1)
        torch.testing.assert_close(net.head.predict(features).probs, halved, rtol=1e-14, atol=0)
        scaled = net.head.predictive(features)
    torch.testing.assert_close(scaled.mean, moments.mean / 2)
    torch.testing.assert_close(scaled.cov, moments.cov / 4)


def test_softmax_temperature_is_saved_and_old_states_load_at_one():
    net = VariationalGPN([2, 4, 3], head=_classifier(4, 3), dtype=DT)
    net.head.predictive_scale.fill_(0.5)
    state = net.state_dict()
    other = VariationalGPN([2, 4, 3], head=_classifier(4, 3, seed=1), dtype=DT)
    other.load_state_dict(state)
    assert float(other.head.predictive_scale) == 0.5
    old = {k: v for k, v in state.items() if not k.endswith("predictive_scale")}
    other.load_state_dict(old)
    assert float(other.head.predictive_scale) == 1.0


def test_fit_vgpn_calibrate_fits_a_classifiers_temperature():
    """``fit_vgpn(calibrate=True)`` on a softmax head: the temperature maximises the validation
    rows' log probability (no other temperature on a grid scores higher), and the fit itself
    is that of ``calibrate=False``."""
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(300, 2, generator=gen, dtype=DT)
    labels = (x[:, 0] + 0.3 * torch.randn(300, generator=gen, dtype=DT) > 0).long()
    fits = []
    for calibrate in (False, True):
        pyro.clear_param_store()
        torch.manual_seed(0)
        net = VariationalGPN([2, 4, 2], head=SoftmaxHead(4, 2, dtype=DT), dtype=DT)
        fits.append(
            fit_vgpn(net, x[:200], labels[:200], x[200:], labels[200:], num_steps=60,
                     calibrate=calibrate)
        )  # fmt: skip
    raw, cal = fits
    assert raw.predictive_scale is None and len(cal.predictive_scale) == 1
    assert raw.curve == cal.curve
    fitted = cal.predictive_scale[0]

    def val_score(t):
        net.head.predictive_scale.fill_(t)
        with torch.no_grad():
            return float(net.log_predictive(x[200:], labels[200:]).mean())

    best = val_score(fitted)
    assert all(best >= val_score(fitted * f) for f in (0.5, 0.8, 0.95, 1.05, 1.25, 2.0))


def test_predictive_scale_of_is_the_buffer_the_fit_writes():
    from pyro_gpn.inference import predictive_scale_of
    from pyro_gpn.models import NetworkEnsemble

    net = _net()
    assert predictive_scale_of(net) is net.head.predictive_scale
    ensemble = NetworkEnsemble([net, _net(seed=1)])
    assert predictive_scale_of(ensemble) is ensemble.predictive_scale
    with pytest.raises(ValueError, match="predictive scale"):
        predictive_scale_of(torch.nn.Linear(2, 1))
