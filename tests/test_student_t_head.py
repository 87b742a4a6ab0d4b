"""The Student-t head: its scale mixture against scipy's t density, its expected NLL and
predictive density against numerical integration, its moments against Monte Carlo, gradients,
the Pyro observation site, bad arguments, and a fit that must see through outliers."""

import math

import numpy as np
import pyro
import pytest
import torch
from scipy import integrate, stats

from pyro_gpn import Moments, StudentTHead
from pyro_gpn.inference import fit_predictive_scale, fit_vgpn
from pyro_gpn.losses import (
    check_student_t_df,
    student_t_expected_nll,
    student_t_scale_mixture,
)
from pyro_gpn.models import VariationalGPN
from tests.mc import assert_mc_mean

DT = torch.float64

pytestmark = pytest.mark.usefixtures("fresh_param_store")


def _head(df=4.0, scale=0.3, num_outputs=1, **kwargs):
    head = StudentTHead(num_outputs, df=df, dtype=DT, **kwargs)
    with torch.no_grad():
        head.noise_scale_unconstrained.fill_(math.log(scale))
    return head


def _features(mean, std):
    mean = torch.as_tensor(mean, dtype=DT).reshape(-1, 1)
    std = torch.as_tensor(std, dtype=DT).reshape(-1, 1).expand_as(mean)
    return Moments(mean, var=std.square())


@pytest.mark.parametrize("df", [2.5, 3.0, 4.0, 10.0, 100.0])
def test_scale_mixture_is_the_t_density_far_into_its_tails(df):
    """The trapezoid rule over log lambda against scipy's t log density from the centre to 1e4
    scales out (where a Gauss-Laguerre rule of 32 nodes is already 5 nats off at 20)."""
    log_weights, factors = student_t_scale_mixture(df)
    weights = log_weights.exp()
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-12)
    r = torch.tensor([0.0, 0.5, 1.0, 3.0, 10.0, 30.0, 100.0, 1e3, 1e4], dtype=DT)
    comp = torch.distributions.Normal(0.0, factors.sqrt()[:, None]).log_prob(r)
    mixture = torch.logsumexp(log_weights[:, None] + comp, 0)
    expected = torch.as_tensor(stats.t.logpdf(r.numpy(), df), dtype=DT)
    assert float((mixture - expected).abs().max()) < 5e-7
    # the noise's variance factor nu / (nu - 2), within the rule's accuracy
    assert float((weights * factors).sum()) == pytest.approx(df / (df - 2), rel=1e-7)


@pytest.mark.parametrize("df", [4.0, 30.0])
@pytest.mark.parametrize(("ratio", "rtol"), [(0.0, 1e-12), (0.1, 1e-10), (1.0, 1e-6), (2.0, 2e-4)])
def test_expected_nll_matches_numerical_integration(df, ratio, rtol):
    """``E_F[-log t(y - F)]`` by Gauss-Hermite against ``scipy.integrate.quad``, within the
    accuracy the docstring states, for targets at the mean and 16 scales away."""
    scale, mu = 0.3, 0.2
    head = _head(df, scale)
    ys = [0.2, 0.5, 1.5, 5.0]
    sd = ratio * scale
    features = _features([mu] * len(ys), sd)
    y = torch.tensor(ys, dtype=DT).reshape(-1, 1)
    with torch.no_grad():
        got = head.expected_nll(features, y, reduction="none")
    for i, t in enumerate(ys):
        if sd == 0:
            ref = -stats.t.logpdf(t - mu, df, 0, scale)
        else:
            ref = integrate.quad(
                lambda f, t=t: -stats.t.logpdf(t - f, df, 0, scale) * stats.norm.pdf(f, mu, sd),
                mu - 12 * sd,
                mu + 12 * sd,
                points=[t],
                epsabs=1e-13,
                epsrel=1e-13,
                limit=500,
            )[0]
        assert float(got[i]) == pytest.approx(ref, rel=rtol)


@pytest.mark.parametrize(
    ("mean", "std", "y"),
    [
        (0.1, 0.05, 0.3),  # a narrow F
        (0.1, 0.05, 4.0),  # a target 13 scales off: the t's tail, not a Gaussian's
        (-0.3, 2.0, 1.0),  # an F much wider than the noise (where the ELBO's rule loses)
        (0.0, 0.0, 50.0),  # a point mass: the t itself
    ],
)
def test_log_predictive_is_the_convolution_of_f_and_the_t(mean, std, y):
    """``log int N(f | mean, std^2) t_4(y - f | 0, 0.3) df`` by ``quad``, to 1e-6."""
    df, scale = 4.0, 0.3
    head = _head(df, scale)
    with torch.no_grad():
        got = float(head.log_predictive(_features([mean], std), torch.tensor([[y]], dtype=DT)))
    if std == 0:
        ref = stats.t.logpdf(y - mean, df, 0, scale)
    else:
        ref = math.log(
            integrate.quad(
                lambda f: stats.norm.pdf(f, mean, std) * stats.t.pdf(y - f, df, 0, scale),
                mean - 14 * std,
                mean + 14 * std,
                points=[y] if abs(y - mean) < 14 * std else None,
                epsabs=0,
                epsrel=1e-12,
                limit=500,
            )[0]
        )
    assert got == pytest.approx(ref, abs=1e-6)


def test_predictive_moments_match_monte_carlo_and_the_mixture():
    """The predictive's mean and variance (``Var[F] + sigma^2 nu / (nu - 2)``) against draws
    of ``F + eps``, and against the moments of the predictive mixture itself."""
    head = _head(df=5.0, scale=0.4)
    features = Moments(
        torch.tensor([[0.3], [-1.0]], dtype=DT), var=torch.tensor([[0.2], [0.01]], dtype=DT)
    )
    g = torch.Generator().manual_seed(0)
    f = features.mean + features.variance.sqrt() * torch.randn(400_000, 2, 1, generator=g)
    eps = torch.distributions.StudentT(5.0, 0.0, 0.4).sample((400_000, 2, 1))
    y = (f + eps).squeeze(-1)
    with torch.no_grad():
        predictive = head.predictive(features)
        weights, mean, var = head.predictive_mixture(features)
    assert_mc_mean(y, predictive.mean.squeeze(-1), n_se=5.0)
    assert_mc_mean((y - predictive.mean.squeeze(-1)).square(), predictive.variance.squeeze(-1))
    mixture_var = torch.einsum("k,ksd->sd", weights, var)
    torch.testing.assert_close(mixture_var, predictive.variance, rtol=1e-6, atol=0)
    torch.testing.assert_close(mean[0], predictive.mean)


def test_gradcheck():
    """Both objectives in float64, with respect to the features' moments and the log scale
    (the head's parameter swapped for a plain tensor so that gradcheck can perturb it)."""
    head = _head(df=4.0, scale=0.3, num_outputs=2)
    del head.noise_scale_unconstrained
    y = torch.randn(3, 2, dtype=DT) * 2

    def objectives(mean, log_var, log_scale):
        head.noise_scale_unconstrained = log_scale
        features = Moments(mean, var=log_var.exp())
        return head.expected_nll(features, y, reduction="none"), head.log_predictive(features, y)

    mean = torch.randn(3, 2, dtype=DT, requires_grad=True)
    log_var = (torch.rand(3, 2, dtype=DT) * 0.05).log().requires_grad_()
    log_scale = torch.full((2,), math.log(0.3), dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(objectives, (mean, log_var, log_scale))


def test_head_parameter_receives_gradients_through_both_objectives():
    head = _head()
    features = _features([0.0, 1.0], [0.1, 0.2])
    y = torch.tensor([[0.5], [3.0]], dtype=DT)
    for loss in (head.expected_nll(features, y), -head.log_predictive(features, y).mean()):
        (grad,) = torch.autograd.grad(loss, head.noise_scale_unconstrained)
        assert torch.isfinite(grad).all() and float(grad.abs().sum()) > 0


@pytest.mark.parametrize("df", [4.0, 30.0, 100.0])
def test_float32_log_predictive_is_the_t_far_out(df):
    """Targets up to 1e4 scales from the mean, in float32: the log weights keep the far
    components whose weights underflow there (at nu = 100 a float32 weight would price a target
    100 scales out 124 nats too low), also after the head is cast with ``.double()``."""
    scale = 0.3
    r = torch.tensor([0.0, 3.0, 50.0, 100.0, 300.0, 1e3, 1e4])
    y = (r * scale).reshape(-1, 1)
    features = Moments(torch.zeros(len(r), 1), var=torch.zeros(len(r), 1))
    expected = torch.as_tensor(stats.t.logpdf(r.double().numpy(), df) - math.log(scale), dtype=DT)
    head32 = StudentTHead(1, df=df, noise_scale_init=scale, dtype=torch.float32)
    lp32 = head32.log_predictive(features, y)
    assert torch.isfinite(lp32).all()
    torch.testing.assert_close(lp32.double(), expected, rtol=1e-5, atol=1e-4)
    f64 = Moments(features.mean.double(), var=features.variance.double())
    lp64 = head32.double().log_predictive(f64, y.double())
    torch.testing.assert_close(lp64, expected, rtol=1e-6, atol=1e-5)


def test_gradient_is_finite_at_a_point_mass():
    """Deterministic responses (``Var[F] = 0``): the expected NLL's gradient with respect to the
    variance is finite (a plain ``sqrt`` gives ``-inf``)."""
    head = _head()
    var = torch.zeros(2, 1, dtype=DT, requires_grad=True)
    features = Moments(torch.tensor([[0.0], [1.0]], dtype=DT), var=var)
    loss = head.expected_nll(features, torch.tensor([[0.5], [3.0]], dtype=DT))
    (grad,) = torch.autograd.grad(loss, var)
    assert torch.isfinite(grad).all()


def test_state_saved_under_another_df_is_refused():
    state = _head(df=4.0).state_dict()
    assert float(state["degrees_of_freedom"]) == 4.0
    _head(df=4.0).load_state_dict(state)
    with pytest.raises(ValueError, match="df=4"):
        _head(df=30.0).load_state_dict(state)


def test_observation_site_is_the_student_t():
    head = _head(df=6.0, scale=0.2, num_outputs=2)
    features = torch.randn(5, 2, dtype=DT)
    site = head.observation(features)
    y = torch.randn(5, 2, dtype=DT)
    expected = stats.t.logpdf(
        (y - features).numpy(), 6.0, 0, float(head.noise_scale.detach()[0])
    ).sum(-1)
    torch.testing.assert_close(site.log_prob(y), torch.as_tensor(expected, dtype=DT))


def test_variational_gpn_runs_every_objective_with_the_head():
    """The closed-form ELBO, the predictive objective and Pyro's sampled ``Trace_ELBO`` all run
    on a network with the head (the observation site is a Student-t)."""
    torch.manual_seed(0)
    x = torch.randn(30, 2, dtype=DT)
    y = x[:, :1].sin() + 0.1 * torch.randn(30, 1, dtype=DT)
    for elbo in ("closed_form", "predictive", "trace"):
        pyro.clear_param_store()
        model = VariationalGPN([2, 3, 1], head=StudentTHead(1, dtype=DT), dtype=DT)
        fit = fit_vgpn(model, x, y, num_steps=5, lr=0.01, elbo=elbo, val_fraction=0.0, seed=0)
        assert math.isfinite(fit.losses[-1])
    trace = pyro.poutine.trace(model.model).get_trace(x, y)
    assert isinstance(trace.nodes["obs"]["fn"].base_dist, torch.distributions.StudentT)


def test_fit_sees_through_outliers():
    """A sine with noise 0.1 and 6 % of its targets moved by 3-6 units. The Student-t head's
    fitted scale stays near the true noise and its network scores higher on clean held-out rows
    than the same network with a Gaussian head, whose noise swells to cover the outliers (300
    steps of the closed-form ELBO: noise std 0.17 against 0.51, test log-likelihood 0.74
    against -0.39)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(360, 1, dtype=DT, generator=g) * 4 - 2
    y = torch.sin(2 * x) + 0.1 * torch.randn(360, 1, dtype=DT, generator=g)
    x_tr, y_tr, x_te, y_te = x[:260], y[:260].clone(), x[260:], y[260:]
    bad = torch.randperm(260, generator=g)[:16]
    y_tr[bad] += (3 + 3 * torch.rand(16, 1, dtype=DT, generator=g)) * torch.sign(
        torch.randn(16, 1, dtype=DT, generator=g)
    )
    scores, noise = {}, {}
    for name, head in (("t", StudentTHead(1, df=4.0, dtype=DT)), ("gauss", "gaussian")):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = VariationalGPN([1, 6, 1], head=head, dtype=DT)
        fit_vgpn(
            model, x_tr, y_tr, num_steps=300, lr=0.05, val_fraction=0.0, seed=0,
            elbo="closed_form",
        )  # fmt: skip
        noise[name] = float(model.head.noise_std.detach())
        with torch.no_grad():
            scores[name] = float(model.log_predictive(x_te, y_te).mean())
    assert noise["t"] < 0.2 < noise["gauss"]
    assert scores["t"] > scores["gauss"] + 0.3


def test_calibration_scales_the_mixture():
    """The predictive scale multiplies every component's variance by ``s^2`` (one component
    mean: the centre stays), and ``fit_predictive_scale`` accepts the head."""
    head = _head()
    features = _features([0.0, 1.0], [0.1, 0.2])
    _, _, var = head.predictive_mixture(features)
    head.predictive_scale.fill_(2.0)
    _, mean2, var2 = head.predictive_mixture(features)
    torch.testing.assert_close(var2, 4 * var)
    torch.testing.assert_close(mean2[0], features.mean)
    torch.testing.assert_close(
        head.predictive(features).variance, 4 * (features.var + head.noise_std**2)
    )
    # fit_predictive_scale finds the maximum of the held-out log density over the scale
    torch.manual_seed(0)
    model = VariationalGPN([1, 3, 1], head=StudentTHead(1, dtype=DT), dtype=DT)
    x = torch.randn(40, 1, dtype=DT)
    y = x.sin() + 0.3 * torch.randn(40, 1, dtype=DT)
    scale = float(fit_predictive_scale(model, x, y))
    grid = torch.logspace(-2, 2, 801, dtype=DT)
    scores = []
    for s in grid:
        model.head.predictive_scale.fill_(float(s))
        with torch.no_grad():
            scores.append(float(model.log_predictive(x, y).mean()))
    best = float(grid[max(range(len(grid)), key=scores.__getitem__)])
    assert scale == pytest.approx(best, rel=0.02)


def test_calibrated_false_is_the_t_at_scale_one_whatever_the_predictive_scale():
    """A point-mass ``F`` and a predictive scale of 2: the calibrated predictive is the t of
    scale ``2 sigma`` (a t stretched about its centre is a t), ``calibrated=False`` the t of
    scale ``sigma`` (scipy both), and the unscaled mixture's variance is ``sigma^2 nu / (nu -
    2)``, not four times it."""
    df, sigma = 5.0, 0.3
    head = _head(df, sigma)
    head.predictive_scale.fill_(2.0)
    features = _features([0.4, -1.0, 0.0], 0.0)
    y = torch.tensor([[0.5], [2.0], [-3.0]], dtype=DT)
    r = (y - features.mean).numpy()
    with torch.no_grad():
        calibrated = head.log_predictive(features, y)
        raw = head.log_predictive(features, y, calibrated=False)
        weights, mean, var = head.predictive_mixture(features, calibrated=False)
    want = torch.as_tensor(stats.t.logpdf(r, df, 0, 2 * sigma), dtype=DT)
    torch.testing.assert_close(calibrated, want.reshape(-1), rtol=0, atol=1e-6)
    want_raw = torch.as_tensor(stats.t.logpdf(r, df, 0, sigma), dtype=DT)
    torch.testing.assert_close(raw, want_raw.reshape(-1), rtol=0, atol=1e-6)
    torch.testing.assert_close(mean[0], features.mean)
    mixture_var = torch.einsum("k,ksd->sd", weights, var)
    torch.testing.assert_close(
        mixture_var, torch.full_like(mixture_var, sigma**2 * df / (df - 2)), rtol=1e-6, atol=0
    )


def test_shared_noise_is_one_scale_for_every_output():
    head = StudentTHead(3, df=4.0, noise_scale_init=0.2, shared=True, dtype=DT)
    assert head.noise_scale_unconstrained.shape == (1,)
    assert sum(p.numel() for p in head.parameters()) == 1
    with torch.no_grad():
        head.noise_scale_unconstrained.fill_(math.log(0.5))
    features = Moments(torch.zeros(2, 3, dtype=DT), var=torch.zeros(2, 3, dtype=DT))
    # every output's noise variance is 0.5^2 * 4 / 2, from the one shared scale
    torch.testing.assert_close(
        head.predictive(features).variance, torch.full((2, 3), 0.5, dtype=DT)
    )
    assert StudentTHead(3, shared=False).noise_scale_unconstrained.shape == (3,)


@pytest.mark.parametrize("df", [2.4, 0.5, 101.0, float("nan"), True, "4"])
def test_df_out_of_range_is_refused_by_name(df):
    with pytest.raises(ValueError, match="df must be"):
        check_student_t_df(df)
    with pytest.raises(ValueError, match="df must be"):
        StudentTHead(1, df=df)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_outputs": 0}, "num_outputs"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"noise_scale_init": 0.0}, "noise_scale_init"),
        ({"noise_scale_init": float("inf")}, "noise_scale_init"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        StudentTHead(**{"num_outputs": 1, **kwargs})


def test_df_accepts_any_real_number():
    assert check_student_t_df(np.float32(4.0)) == 4.0
    assert check_student_t_df(torch.tensor(5.0)) == 5.0
    assert StudentTHead(1, df=np.int64(3)).df == 3.0


def test_evaluate_scores_the_heads_own_predictive():
    """``pyro_gpn.inference.evaluate`` reports the head's log predictive density (the t's
    scale mixture), not a Gaussian with the predictive's moments."""
    from pyro_gpn.inference import evaluate

    torch.manual_seed(0)
    model = VariationalGPN([1, 3, 1], head=StudentTHead(1, dtype=DT), dtype=DT)
    x = torch.randn(20, 1, dtype=DT)
    y = x.sin()
    y[0] += 5.0
    with torch.no_grad():
        expected = float(model.log_predictive(x, y).mean())
        gaussian = float(
            torch.distributions.Normal(model.predict(x).mean, model.predict(x).std)
            .log_prob(y)
            .mean()
        )
    got = evaluate(model, x, y)["log_likelihood"]
    assert got == pytest.approx(expected, rel=1e-10)
    assert abs(got - gaussian) > 0.1


def test_marginal_likelihood_is_refused_for_the_head():
    from pyro_gpn.models import ParametricGPN

    with pytest.raises(ValueError, match="likelihood='marginal'"):
        ParametricGPN([1, 2, 1], head=StudentTHead(1), likelihood="marginal")


def test_bad_targets_and_scale_name_the_argument():
    features = _features([0.0, 1.0], [0.1, 0.2])
    with pytest.raises(ValueError, match="target"):
        student_t_expected_nll(features, torch.tensor([[0.0], [float("nan")]], dtype=DT), 0.3, 4.0)
    with pytest.raises(ValueError, match="noise_scale"):
        student_t_expected_nll(features, torch.zeros(2, 1, dtype=DT), -0.3, 4.0)
    with pytest.raises(ValueError, match="num_nodes"):
        student_t_expected_nll(features, torch.zeros(2, 1, dtype=DT), 0.3, 4.0, num_nodes=0)


# --------------------------------------------------------- the heteroscedastic head's t noise
def _het_t(df=4.0, offset=-2.0, slope=1.0, floor=0.0):
    from pyro_gpn.heads import HeteroscedasticGaussianHead

    head = HeteroscedasticGaussianHead(1, df=df, noise_floor=floor, dtype=DT)
    with torch.no_grad():
        head.noise_offset.fill_(offset)
        head.noise_slope.fill_(slope)
    return head


def _pair(mean_f, mean_h, var_f, var_h, corr):
    c = corr * math.sqrt(var_f * var_h)
    cov = torch.tensor([[[var_f, c], [c, var_h]]], dtype=DT)
    return Moments(torch.tensor([[mean_f, mean_h]], dtype=DT), cov=cov)


def _normal_pdf(x: float, mean: float, sd: float) -> float:
    """The normal density in plain ``math``: scipy's ``stats`` costs ~50 us a scalar call, and
    ``quad`` calls it tens of thousands of times."""
    return math.exp(-0.5 * ((x - mean) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))


def _t_logpdf(x: float, df: float, scale: float) -> float:
    """Student's t log density (location 0) in plain ``math``, written from its definition."""
    z = x / scale
    return (
        math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
        - math.log(scale) - (df + 1) / 2 * math.log1p(z * z / df)
    )  # fmt: skip


def test_plain_math_densities_are_scipys():
    for x, m, s in [(0.3, -0.2, 0.7), (4.0, 0.1, 0.37)]:
        assert _normal_pdf(x, m, s) == pytest.approx(stats.norm.pdf(x, m, s), rel=1e-13)
        assert _t_logpdf(x, 4.0, s) == pytest.approx(stats.t.logpdf(x, 4.0, 0, s), rel=1e-13)


def _nested_quad(fn, features, head):
    """``E[fn(F, G)]`` for the jointly Gaussian ``(F, G = a + b H)`` of one row, by nested
    ``quad`` (``G`` outside, ``F | G`` inside)."""
    a, b = float(head.noise_offset.detach()), float(head.noise_slope.detach())
    mf, mh = (float(v) for v in features.mean[0])
    cov = features.cov[0].double()
    mg, vg = a + b * mh, b * b * float(cov[1, 1])
    cfg = b * float(cov[0, 1])
    sg = math.sqrt(vg)

    def inner(g):
        m = mf + cfg / vg * (g - mg)
        s = math.sqrt(max(float(cov[0, 0]) - cfg * cfg / vg, 0.0))
        val = integrate.quad(lambda f: fn(f, g) * _normal_pdf(f, m, s), m - 12 * s,
                             m + 12 * s, epsabs=0, epsrel=1e-11, limit=300)[0]  # fmt: skip
        return val * _normal_pdf(g, mg, sg)

    return integrate.quad(inner, mg - 10 * sg, mg + 10 * sg, epsabs=0, epsrel=1e-10, limit=300)[0]


@pytest.mark.parametrize(("corr", "y"), [(0.0, 0.3), (0.8, 4.0)])
def test_heteroscedastic_t_log_predictive_and_expected_nll_match_quadrature(corr, y):
    """Both against nested ``quad`` over ``(F, G)``: the predictive (a Gauss-Hermite mixture
    over ``G`` of the t's scale mixtures) to 1e-6 in the log density, the expected NLL
    (Gauss-Hermite over ``G`` and ``F | G``) to 1e-6 relative; a target 4 units off with a noise
    scale near 0.37 is 11 scales out."""
    df, floor = 4.0, 0.05
    head = _het_t(df, floor=floor)
    features = _pair(0.1, 0.0, 0.02, 0.3, corr)
    target = torch.tensor([[y]], dtype=DT)

    def scale(g):
        return math.sqrt(math.exp(g) + floor**2)

    dens = _nested_quad(lambda f, g: math.exp(_t_logpdf(y - f, df, scale(g))), features, head)
    nll = _nested_quad(lambda f, g: -_t_logpdf(y - f, df, scale(g)), features, head)
    with torch.no_grad():
        assert float(head.log_predictive(features, target)) == pytest.approx(
            math.log(dens), abs=1e-6
        )
        assert float(head.expected_nll(features, target)) == pytest.approx(nll, rel=1e-6)


def test_heteroscedastic_t_predictive_moments_and_observation():
    head = _het_t(df=5.0)
    features = _pair(0.2, 0.5, 0.05, 0.4, 0.5)
    with torch.no_grad():
        predictive = head.predictive(features)
        weights, mean, var = head.predictive_mixture(features)
    mix_mean = torch.einsum("k,ksd->sd", weights, mean)
    mix_var = torch.einsum("k,ksd->sd", weights, var + mean.square()) - mix_mean.square()
    torch.testing.assert_close(mix_mean, predictive.mean, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(mix_var, predictive.variance, rtol=1e-6, atol=0)
    site = head.observation(torch.tensor([[0.1, 0.2]], dtype=DT))
    assert isinstance(site.base_dist, torch.distributions.StudentT)
    state = head.state_dict()
    with pytest.raises(ValueError, match="df=5"):
        _het_t(df=4.0).load_state_dict(state)


def test_heteroscedastic_t_network_fits_on_every_objective():
    from pyro_gpn.heads import HeteroscedasticGaussianHead

    torch.manual_seed(0)
    x = torch.randn(30, 2, dtype=DT)
    y = x[:, :1].sin() + 0.1 * torch.randn(30, 1, dtype=DT)
    for elbo in ("closed_form", "predictive", "trace"):
        pyro.clear_param_store()
        head = HeteroscedasticGaussianHead(1, df=4.0, dtype=DT)
        model = VariationalGPN([2, 3, 1], head=head, dtype=DT)
        fit = fit_vgpn(model, x, y, num_steps=5, lr=0.01, elbo=elbo, val_fraction=0.0, seed=0)
        assert math.isfinite(fit.losses[-1])
