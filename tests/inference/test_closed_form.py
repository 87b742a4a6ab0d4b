"""ClosedFormELBO: equality with Trace_ELBO, Pyro interface, gradients, a fit.

The central claim: for one GPN layer with observed inputs (regression) the closed-form ELBO is
the exact expectation of Pyro's ``Trace_ELBO`` on ``VariationalGPN.model`` / ``.guide``; the
tests assert agreement within 4 Monte Carlo standard errors, with enough particles that the
standard error is a small fraction of the KL term (so that dropping the KL, or a wrong KL
constant, would fail).

With two layers the closed form replaces the hidden activations by Gaussians
(``eq:gpn_vi_qal``) and is an approximation: ``test_two_layers_gap_after_training`` (slow)
reports the measured gap after training and asserts only a loose bound.
"""

import math
import time
from dataclasses import replace

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import Adam
from torch.func import functional_call

from pyro_gpn.heads import HeteroscedasticGaussianHead, SoftmaxHead
from pyro_gpn.inference.closed_form import (
    ClosedFormELBO,
    closed_form_elbo,
    predictive_log_likelihood,
)
from pyro_gpn.models.variational import VariationalGPN

DT = torch.float64


@pytest.fixture(autouse=True)
def _fresh_param_store():
    pyro.clear_param_store()
    with pyro.validation_enabled(True):
        yield
    pyro.clear_param_store()


def _regression_data(n=20, m=2, seed=0, dtype=DT):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, m, dtype=dtype, generator=gen) * 2 - 1
    y = torch.sin(3 * x[:, :1]) + 0.1 * torch.randn(n, 1, dtype=dtype, generator=gen)
    return x, y


def _net(sizes, seed=0, **kwargs):
    torch.manual_seed(seed)
    kwargs.setdefault("targets_scale_init", 0.3)
    kwargs.setdefault("noise_std_init", 0.3)
    return VariationalGPN(sizes, dtype=DT, **kwargs)


def _trace_elbo_batches(vgpn, x, y, batches=40, particles=500):
    """Negative-ELBO estimates: ``batches`` independent means of ``particles`` particles."""
    elbo = Trace_ELBO(num_particles=particles, vectorize_particles=True, max_plate_nesting=1)
    with torch.no_grad():
        return torch.tensor([elbo.loss(vgpn.model, vgpn.guide, x, y) for _ in range(batches)])


ONE_LAYER = [
    dict(),
    dict(whiten=True),
    dict(q_cov="diag"),
    dict(q_cov="diag", whiten=True),
    dict(share="layer"),
    dict(mode="cov"),
    dict(num_data=40),
    dict(weight_scale_init=0.8),  # q(W) of a wide spread: its moments must be exact too
    dict(weight_scale_init=0.8, mode="cov", whiten=True),
    dict(weights="point"),
]


@pytest.mark.parametrize("kwargs", ONE_LAYER)
def test_one_layer_closed_form_equals_trace_elbo_expectation(kwargs):
    pyro.set_rng_seed(0)
    vgpn = _net([2, 2], **kwargs)
    x, y = _regression_data()
    y = torch.cat([y, -y], dim=1)
    if "num_data" in kwargs:
        x, y = x[:10], y[:10]
    closed = ClosedFormELBO(vgpn).loss(vgpn.model, vgpn.guide, x, y)
    estimates = _trace_elbo_batches(vgpn, x, y)
    mean, se = estimates.mean().item(), estimates.std().item() / math.sqrt(len(estimates))
    kl = vgpn.kl_divergence().item()
    assert 4 * se < 0.1 * kl, "the Monte Carlo comparison must resolve the KL term"
    assert abs(closed - mean) < 4 * se, f"closed {closed:.4f}, MC {mean:.4f} +- {se:.4f}"


def test_closed_form_is_kl_minus_scaled_expected_log_likelihood():
    vgpn = _net([2, 3, 1], num_data=50)
    x, y = _regression_data(n=10)
    ell = vgpn.expected_log_likelihood(x, y)
    expected = vgpn.kl_divergence() - 5.0 * ell.sum()
    loss = ClosedFormELBO(vgpn).differentiable_loss(vgpn.model, vgpn.guide, x, y)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(ClosedFormELBO(vgpn).loss(None, None, x, y), expected.item())
    torch.testing.assert_close(-closed_form_elbo(vgpn, x, y), expected)


@pyro.settings.context(module_local_params=True)
def test_whitened_and_plain_parametrisations_give_the_same_elbo():
    plain = _net([2, 3, 1], targets_init="random", whiten=False)
    white = _net([2, 3, 1], whiten=True)
    white.load_state_dict(plain.state_dict(), strict=False)
    with torch.no_grad():
        for lp, lw in zip(plain.layers, white.layers, strict=True):
            chol = lp.prior_scale_tril()
            lw.targets_loc.copy_(
                torch.linalg.solve_triangular(chol, lp.targets_loc[..., None], upper=False)[..., 0]
            )
            lw.targets_scale_tril = torch.linalg.solve_triangular(
                chol, lp.targets_scale_tril, upper=False
            )
    x, y = _regression_data()
    torch.testing.assert_close(closed_form_elbo(white, x, y), closed_form_elbo(plain, x, y))


def test_svi_step_updates_every_parameter():
    vgpn = _net([2, 3, 4], head="softmax")
    x, _ = _regression_data()
    y = torch.randint(0, 4, (20,))
    before = {k: v.detach().clone() for k, v in vgpn.named_parameters()}
    svi = SVI(vgpn.model, vgpn.guide, Adam({"lr": 0.01}), ClosedFormELBO(vgpn))
    loss = svi.step(x, y)
    assert math.isfinite(loss)
    # PyroModule names, and pyro.module names ("head$$$weight") for the plain head module
    store = {name.replace("$$$", ".") for name in pyro.get_param_store().keys()}
    for name, value in vgpn.named_parameters():
        assert not torch.equal(value, before[name]), f"{name} was not updated"
        assert name.removesuffix("_unconstrained") in store or name in store


def test_elbo_module_for_module_local_params():
    x, y = _regression_data()
    with pyro.settings.context(module_local_params=True):
        vgpn = _net([2, 2, 1])
        module = ClosedFormELBO(vgpn)(vgpn.model, vgpn.guide)
        loss = module(x, y)
        torch.testing.assert_close(loss, -closed_form_elbo(vgpn, x, y))
        loss.backward()
    assert vgpn.layers[0].targets_loc.grad is not None


def test_model_must_belong_to_a_variational_gpn():
    vgpn = _net([2, 1])
    x, y = _regression_data()
    with pytest.warns(DeprecationWarning, match="ClosedFormELBO"):
        deprecated = ClosedFormELBO()  # finds its network from the bound model, for one release
    torch.testing.assert_close(
        deprecated.loss(vgpn.model, vgpn.guide, x, y), ClosedFormELBO(vgpn).loss(None, None, x, y)
    )
    with pytest.raises(ValueError, match="VariationalGPN"):
        deprecated.loss(lambda x, y: None, vgpn.guide, x, y)
    with pytest.raises(ValueError, match="same"):
        deprecated.loss(vgpn.model, _net([2, 1]).guide, x, y)
    with pytest.raises(ValueError, match="observations"):
        ClosedFormELBO(vgpn).loss(vgpn.model, vgpn.guide, x)
    with pytest.raises(TypeError):
        ClosedFormELBO(object())


class _Loss(torch.nn.Module):
    def __init__(self, vgpn, x, y, objective=closed_form_elbo):
        super().__init__()
        self.vgpn, self.x, self.y, self.objective = vgpn, x, y, objective

    def forward(self):
        return -self.objective(self.vgpn, self.x, self.y)


@pytest.mark.parametrize(
    "sizes, kwargs, objective",
    [
        ([2, 2], dict(), closed_form_elbo),
        ([2, 2, 1], dict(whiten=True), closed_form_elbo),
        ([2, 2, 3], dict(head="softmax", q_cov="diag"), closed_form_elbo),
        ([2, 2, 1], dict(weight_scale_init=0.5, mode="cov"), closed_form_elbo),
        ([2, 2, 1], dict(whiten=True), predictive_log_likelihood),
        ([2, 2, 3], dict(head="softmax", q_cov="diag"), predictive_log_likelihood),
    ],
)
@pyro.settings.context(module_local_params=True)
def test_gradcheck_closed_form_loss_wrt_variational_parameters(sizes, kwargs, objective):
    """float64 gradcheck of the negative ELBO (and of the predictive objective) in q(U) and
    q(W) (``weight``: the mean of q(W); ``weight_scale_unconstrained``: its log standard
    deviation)."""
    vgpn = _net(sizes, num_inducing=4, **kwargs)
    x, y = _regression_data(n=4)
    if isinstance(vgpn.head, SoftmaxHead):
        y = torch.tensor([0, 2, 1, 2])
    else:
        y = y.expand(-1, sizes[-1]).contiguous()
    loss = _Loss(vgpn, x, y, objective)
    params = dict(loss.named_parameters())
    names = [
        n for n in params if n.startswith("vgpn.layers") and (".targets_" in n or ".weight" in n)
    ]
    inputs = tuple(params[n].detach().clone().requires_grad_() for n in names)
    assert len(inputs) == 4 * vgpn.num_layers  # targets loc/scale, weight loc/scale

    def fn(*values):
        return functional_call(loss, dict(zip(names, values, strict=True)), ())

    grads = torch.autograd.grad(fn(*inputs), inputs)
    assert all(g.abs().sum() > 0 for g in grads)  # the substitution reaches the loss
    assert torch.autograd.gradcheck(fn, inputs)


def test_predictive_objective_is_the_log_of_the_expected_likelihood():
    """With one GPN layer and point weights ``F`` is exactly Gaussian under ``Q``, so the
    predictive objective's data term ``sum_s log E_Q[p(y_s | F_s)]`` must equal the log of the
    Monte Carlo mean of the likelihood over draws of the model's own ``F`` (Pyro's
    ``Predictive`` on model and guide), within the Monte Carlo error; the ELBO's data term
    ``E_Q[log p]`` lies far below it (Jensen), a gap the comparison resolves."""
    pyro.set_rng_seed(0)
    vgpn = _net([2, 2], weights="point")
    x, y = _regression_data()
    y = torch.cat([y, -y], dim=1)
    draws = vgpn.sample_predictive(x, num_samples=8000)["layer0.response"]  # [K, S, 2]
    log_lik = torch.distributions.Normal(draws, vgpn.head.noise_std.detach()).log_prob(y)
    mc = (torch.logsumexp(log_lik, 0) - math.log(draws.shape[0])).sum()
    lik = log_lik.exp()
    se = (lik.std(0) / (lik.mean(0) * math.sqrt(draws.shape[0]))).square().sum().sqrt()
    with torch.no_grad():
        closed = vgpn.log_predictive(x, y).sum()
        kl = vgpn.kl_divergence()
        torch.testing.assert_close(predictive_log_likelihood(vgpn, x, y), closed - kl)
        gap = closed - vgpn.expected_log_likelihood(x, y).sum()
    assert 4 * se < 0.1 * gap, "the Monte Carlo comparison must resolve the Jensen gap"
    assert abs(closed - mc) < 4 * se, f"closed {closed:.4f}, MC {mc:.4f} +- {se:.4f}"


def _net_and_rows(sizes, kwargs):
    """A network of ``sizes`` (``num_data`` 40) and 10 rows: regression targets, or labels for
    a softmax head."""
    vgpn = _net(sizes, num_data=40, **kwargs)
    x, y = _regression_data(n=10)
    if isinstance(vgpn.head, SoftmaxHead):
        y = torch.arange(10) % 3
    return vgpn, x, y


@pytest.mark.parametrize(
    "sizes, kwargs",
    [
        ([2, 3, 1], dict()),
        ([2, 3, 1], dict(weight_scale_init=0.8, mode="cov")),
        ([2, 3, 1], dict(head=HeteroscedasticGaussianHead(1, dtype=DT))),
        ([2, 3, 3], dict(head="softmax")),
    ],
)
def test_predictive_objective_lies_above_the_elbo_by_jensen(sizes, kwargs):
    """``log E[p] >= E[log p]`` row by row, so the predictive objective is at least the ELBO
    (the same KL) for every head -- strictly, where ``F`` has spread; both scale the data term
    by ``num_data / B`` alike."""
    vgpn, x, y = _net_and_rows(sizes, kwargs)
    with torch.no_grad():
        pll = predictive_log_likelihood(vgpn, x, y)
        elbo = closed_form_elbo(vgpn, x, y)
        rows = vgpn.log_predictive(x, y) - vgpn.expected_log_likelihood(x, y)
    assert (rows > 0).all(), rows
    torch.testing.assert_close(pll - elbo, 4.0 * rows.sum())


@pytest.mark.parametrize(
    "sizes, kwargs",
    [
        ([2, 3, 1], dict()),
        ([2, 3, 1], dict(head=HeteroscedasticGaussianHead(1, dtype=DT))),
        ([2, 3, 3], dict(head="softmax")),
    ],
)
def test_predictive_objective_ignores_the_predictive_scale(sizes, kwargs):
    """A training objective: the calibration scale fitted after training (temperature,
    sigma-scale) must not enter it; the test log-likelihood does use it."""
    vgpn, x, y = _net_and_rows(sizes, kwargs)
    with torch.no_grad():
        before = predictive_log_likelihood(vgpn, x, y)
        scored = vgpn.log_predictive(x, y)
        vgpn.head.predictive_scale.fill_(2.0)
        torch.testing.assert_close(predictive_log_likelihood(vgpn, x, y), before, rtol=0, atol=0)
        assert not torch.allclose(vgpn.log_predictive(x, y), scored)


def test_predictive_objective_rejects_empty_or_unlabelled_batches():
    vgpn = _net([2, 1])
    x, y = _regression_data(n=5)
    with pytest.raises(ValueError, match="observations y"):
        predictive_log_likelihood(vgpn, x)
    with pytest.raises(ValueError, match="0 samples"):
        predictive_log_likelihood(vgpn, x[:0], y[:0])
    with pytest.raises(ValueError, match="y"):
        vgpn.log_predictive(x, y[:3])


def test_fit_vgpn_predictive_objective_calibrates_where_the_elbo_overdisperses():
    """Under the ELBO the fitted noise absorbs ``Var[F]`` (its optimum is ``E[(y - F)^2]``), so
    the predictive ``Var[F] + sigma^2`` counts it twice; the predictive objective fits the
    predictive itself. On ``sin(3 x_1) x_2`` plus noise 0.1 (150 rows, ``[2, 10, 1]``, 1000
    steps, seed 0; 2,000 fresh rows) measured: mean squared standardised error 0.857 (ELBO)
    against 1.041, test log-likelihood 0.017 against 0.774."""
    from pyro_gpn.inference import fit_vgpn

    def data(n, seed):
        gen = torch.Generator().manual_seed(seed)
        x = torch.rand(n, 2, dtype=DT, generator=gen) * 2 - 1
        return x, torch.sin(3 * x[:, :1]) * x[:, 1:] + 0.1 * torch.randn(
            n, 1, dtype=DT, generator=gen
        )

    (x, y), (x_val, y_val), (x_test, y_test) = data(150, 1), data(100, 2), data(2000, 3)
    scores = {}
    for elbo in ("closed_form", "predictive"):
        torch.manual_seed(0)
        vgpn = VariationalGPN([2, 10, 1], dtype=DT)
        fit_vgpn(vgpn, x, y, x_val, y_val, num_steps=1000, elbo=elbo, seed=0)
        with torch.no_grad():
            predictive = vgpn(x_test)
            z2 = ((y_test - predictive.mean).square() / predictive.variance).mean()
            scores[elbo] = float(z2), float(vgpn.log_predictive(x_test, y_test).mean())
    assert scores["closed_form"][0] < 0.9
    assert abs(scores["predictive"][0] - 1) < 0.1
    assert scores["predictive"][1] > scores["closed_form"][1] + 0.3


def _sin_data(n, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=gen) * 2 - 1
    return x, torch.sin(3 * x) + 0.1 * torch.randn(n, 1, generator=gen)


def test_svi_with_closed_form_fits_a_sine():
    """300 Adam steps (lr 0.02) on 200 noisy samples of sin(3x): measured RMSE 0.039 against
    the noise-free function (float32, seed 0); asserted below 0.06."""
    x, y = _sin_data(200, 0)
    grid = torch.linspace(-1, 1, 101)[:, None]
    pyro.set_rng_seed(0)
    vgpn = VariationalGPN([1, 1])
    svi = SVI(vgpn.model, vgpn.guide, Adam({"lr": 0.02}), ClosedFormELBO(vgpn))
    start = time.perf_counter()
    losses = [svi.step(x, y) for _ in range(300)]
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        pred = vgpn(grid)
    rmse = (pred.mean - torch.sin(3 * grid)).square().mean().sqrt().item()
    assert losses[-1] < losses[0]
    assert rmse < 0.06, f"RMSE {rmse:.4f} after 300 steps ({elapsed:.1f} s)"
    noise = vgpn.noise_std.item()
    assert 0.05 < noise < 0.2  # the data's noise is 0.1


@pytest.mark.slow
@pytest.mark.parametrize("whiten", [False, True])
def test_two_layers_gap_after_training(whiten):
    """Two layers: the closed form treats the second layer's activations as Gaussian.

    A ``[1, 3, 1]`` network after 600 closed-form Adam steps (lr 0.02, float64, seed 0) on 200
    noisy samples of ``sin(3x)``; negative ELBO, closed form vs the mean of 20000 Trace_ELBO
    particles. Measured (``pytest -m slow -s -k two_layers``): whiten=False 14.441 vs
    14.333 +- 0.040 (gap 0.108 nats, 2.7 SE: a real, small bias of the Gaussian activations);
    whiten=True -77.669 vs -77.676 +- 0.039 (gap 0.007 nats, 0.2 SE). Asserted: the gap is
    below 0.5 nats (on 200 samples).
    """
    x, y = _sin_data(200, 0)
    x, y = x.to(DT), y.to(DT)
    pyro.set_rng_seed(0)
    vgpn = VariationalGPN([1, 3, 1], whiten=whiten, dtype=DT)
    svi = SVI(vgpn.model, vgpn.guide, Adam({"lr": 0.02}), ClosedFormELBO(vgpn))
    for _ in range(600):
        svi.step(x, y)
    closed = ClosedFormELBO(vgpn).loss(vgpn.model, vgpn.guide, x, y)
    estimates = _trace_elbo_batches(vgpn, x, y)
    mean, se = estimates.mean().item(), estimates.std().item() / math.sqrt(len(estimates))
    print(f"\nwhiten={whiten}: closed {closed:.3f}, Trace_ELBO {mean:.3f} +- {se:.3f}")
    assert abs(closed - mean) < 0.5


# ---------------------------------------------------------------------------------- fit_vgpn
def test_fit_vgpn_restores_the_best_validation_state_and_stops_on_patience():
    from pyro_gpn.inference import fit_vgpn
    from pyro_gpn.inference.closed_form import validation_log_lik

    x, y = _regression_data(n=60, seed=3)
    x_val, y_val = _regression_data(n=20, seed=4)
    vgpn = _net([2, 4, 1])
    # a large learning rate that keeps decaying slowly overshoots: the curve is not monotone
    fit = fit_vgpn(
        vgpn, x, y, x_val, y_val, num_steps=120, lr=0.3, lr_decay=1.0, eval_every=5, patience=3
    )
    values = [v for _, v in fit.curve]
    assert fit.best_val_log_lik == max(values)
    assert dict(fit.curve)[fit.best_step] == fit.best_val_log_lik
    # the restored state is the best one (not the last)
    assert validation_log_lik(vgpn, x_val, y_val) == pytest.approx(fit.best_val_log_lik, abs=1e-9)
    if fit.stopped_early:
        assert fit.num_steps < 120 and len(values) - values.index(max(values)) - 1 == 4
    assert vgpn.num_data == 60 and fit.num_val == 20 and len(fit.losses) == fit.num_steps


def test_fit_vgpn_holds_out_validation_rows_inside_the_training_data():
    from pyro_gpn.inference import fit_vgpn
    from pyro_gpn.inference.closed_form import holdout

    x, y = _regression_data(n=50, seed=5)
    xt, yt, xv, yv = holdout(x, y, 0.2, seed=1)
    assert xt.shape[0] == 40 and xv.shape[0] == 10
    rows = {tuple(r.tolist()) for r in x}
    assert {tuple(r.tolist()) for r in torch.cat([xt, xv])} == rows  # a partition
    assert not {tuple(r.tolist()) for r in xt} & {tuple(r.tolist()) for r in xv}
    fit = fit_vgpn(_net([2, 2, 1]), x, y, num_steps=10, eval_every=5, val_fraction=0.2)
    assert fit.num_train == 40 and fit.num_val == 10 and [s for s, _ in fit.curve] == [5, 10]
    none = fit_vgpn(_net([2, 2, 1]), x, y, num_steps=4, val_fraction=0.0)
    assert none.num_val == 0 and none.curve == [] and none.best_step == 4


def test_fit_vgpn_lowers_the_negative_elbo_and_reads_the_recommendations():
    from pyro_gpn.inference import fit_vgpn
    from pyro_gpn.recommended import VGPN

    x, y = _regression_data(n=40, seed=6)
    vgpn = VariationalGPN([2, 3, 1], dtype=DT)
    assert vgpn.layers[0].response.whiten is VGPN.whiten
    assert vgpn.layers[0].weight_treatment == VGPN.weights
    assert vgpn.layers[0].response.targets_init == VGPN.targets_init
    fit = fit_vgpn(vgpn, x, y, num_steps=60, val_fraction=0.0)
    assert fit.losses[-1] < fit.losses[0] - 0.2
    assert VGPN.batch_for(10**5) == VGPN.large_batch_size and VGPN.batch_for(100) is None


@pytest.mark.parametrize("elbo", ["predictive", "closed_form"])
def test_fit_vgpn_objective_defaults_to_the_recommendation(monkeypatch, elbo):
    """Without ``elbo`` the first step's loss is the recommended objective's, per sample, on
    the untouched start: ``-predictive_log_likelihood / S`` or ``-closed_form_elbo / S``."""
    import pyro_gpn.recommended as recommended
    from pyro_gpn.inference import fit_vgpn

    monkeypatch.setattr(recommended, "VGPN", replace(recommended.VGPN, elbo=elbo))
    x, y = _regression_data(n=30, seed=4)
    objective = {"predictive": predictive_log_likelihood, "closed_form": closed_form_elbo}[elbo]
    with torch.no_grad():
        expected = -objective(_net([2, 3, 1]), x, y, num_data=30) / 30
    fit = fit_vgpn(_net([2, 3, 1]), x, y, num_steps=1, val_fraction=0.0)
    assert math.isclose(fit.losses[0], float(expected), rel_tol=1e-9)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_steps=0), "num_steps"),
        (dict(lr=-1.0), "lr"),
        (dict(lr_decay=0.0), "lr_decay"),
        (dict(patience=-1), "patience"),
        (dict(noise_warmup=-1), "noise_warmup"),
        (dict(noise_warmup=2.5), "noise_warmup"),
        (dict(eval_every=0), "eval_every"),
        (dict(batch_size=0), "batch_size"),
        (dict(val_fraction=1.5), "val_fraction"),
        (dict(elbo="trace_meanfield"), "elbo"),
        (dict(elbo="predictive", num_particles=2), "num_particles"),
        (dict(elbo="trace", num_particles=0), "num_particles"),
        (dict(num_particles=4), "num_particles"),
    ],
)
def test_fit_vgpn_rejects_bad_arguments(kwargs, match):
    from pyro_gpn.inference import fit_vgpn

    x, y = _regression_data(n=20)
    with pytest.raises(ValueError, match=match):
        fit_vgpn(_net([2, 1]), x, y, **kwargs)
    with pytest.raises(ValueError, match="x_val"):
        fit_vgpn(_net([2, 1]), x, y, x_val=x)


def test_fit_vgpn_noise_warmup_holds_the_noise_then_trains_it():
    """``noise_warmup=K``: for the first ``K`` steps the head's noise keeps its initial value
    and every other parameter takes exactly the steps of a fit with the noise frozen by hand;
    after them the noise trains."""
    from pyro_gpn.inference import fit_vgpn

    x, y = _regression_data(n=30, seed=3)
    warm = _net([2, 3, 1])
    start = warm.head.noise_std.detach().clone()
    fit_vgpn(warm, x, y, num_steps=6, val_fraction=0.0, noise_warmup=6)
    assert torch.equal(warm.head.noise_std.detach(), start)
    frozen = _net([2, 3, 1])
    frozen.head.noise_std_unconstrained.requires_grad_(False)
    fit_vgpn(frozen, x, y, num_steps=6, val_fraction=0.0)
    moved = 0
    for (name, a), b in zip(warm.state_dict().items(), frozen.state_dict().values()):
        assert torch.equal(a, b), name
        moved += not torch.equal(a, _net([2, 3, 1]).state_dict()[name])
    assert moved >= 3  # the targets, their scales and the weights trained
    later = _net([2, 3, 1])
    fit_vgpn(later, x, y, num_steps=8, val_fraction=0.0, noise_warmup=6)
    assert not torch.equal(later.head.noise_std.detach(), start)


def test_fit_vgpn_trace_elbo_estimates_the_closed_form_objective():
    """``elbo="trace"``: the first step's loss is Pyro's ``Trace_ELBO`` estimate of the same
    per-sample negative ELBO (one GPN layer: the closed form is its exact expectation), so its
    mean over many particles lands on the closed-form loss within the Monte Carlo error; the
    particles are drawn afresh (two seeds give different losses)."""
    from pyro_gpn.inference import fit_vgpn

    x, y = _regression_data(n=30, seed=8)
    closed = fit_vgpn(
        _net([2, 3, 1]), x, y, num_steps=1, val_fraction=0.0, elbo="closed_form"
    ).losses[0]
    sampled = []
    for seed in range(4):
        fit = fit_vgpn(
            _net([2, 3, 1]), x, y, num_steps=1, val_fraction=0.0, elbo="trace",
            num_particles=2000, seed=seed,
        )  # fmt: skip
        sampled.append(fit.losses[0])
    mean = sum(sampled) / len(sampled)
    spread = (sum((v - mean) ** 2 for v in sampled) / (len(sampled) - 1)) ** 0.5
    assert spread > 0
    assert abs(mean - closed) < 5 * spread / len(sampled) ** 0.5 + 1e-3


def test_fit_vgpn_trace_elbo_fits_as_well_as_the_closed_form():
    """Same model, schedule and stopping rule; only the objective differs. On a noisy sine
    the sampled objective learns (validation log-likelihood well above the start), and the
    deterministic closed form, free of the sampled objective's gradient noise, is at least as
    good after the same 300 steps (measured: 0.82 against 0.42)."""
    from pyro_gpn.inference import fit_vgpn
    from pyro_gpn.inference.closed_form import validation_log_lik

    x, y = _regression_data(n=80, seed=9)
    x_val, y_val = _regression_data(n=40, seed=10)
    start = validation_log_lik(_net([2, 4, 1]), x_val, y_val)
    common = dict(num_steps=300, lr=0.05, eval_every=10, patience=10)
    closed = fit_vgpn(_net([2, 4, 1]), x, y, x_val, y_val, elbo="closed_form", **common)
    trace = fit_vgpn(_net([2, 4, 1]), x, y, x_val, y_val, elbo="trace", num_particles=4, **common)
    assert trace.best_val_log_lik > start + 0.3
    assert closed.best_val_log_lik > trace.best_val_log_lik - 0.05


def test_fit_vgpn_checks_the_data_once_on_entry():
    from pyro_gpn.inference import fit_vgpn

    x, y = _regression_data(n=20)
    y[3] = float("nan")
    with pytest.raises(ValueError, match="y"):
        fit_vgpn(_net([2, 1]), x, y, num_steps=3, val_fraction=0.0)


def test_fit_vgpn_stops_on_a_non_finite_gradient_keeping_the_last_parameters():
    """The step loop runs without value checks; one reduction over the gradients still finds a
    NaN in any of them, before the optimiser moves anything, and validation is on again after."""
    from pyro_gpn import settings
    from pyro_gpn.inference import fit_vgpn

    x, y = _regression_data(n=20)
    vgpn = _net([2, 2, 1])
    target = vgpn.layers[0].response.targets_loc
    target.register_hook(lambda grad: grad.clone().index_fill_(-1, torch.tensor([0]), math.nan))
    before = {k: v.clone() for k, v in vgpn.state_dict().items()}
    with pytest.raises(FloatingPointError, match="non-finite loss or gradient at step 1"):
        fit_vgpn(vgpn, x, y, num_steps=3, val_fraction=0.0)
    assert all(torch.equal(v, before[k]) for k, v in vgpn.state_dict().items())
    assert settings.is_validation_enabled()


def test_fit_vgpn_classifies_with_a_softmax_head_and_scores_validation_by_log_prob():
    """The classification route of the benchmark (``benchmarks/bayes_classification.py``):
    ``fit_vgpn`` on a softmax VGPN learns three separated blobs, and the validation score it
    stops on is the mean log-probability of the labels under the closed-form predictive."""
    from pyro_gpn.inference import fit_vgpn
    from pyro_gpn.inference.closed_form import validation_log_lik

    gen = torch.Generator().manual_seed(7)
    centres = torch.tensor([[0.2, 0.2], [0.8, 0.2], [0.5, 0.8]], dtype=DT)

    def blobs(n):
        labels = torch.arange(n) % 3
        return centres[labels] + 0.08 * torch.randn(n, 2, dtype=DT, generator=gen), labels

    x, y = blobs(150)
    x_val, y_val = blobs(60)
    vgpn = VariationalGPN([2, 4, 3, 3], head="softmax", dtype=DT)
    before = validation_log_lik(vgpn, x_val, y_val)
    fit = fit_vgpn(vgpn, x, y, x_val, y_val, num_steps=300, eval_every=10, patience=30)
    probs = vgpn.predict(x_val).mean
    assert torch.allclose(probs.sum(-1), torch.ones(60, dtype=DT), atol=1e-9)
    by_hand = float(probs[torch.arange(60), y_val].log().mean())
    assert fit.best_val_log_lik == pytest.approx(by_hand, abs=1e-9)
    assert before < math.log(0.5) < fit.best_val_log_lik  # from near chance to confident
    assert float((probs.argmax(-1) != y_val).double().mean()) <= 0.05


def _labels(n=20, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, 2, dtype=DT, generator=gen), torch.randint(0, 3, (n,), generator=gen)


@pytest.mark.parametrize(
    "labels, kwargs, match",
    [
        (lambda y: y + 100, dict(), r"y must hold class labels in \[0, 3\)"),
        (lambda y: y - 5, dict(), r"y must hold class labels in \[0, 3\)"),
        (lambda y: y + 100, dict(val_fraction=0.0), r"y must hold class labels in \[0, 3\)"),
        (lambda y: y.double(), dict(), "y must hold integer class labels"),
    ],
    ids=["above", "negative", "no-validation", "float"],
)
def test_fit_vgpn_refuses_labels_outside_the_heads_classes(labels, kwargs, match):
    """The loop turns validation off: out-of-range labels used to train silently (the loss
    reached -1252 with ``val_fraction=0``); the range is checked once on entry, always."""
    from pyro_gpn import settings
    from pyro_gpn.inference import fit_vgpn

    x, y = _labels()
    vgpn = VariationalGPN([2, 3, 3], head="softmax", dtype=DT)
    with settings.validation(False), pytest.raises(ValueError, match=match):
        fit_vgpn(vgpn, x, labels(y), num_steps=2, **kwargs)


def test_fit_vgpn_refuses_validation_labels_outside_the_heads_classes():
    from pyro_gpn.inference import fit_vgpn

    x, y = _labels()
    vgpn = VariationalGPN([2, 3, 3], head="softmax", dtype=DT)
    with pytest.raises(ValueError, match=r"y_val must hold class labels in \[0, 3\)"):
        fit_vgpn(vgpn, x, y, x_val=x[:5], y_val=y[:5] + 10, num_steps=2)


@pytest.mark.parametrize("rows", [25, 15])
@pytest.mark.parametrize("val_fraction", [None, 0.0])
def test_fit_vgpn_needs_one_target_row_per_input_row(rows, val_fraction):
    """The hold-out indexed ``y`` by ``x``'s rows: 25 rows trained silently on 20 of them,
    15 raised an IndexError inside the hold-out."""
    from pyro_gpn.inference import fit_vgpn

    x, _ = _regression_data(n=20)
    _, y = _regression_data(n=rows)
    with pytest.raises(ValueError, match=r"y must have one row per row of x \(20\)"):
        fit_vgpn(_net([2, 1]), x, y, num_steps=2, val_fraction=val_fraction)


@pytest.mark.parametrize(
    "x_val, y_val, match",
    [
        (lambda x: x[:0], lambda y: y[:0], "x_val has 0 rows"),
        (lambda x: x[:5], lambda y: y[:4], "y_val must have one row per row of x_val"),
        (lambda x: x[:5], lambda y: y[:5, 0], "y_val must have one row per row of x_val"),
        (lambda x: torch.ones(5, 3, dtype=DT), lambda y: y[:5], "x_val must have x's 2 columns"),
    ],
    ids=["empty", "rows", "trailing-shape", "columns"],
)
def test_fit_vgpn_checks_the_validation_rows(x_val, y_val, match):
    """An empty validation set returned ``curve=[(3, nan)]`` and ``best_val_log_lik=-inf``."""
    from pyro_gpn.inference import fit_vgpn

    x, y = _regression_data(n=20)
    with pytest.raises(ValueError, match=match):
        fit_vgpn(_net([2, 1]), x, y, x_val(x), y_val(y), num_steps=2)


@pytest.mark.parametrize("objective", [closed_form_elbo, predictive_log_likelihood])
@pytest.mark.parametrize("num_data", [0, -5, 2.5])
def test_objectives_refuse_a_num_data_that_is_not_a_positive_integer(objective, num_data):
    """They returned a finite value, scaled by ``0 / B`` or ``-5 / B``."""
    x, y = _regression_data(n=20)
    with pytest.raises(ValueError, match="num_data must be a positive integer"):
        objective(_net([2, 1]), x, y, num_data=num_data)


# ------------------------------------------------------------- fit_vgpn: schedule and batches
def test_fit_vgpn_mini_batch_loss_is_the_per_sample_objective_scaled_by_num_data():
    """With identical rows every mini-batch has the same data term, so the first step's loss
    is known by hand whatever rows are drawn: ``-(S/B * B * ell - KL) / S = -ell + KL / S``
    per sample (a batch scaled by ``B`` instead of ``S``, or its KL weighted by ``1 / B``,
    gives another value)."""
    from pyro_gpn.inference import fit_vgpn

    x, y = _regression_data(n=1, seed=2)
    x, y = x.expand(40, -1).contiguous(), y.expand(40, -1).contiguous()
    for elbo in ("closed_form", "predictive"):
        start = _net([2, 3, 1])
        with torch.no_grad():
            if elbo == "closed_form":
                row = float(start.expected_log_likelihood(x[:1], y[:1]))
            else:
                row = float(start.log_predictive(x[:1], y[:1], calibrated=False))
            expected = -row + float(start.kl_divergence()) / 40
        fit = fit_vgpn(
            _net([2, 3, 1]), x, y, num_steps=1, batch_size=10, val_fraction=0.0, elbo=elbo
        )
        assert math.isclose(fit.losses[0], expected, rel_tol=1e-9), (elbo, fit.losses[0])


def test_fit_vgpn_draws_mini_batches_from_all_the_rows():
    """With a learning rate too small to move anything, each step's loss is
    ``-mean(ell over the batch) + KL / S``; over many steps its mean is the full-batch loss
    within the Monte Carlo error of sampling rows. The rows are ordered best fitted first,
    so batches of always the same (first) rows land far from it."""
    from pyro_gpn.inference import fit_vgpn

    x, y = _regression_data(n=24, seed=11)
    start = _net([2, 3, 1])
    with torch.no_grad():
        ell = start.expected_log_likelihood(x, y)
        kl = float(start.kl_divergence())
    order = ell.argsort(descending=True)
    x, y, ell = x[order], y[order], ell[order]
    steps, batch = 200, 6
    fit = fit_vgpn(
        _net([2, 3, 1]), x, y, num_steps=steps, batch_size=batch, lr=1e-12,
        val_fraction=0.0, elbo="closed_form", seed=3,
    )  # fmt: skip
    losses = torch.tensor(fit.losses, dtype=DT)
    full = float(-ell.mean() + kl / 24)
    # the batch mean of B rows drawn without replacement from S
    se = math.sqrt(float(ell.var()) / batch * (24 - batch) / 23 / steps)
    assert losses.std() > 0  # the batches differ
    assert abs(float(losses.mean()) - full) < 4 * se, (float(losses.mean()), full, se)


def test_fit_vgpn_learning_rate_decays_over_the_run(monkeypatch):
    """Step ``t`` (1-based) of ``num_steps`` runs at ``lr * lr_decay^((t - 1) / num_steps)``:
    the first at ``lr``, the rate reaching ``lr * lr_decay`` after the last."""
    from pyro_gpn.inference import fit_vgpn

    seen = []

    class Recording(torch.optim.Adam):
        def step(self, closure=None):
            seen.append(self.param_groups[0]["lr"])
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "Adam", Recording)
    x, y = _regression_data(n=20)
    fit_vgpn(_net([2, 2, 1]), x, y, num_steps=10, lr=0.1, lr_decay=0.01, val_fraction=0.0)
    expected = [0.1 * 0.01 ** (t / 10) for t in range(10)]
    assert len(seen) == 10
    for got, want in zip(seen, expected, strict=True):
        assert math.isclose(got, want, rel_tol=1e-9), (seen, expected)


def test_fit_vgpn_releases_the_noise_on_the_step_after_the_warmup():
    """``noise_warmup=K``: step ``K + 1`` is the noise's first Adam step, whose size is the
    learning rate (Adam's first update is ``lr * g / (|g| + eps)``); one step after the
    warm-up the log noise has moved by exactly ``lr``."""
    from pyro_gpn.inference import fit_vgpn

    x, y = _regression_data(n=30, seed=3)
    vgpn = _net([2, 3, 1])
    start = vgpn.head.noise_std_unconstrained.detach().clone()
    fit_vgpn(vgpn, x, y, num_steps=5, lr=0.01, lr_decay=1.0, val_fraction=0.0, noise_warmup=4)
    moved = (vgpn.head.noise_std_unconstrained.detach() - start).abs()
    torch.testing.assert_close(moved, torch.full_like(moved, 0.01), rtol=1e-5, atol=0)


def _scripted_validation(monkeypatch, values):
    """Replace the validation score by ``values`` in turn; returns the list of the network's
    states at each evaluation (deep copies)."""
    import copy

    import pyro_gpn.inference.closed_form as closed_form_module

    states, scores = [], iter(values)

    def scripted(vgpn, x_val, y_val):
        states.append(copy.deepcopy(vgpn.state_dict()))
        return next(scores)

    monkeypatch.setattr(closed_form_module, "validation_log_lik", scripted)
    return states


@pytest.mark.parametrize(
    "values, patience, best, evaluations",
    [
        # improvements interleaved with setbacks: the count restarts at every improvement
        ([0.0, -1.0, 1.0, 0.5, 2.0, 1.0, 1.5, 3.0, 2.0, 2.0, 2.0], 2, 8, 11),
        # a tie is no improvement: the first of equal scores is kept
        ([1.0, 1.0, 1.0, 0.0], 2, 1, 4),
        # patience 0: the first evaluation without improvement stops
        ([0.0, 1.0, 0.5, 9.0], 0, 2, 3),
    ],
)
def test_fit_vgpn_stopping_rule_and_restored_state_on_a_scripted_curve(
    monkeypatch, values, patience, best, evaluations
):
    """The loop stops once more than ``patience`` evaluations in a row brought no
    improvement, and restores the state of the best evaluation (by hand on scripted
    scores)."""
    from pyro_gpn.inference import fit_vgpn

    states = _scripted_validation(monkeypatch, values + [-math.inf] * 10)
    x, y = _regression_data(n=30, seed=5)
    vgpn = _net([2, 2, 1])
    fit = fit_vgpn(
        vgpn, x, y, x[:5], y[:5], num_steps=100, eval_every=2, patience=patience, lr=0.05
    )
    assert len(fit.curve) == evaluations
    assert [s for s, _ in fit.curve] == [2 * (i + 1) for i in range(evaluations)]
    assert fit.stopped_early and fit.num_steps == 2 * evaluations
    assert fit.best_step == 2 * best and fit.best_val_log_lik == values[best - 1]
    restored = vgpn.state_dict()
    for name, value in states[best - 1].items():
        assert torch.equal(restored[name], value), name
    assert not all(torch.equal(restored[k], v) for k, v in states[-1].items())


def test_fit_vgpn_evaluates_at_the_last_step_off_the_grid(monkeypatch):
    """Every ``eval_every`` steps and at the last: 7 steps, every 5 -> steps 5 and 7; a best
    last evaluation is the state kept."""
    from pyro_gpn.inference import fit_vgpn

    states = _scripted_validation(monkeypatch, [0.0, 1.0])
    x, y = _regression_data(n=30, seed=5)
    vgpn = _net([2, 2, 1])
    fit = fit_vgpn(vgpn, x, y, x[:5], y[:5], num_steps=7, eval_every=5, patience=3)
    assert fit.curve == [(5, 0.0), (7, 1.0)] and fit.best_step == 7 and not fit.stopped_early
    assert all(torch.equal(vgpn.state_dict()[k], v) for k, v in states[1].items())


def test_fit_vgpn_stops_on_a_non_finite_loss_with_finite_gradients():
    """A target of 1e155 overflows the squared error: the loss is infinite, and with the noise
    held (``noise_warmup``) the only non-finite gradient, the noise's, is dropped; the loss
    itself must stop the fit before the optimiser steps."""
    from pyro_gpn.inference import fit_vgpn

    x, y = _regression_data(n=20)
    y[4] = 1e155
    vgpn = _net([2, 2, 1])
    before = {k: v.clone() for k, v in vgpn.state_dict().items()}
    with pytest.raises(FloatingPointError, match="non-finite loss or gradient at step 1"):
        fit_vgpn(vgpn, x, y, num_steps=3, val_fraction=0.0, noise_warmup=3, elbo="closed_form")
    assert all(torch.equal(v, before[k]) for k, v in vgpn.state_dict().items())
