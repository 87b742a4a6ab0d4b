"""Stacking predictive distributions: ``stacking_weights`` against scipy's constrained optimiser
on the same concave problem, and ``crossfitted_combination`` against its two halves written out
by hand."""

import math

import numpy as np
import pytest
import torch
from scipy import optimize, special

from pyro_gpn.inference import crossfitted_combination, stacking_weights


def _scipy_stacking(log_p: np.ndarray) -> tuple[np.ndarray, float]:
    """The stacking optimum by SLSQP over the simplex (an independent solver)."""
    k = log_p.shape[1]

    def negative(w):
        return -special.logsumexp(log_p + np.log(np.maximum(w, 1e-300)), axis=1).mean()

    best = None
    for start in (np.full(k, 1 / k), np.eye(k)[0] * 0.9 + 0.1 / k):
        res = optimize.minimize(
            negative,
            start,
            method="SLSQP",
            bounds=[(0, 1)] * k,
            constraints={"type": "eq", "fun": lambda w: w.sum() - 1},
            options={"ftol": 1e-14, "maxiter": 1000},
        )
        if best is None or res.fun < best.fun:
            best = res
    return best.x, -best.fun


def _mixed(log_p, w):
    return float(torch.logsumexp(torch.as_tensor(log_p) + w.log(), 1).mean())


def _gaussian_rows(seed: int, rows: int = 80):
    """Log densities of 4 Gaussian predictives of different means and spreads at rows drawn
    from a fifth: no model is best on every row, so the optimum is interior."""
    gen = np.random.default_rng(seed)
    y = gen.normal(0.0, 1.0, rows)
    means, sds = np.array([-0.5, 0.0, 0.4, 1.5]), np.array([0.6, 1.4, 0.8, 0.3])
    return -0.5 * np.log(2 * np.pi * sds**2) - 0.5 * ((y[:, None] - means) / sds) ** 2


@pytest.mark.parametrize("seed", range(4))
def test_weights_reach_scipys_optimum(seed):
    log_p = _gaussian_rows(seed)
    w = stacking_weights(torch.as_tensor(log_p))
    assert w.dtype == torch.float64 and bool((w >= 0).all())
    assert float(w.sum()) == pytest.approx(1.0, abs=1e-12)
    _, scipy_score = _scipy_stacking(log_p)
    assert _mixed(log_p, w) >= scipy_score - 1e-7
    assert int((w > 0.01).sum()) >= 2  # the problem is built to need a mixture


def test_a_model_best_on_every_row_takes_all_the_weight():
    gen = np.random.default_rng(1)
    log_p = gen.normal(-1.0, 0.3, (50, 3))
    log_p[:, 2] = log_p.max(1) + 2.0  # model 2 ahead on every row by a factor e^2
    w = stacking_weights(torch.as_tensor(log_p))
    assert float(w[2]) > 1 - 1e-6


def test_one_model_is_weight_one_and_equal_models_score_as_one():
    log_p = torch.as_tensor(_gaussian_rows(0)[:, :1])
    assert torch.equal(stacking_weights(log_p), torch.ones(1, dtype=torch.float64))
    twins = log_p.repeat(1, 3)
    w = stacking_weights(twins)
    assert _mixed(twins, w) == pytest.approx(float(log_p.mean()), abs=1e-12)


def test_rows_without_mass_under_one_model_are_allowed():
    log_p = torch.as_tensor(_gaussian_rows(2))
    log_p[:10, 3] = -math.inf  # model 3 gives ten rows no mass
    w = stacking_weights(log_p)
    assert math.isfinite(_mixed(log_p, w))
    _, scipy_score = _scipy_stacking(np.maximum(log_p.numpy(), -700.0))
    assert _mixed(log_p, w) >= scipy_score - 1e-7


@pytest.mark.parametrize(
    "log_p, kwargs, match",
    [
        (torch.zeros(5), {}, "log_densities"),
        (torch.zeros(0, 3), {}, "S >= 1"),
        (torch.tensor([[0.0, float("nan")]]), {}, "NaN"),
        (torch.tensor([[0.0, math.inf]]), {}, r"\+inf"),
        (torch.tensor([[0.0, -math.inf], [1.0, -math.inf]]), {}, "drop failed models"),
        (torch.tensor([[-math.inf, -math.inf], [1.0, 0.0]]), {}, "every row"),
        (torch.zeros(3, 2), {"max_steps": 0}, "max_steps"),
        (torch.zeros(3, 2), {"max_steps": True}, "max_steps"),
        (torch.zeros(3, 2), {"tol": -1.0}, "tol"),
    ],
)
def test_bad_input_is_named(log_p, kwargs, match):
    with pytest.raises(ValueError, match=match):
        stacking_weights(log_p, **kwargs)


def test_crossfitted_combination_is_its_two_halves_by_hand():
    log_p = torch.as_tensor(_gaussian_rows(3, rows=41))
    best, stacked = crossfitted_combination(log_p)
    even, odd = log_p[0::2], log_p[1::2]
    expected_best, expected_stacked = 0.0, 0.0
    for fit, held in ((even, odd), (odd, even)):
        share = held.shape[0] / log_p.shape[0]
        expected_best += share * float(held[:, int(fit.mean(0).argmax())].mean())
        w, _ = _scipy_stacking(fit.numpy())
        w = torch.as_tensor(np.clip(w, 1e-300, None))
        expected_stacked += share * _mixed(held, w / w.sum())
    assert best == pytest.approx(expected_best, abs=1e-12)
    assert stacked == pytest.approx(expected_stacked, abs=1e-6)
    with pytest.raises(ValueError, match="S >= 2"):
        crossfitted_combination(log_p[:1])


def test_crossfitting_leaves_out_a_model_without_mass_on_one_half():
    """A model finite on the odd rows only takes no part in the fit on the even half."""
    log_p = torch.as_tensor(_gaussian_rows(1, rows=20))
    log_p[0::2, 3] = -math.inf
    best, stacked = crossfitted_combination(log_p)
    assert math.isfinite(stacked)
    odd_fit = stacking_weights(log_p[1::2])
    even_fit = torch.cat([stacking_weights(log_p[0::2, :3]), torch.zeros(1, dtype=log_p.dtype)])
    expected = 0.5 * _mixed(log_p[1::2], even_fit) + 0.5 * _mixed(log_p[0::2], odd_fit)
    assert stacked == pytest.approx(expected, abs=1e-12)


def test_crossfitted_choice_is_made_on_the_other_half():
    """Model 0 is ahead on every even row, model 1 on every odd one: the even half chooses 0
    and the odd rows score it, the odd half chooses 1 and the even rows score it (written out:
    ``0.5 * -3 + 0.5 * -2``). Choosing on the scored half would report ``0.5 * -1 + 0.5 * 0``."""
    log_p = torch.tensor([[0.0, -2.0], [-3.0, -1.0]], dtype=torch.float64).repeat(3, 1)
    best, _ = crossfitted_combination(log_p)
    assert best == pytest.approx(-2.5, abs=1e-12)
