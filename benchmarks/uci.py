"""UCI regression benchmark on the fixed splits (issue 15): Bayesian GPN vs peers, side by side.

Protocol (Hernandez-Lobato & Adams 2015; Gal & Ghahramani 2016): the fixed train / test splits
of ``uci-regression/<set>`` (20 per set, 5 for protein); inputs and targets standardised with
the training split's statistics; a seeded 10 % of the training split held out for validation,
which every choice (early stopping, the dropout rate) is made on; test log-likelihood, RMSE and
the coverage of the central 90 % predictive interval in original units, mean +- standard error
over the splits. Every model's predictive is a mixture of Gaussians ``[T, S]`` (``T = 1`` for
the closed-form Gaussian models; equal weights unless the model gives its own, as the
Gauss-Hermite mixture of ``bgpn_het``) scored by the single function :func:`metrics_of`.

Models (hidden width 50, 100 for protein):

* ``bgpn``: the closed-form variational GPN ``[D, 50, 1]`` (the Bayesian GPN:
  :class:`pyro_gpn.models.VariationalGPN` with its default variational weights, trained by
  :func:`pyro_gpn.inference.fit_vgpn`) with the library's recommendations
  (:data:`pyro_gpn.recommended.VGPN`, ``BGPN_CONFIG``): full batch on the small sets,
  mini-batches of 512 on the large ones (``LARGE``);
* ``bgpn_long``: ``bgpn`` with the per-set schedule of :data:`SET_SCHEDULES` (chosen on
  validation with ``benchmarks/uci_variants.py``; naval: the 1000-step large-set budget leaves the
  fit in the noise-dominated regime);
* ``bgpn_het``: ``bgpn`` with input-dependent noise (:class:`pyro_gpn.heads.
  HeteroscedasticGaussianHead`, layers ``D -> 50 -> 2``: the output and its log noise
  variance; DVI's heteroscedastic likelihood), chosen on validation (``uci_variants.py
  --variants hetero``, docs/results/uci.md section 6);
* ``bgpn_wide``: ``bgpn`` with one hidden layer of twice the width (``[D, 100, 1]``;
  :func:`bgpn_sizes`), chosen on validation
  (``uci_variants.py --variants wide_s1000``, docs/results/uci.md section 7);
* ``bgpn_wide_long``: ``bgpn_wide`` with the per-set schedule of ``bgpn_long`` (protein:
  ``[9, 200, 1]``, 3000 steps; ``uci_variants.py --variants wide_pll_s3000``, uci.md section 12);
* ``bgpn_het_point``: ``bgpn_het`` with point-estimated weights (no ``q(W)``;
  ``uci_variants.py --variants hetero_point``, uci.md section 12);
* ``bgpn_het_qw2``: ``bgpn_het_point`` with ``q(W)`` back in the last layer (point weights in
  the first only: ``VariationalGPN(weights=("point", "variational"))``), a guard against point
  weights' overconfidence (``uci_variants.py --variants hetero_qw2``, uci.md section 13);
* ``bgpn_het_point_long``: ``bgpn_het_point`` with the set's schedule (power: 3000 steps;
  ``uci_variants.py --variants hetero_point_pll_s3000``, uci.md section 15);
* ``bgpn_het_qw2_long``: ``bgpn_het_qw2`` with the set's schedule (concrete: 4000 steps;
  ``uci_variants.py --variants hetero_qw2_s4000``, uci.md section 15);
* ``bgpn_wide_point_long``: ``bgpn_wide`` with point weights and the set's schedule (kin8nm:
  2000 steps; ``uci_variants.py --variants wide_point_pll_s2000``, uci.md section 12); in
  general a column's name lists its changes to ``bgpn`` (:data:`BGPN_MODIFIERS`);
* ``bgpn_trace``: ``bgpn`` trained on Pyro's sampled ``Trace_ELBO`` (``fit_vgpn(...,
  elbo="trace")``: one reparameterised particle per step) instead of the closed form, all else
  equal (issue 15's "variational GPN with ``Trace_ELBO`` on a subset");
* ``bgpn_issue``: the same model as issue 15 ran it (point weights, no validation);
* ``clt``: :class:`pyro_gpn.GPNNet` (central-limit GPN, identity targets) by
  :class:`pyro_gpn.inference.Trainer` (lr 1e-2, batch 32, <= 300 epochs, validation schedule);
* ``mcdrop``: :class:`pyro_gpn.models.baselines.FixedActivationNet` (tanh) with dropout on
  inputs and hidden units, rate chosen on validation from ``{0.01, 0.05, 0.1}``, 100 MC passes;
* ``ensemble``: 5 such nets without dropout, different seeds (a mixture of 5 Gaussians;
  homoscedastic heads, no adversarial training);
* ``dgp``: GPyTorch's 2-layer deep GP, built with its ``DeepGPLayer`` / ``DeepApproximateMLL``
  as in its DeepGP example (10 hidden GPs, linear mean, 64 inducing points, 10 likelihood
  samples), Adam lr 0.01, full batch, early stopping on validation log-likelihood.

``--models chosen`` runs each set's validation-chosen Bayesian GPN (:data:`CHOSEN`).

One JSON per (model, set, split) cell under ``--out``; finished cells are skipped, files are
written atomically. Usage (or ``pyro-gpn uci ARGS`` from a source checkout)::

    OMP_NUM_THREADS=1 python benchmarks/uci.py --sets boston concrete --splits 0 1 2 \\
        --models chosen mcdrop dgp
    python benchmarks/uci.py --summary           # the table of what is there
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from pyro_gpn.data import DataUnavailableError  # noqa: E402
from pyro_gpn.metrics import mixture_central_interval  # noqa: E402
from pyro_gpn.recommended import VGPN  # noqa: E402

#: the datasets folder: $PYRO_GPN_UCI_DIR, else $PYRO_GPN_TEST_DATA, else ../shared/datasets beside
#: the checkout (the project's layout); every benchmark script reads this one
DATA_DIR = os.environ.get(
    "PYRO_GPN_UCI_DIR",
    os.environ.get("PYRO_GPN_TEST_DATA", str(ROOT.parent / "shared" / "datasets")),
)
SETS = ("boston", "concrete", "energy", "kin8nm", "naval", "power", "protein", "wine", "yacht")
#: fixed splits of every set but protein (the datasets' ``n_splits.txt``), and of protein
NUM_SPLITS, NUM_SPLITS_PROTEIN = 20, 5
#: the Bayesian GPN's columns; each also exists trained on the predictive log-likelihood
#: objective instead of the ELBO, with the suffix ``_pll`` (``fit_vgpn(elbo="predictive")``,
#: docs/results/uci.md section 10)
BGPN_MODELS = (
    "bgpn",
    "bgpn_het",
    "bgpn_het_point",
    "bgpn_het_qw2",
    "bgpn_het_point_long",
    "bgpn_het_qw2_long",
    "bgpn_long",
    "bgpn_long_warm",
    "bgpn_long_warm1500",
    "bgpn_wide",
    "bgpn_wide_long",
    "bgpn_wide_longer",
    "bgpn_wide_point_long",
    "bgpn_wide_point_longer",
    "bgpn_het_point_longer",
    "bgpn_het_qw2_longer",
    "bgpn_trace",
    "bgpn_issue",
    # the chosen columns with the predictive scale fitted on the validation rows (section 17)
    "bgpn_long_cal",
    "bgpn_het_qw2_cal",
    "bgpn_het_qw2_long_cal",
    "bgpn_het_point_cal",
    "bgpn_het_point_long_cal",
    "bgpn_long_warm1500_cal",
    "bgpn_wide_longer_cal",
    "bgpn_wide_point_long_cal",
    # kin8nm's, yacht's and energy's chosen networks with a smaller step (section 22)
    "bgpn_wide_point_longer_cal",
    "bgpn_het_point_longer_cal",
    "bgpn_het_qw2_longer_cal",
    # the chosen columns of the small sets and kin8nm as mixtures of five independently fitted
    # Bayesian GPNs (the ``ens5`` modifier; section 19)
    "bgpn_long_ens5",
    "bgpn_het_point_ens5",
    "bgpn_het_qw2_ens5",
    "bgpn_het_qw2_long_ens5",
    "bgpn_wide_point_long_cal_ens5",
    # those mixtures with their own predictive scale fitted on the validation rows (``mixcal``;
    # section 20)
    "bgpn_long_ens5_mixcal",
    "bgpn_het_point_ens5_mixcal",
    "bgpn_het_qw2_ens5_mixcal",
    "bgpn_het_qw2_long_ens5_mixcal",
    "bgpn_wide_point_long_cal_ens5_mixcal",
    "bgpn_wide_point_longer_cal_ens5_mixcal",
    # the large sets' chosen columns as calibrated mixtures (section 20)
    "bgpn_long_warm1500_cal_ens5_mixcal",
    "bgpn_wide_longer_cal_ens5_mixcal",
    "bgpn_het_point_long_ens5_mixcal",
    # Student-t noise with 4 degrees of freedom (``t4``; with ``het``, input-dependent t noise;
    # section 24), and the chosen ones' calibrated twins
    "bgpn_long_t4",
    "bgpn_qw2_long_t4",
    "bgpn_het_qw2_t4",
    "bgpn_het_qw2_long_t4",
    "bgpn_het_qw2_t4_cal",
    "bgpn_het_qw2_long_t4_cal",
)
PLL = "_pll"
MODELS = (
    *BGPN_MODELS,
    *(m + PLL for m in BGPN_MODELS if m not in ("bgpn_trace", "bgpn_issue")),
    "bgpn_auto",
    "bgpn_stack",
    "bgpn_select",
    "clt",
    "mcdrop",
    "ensemble",
    "dgp",
    "dgp_ens5",
    "dgp_t4",
)
METRICS = ("log_lik", "rmse", "coverage90")
#: the large sets: mini-batches (the same number of optimiser steps, not fewer rows)
LARGE = ("kin8nm", "naval", "power", "protein")
#: mini-batch size of the step-based models (bgpn, dgp) on the large sets
LARGE_BATCH = 512
#: optimiser steps of the step-based models on the large sets (``--large-steps``; the compute
#: budget of this machine, not a choice on validation)
LARGE_STEPS = {"value": 1000}

#: the Bayesian GPN's configuration: the library's recommendations
#: (:data:`pyro_gpn.recommended.VGPN`, chosen on validation, docs/results/uci.md) trained on the
#: paper's closed-form ELBO, as every column without the suffix ``_pll`` was run; the ``_pll``
#: columns train on the predictive objective, the recommendation since section 10
BGPN_CONFIG = {**VGPN.as_dict(), "elbo": "closed_form"}
#: per-set schedules of ``bgpn_long`` (``fit_vgpn`` keywords over ``BGPN_CONFIG``), each chosen on
#: the validation rows (``benchmarks/uci_variants.py``, docs/results/uci.md section 1b)
SET_SCHEDULES: dict[str, dict] = {
    # patience 40 evaluations: patience 12 stopped 10 of 20 splits' fits, 4 of them at their first
    # plateau, noise-dominated; 40 never lost on their validation rows, and fits that ran the full
    # budget do not change (uci_variants.py --variants lr02_s6000_p40; uci.md section 14)
    "naval": {"num_steps": 6000, "lr": 0.02, "patience": 40},
    "boston": {"lr": 0.02},  # validation rows of splits 0-2 (uci.md section 5)
    # s3000 against s1000 on the validation rows of splits 0-1: -2.980 / -2.888 against
    # -3.038 / -2.930 (uci.md section 7)
    "protein": {"num_steps": 3000},
    # wide_point_pll_s2000 against wide_pll_s1000: +0.044 (2 of 3; uci.md section 12)
    "kin8nm": {"num_steps": 2000},
    # hetero_point_pll_s3000 against hetero_point_pll_s1000: +0.043, 6 of 6 (uci.md section 15)
    "power": {"num_steps": 3000},
    # hetero_qw2_s4000 against hetero_qw2: +0.055, 4 of 6 (uci.md section 15)
    "concrete": {"num_steps": 4000},
}
#: per-set schedules of the ``longer`` columns: a second, longer budget where the first one's fits
#: were still improving at its end, chosen on the validation rows (section 16)
LONGER_SCHEDULES: dict[str, dict] = {
    # wide_pll_s6000_p40 against wide_pll_s3000 (bgpn_wide_long_pll): +0.054 +- 0.016, 2 of 2
    "protein": {"num_steps": 6000, "patience": 40},
    # wide_point_pll_lr02_s4000_p40 against wide_point_pll_s2000 (bgpn_wide_point_long_pll):
    # +0.125 +- 0.043, 6 of 6 (validation rows of splits 0-5, section 22): a smaller step
    # that many more fits converge under (five model seeds of split 0: 1.32 +- 0.02 against
    # 1.20 +- 0.08)
    "kin8nm": {"num_steps": 4000, "lr": 0.02, "patience": 40},
    # hetero_point_pll_lr02_s4000_p40 against hetero_point_pll (bgpn_het_point_pll): +0.175 +-
    # 0.110, 5 of 6 (validation rows of splits 0-5, section 22)
    "yacht": {"num_steps": 4000, "lr": 0.02, "patience": 40},
    # hetero_qw2_pll_lr02_s4000_p40 against hetero_qw2_pll (bgpn_het_qw2_pll): +0.161 +- 0.101,
    # 5 of 6 (validation rows of splits 0-5, section 22)
    "energy": {"num_steps": 4000, "lr": 0.02, "patience": 40},
}
#: the modifiers that read a per-set schedule, and where
SCHEDULES: dict[str, dict[str, dict]] = {"long": SET_SCHEDULES, "longer": LONGER_SCHEDULES}
#: the changes a Bayesian GPN column's name can make to :data:`BGPN_CONFIG`, each chosen on
#: validation somewhere (``benchmarks/uci_variants.py``): ``bgpn[_het][_point][_wide][_long]``
#: and the suffix ``_pll``. ``het``: input-dependent noise (section 6); ``point``: point
#: weights, no ``q(W)`` (the first layer's mean-field ``q(W)`` sat on its prior, sections 10 and
#: 12); ``wide``: one hidden layer of twice the width (``[D, 100, 1]``, :func:`bgpn_sizes`;
#: section 7); ``long``: the set's schedule of :data:`SET_SCHEDULES` (``set_steps``: its step
#: budget overrides the large sets' :data:`LARGE_STEPS`), ``longer`` that of
#: :data:`LONGER_SCHEDULES`. Guards against point weights'
#: overconfidence (section 13): ``qw2``: point weights in the first layer, ``q(W)`` in the
#: second (last) one (``VariationalGPN(weights=("point", "variational"))``). ``warm``: the head's
#: noise held at its initial value for the first 500 steps (``fit_vgpn(noise_warmup=500)``;
#: section 16: fits that settled in the noise-dominated optimum on naval), ``warm1500`` for the
#: first 1500. ``ens5``: five Bayesian GPNs fitted independently (model seeds ``seed + 1000 k``,
#: ``k = 0..4``: the first is the column without the modifier) and predicting their equal-weight
#: mixture (section 19); ``mixcal`` (with ``ens5``): the mixture's own predictive scale fitted on
#: the validation rows (``fit_predictive_scale(ensemble, ...)``; section 20); ``t4``: Student-t
#: noise with 4 degrees of freedom (:class:`pyro_gpn.heads.StudentTHead`; with ``het``, the
#: heteroscedastic head's t noise, ``HeteroscedasticGaussianHead(df=4)``; section 24)
BGPN_MODIFIERS: dict[str, dict] = {
    "het": {"head": "heteroscedastic"},
    "point": {"weights": "point"},
    "qw2": {"weights": ("point", "variational")},
    "wide": {"hidden": (2,)},
    "long": {},
    "longer": {},
    "warm": {"noise_warmup": 500},
    "warm1500": {"noise_warmup": 1500},
    "cal": {"calibrate": True},
    "ens5": {"members": 5},
    "mixcal": {"mixture_calibrate": True},
    "t4": {"df": 4.0},
}
#: "the Bayesian GPN" of each set: the column whose model scored best on the validation rows
#: of splits 0-2 (0-1 on power and protein; 0-5 where two candidates were close; from section
#: 22 a candidate replaces the chosen column where its mean paired validation gain is positive
#: and larger than its standard error, over splits 0-5 or, in section 24, all 20) among those
#: with test cells (``benchmarks/uci_variants.py``, docs/results/uci.md sections 1b, 5, 6, 7,
#: 10, 12, 13, 22 and 24); test rows never took part in a choice
CHOSEN = {
    # hetero_point: -0.016 over splits 0-5 (section 12); the Student-t candidates of section 24
    # (lr02_t4, lr02_t4_pll, hetero_qw2_t4) gained less than their standard error over 20 splits
    "boston": "bgpn_long",
    # hetero_qw2 against hetero_point (the previous choice): +0.071 +- 0.041, 4 of 6 splits
    # (validation rows of splits 0-5, section 13)
    # hetero_qw2_s4000 against hetero_qw2 (the previous choice): +0.055 +- 0.032, 4 of 6 splits
    # (validation rows of splits 0-5, section 15)
    # hetero_qw2_t4_s4000 (Student-t noise) against hetero_qw2_s4000: +0.067 +- 0.031, 13 of
    # 20 (validation rows of all 20 splits, section 24)
    "concrete": "bgpn_het_qw2_long_t4",
    # hetero_qw2_pll against hetero_pll (the previous choice): +0.118 +- 0.065, 5 of 6 splits
    # (validation rows of splits 0-5, section 13)
    # hetero_qw2_pll_lr02_s4000_p40 (longer: lr 0.02, 4000 steps, patience 40) against
    # hetero_qw2_pll: +0.161 +- 0.101, 5 of 6 (validation rows of splits 0-5, section 22)
    "energy": "bgpn_het_qw2_longer_pll",
    # wide_point_pll_s2000 against wide_pll_s1000: +0.044, 2 of 3 (section 12); with its
    # predictive scale (cal) against none: +0.0020 +- 0.0017, 12 of 20 (cross-fitted, section 17);
    # wide_point_pll_lr02_s4000_p40 (longer: lr 0.02, 4000 steps, patience 40) against
    # wide_point_pll_s2000: +0.125 +- 0.043, 6 of 6; its scale: +0.0066 +- 0.0013, 18 of 20
    # (cross-fitted; section 22)
    "kin8nm": "bgpn_wide_point_longer_cal_pll",
    # long_warm against long (the previous choice): +0.65 +- 0.27, 15 of 20 splits; long_warm1500
    # against long_warm: +0.21 +- 0.11, 19 of 20 (validation rows of all 20 splits, section 16);
    # its predictive scale fitted on the validation rows (cal) against none: +0.180 +- 0.033,
    # 18 of 20 (cross-fitted validation log-likelihood, all 20 splits, section 17)
    "naval": "bgpn_long_warm1500_cal",
    # hetero_point_pll_s3000 against hetero_point_pll_s1000 (the previous choice): +0.043, 6 of
    # 6 splits (validation rows of splits 0-5, section 15)
    "power": "bgpn_het_point_long_pll",
    # wide_pll_s3000 against pll_s3000: +0.063, 2 of 2; wide_pll_s6000_p40 against wide_pll_s3000:
    # +0.054 +- 0.016, 2 of 2 (validation rows of splits 0-1, section 16); with its predictive
    # scale (cal) against none: +0.0007 +- 0.0004, 4 of 5 (cross-fitted, section 17)
    "protein": "bgpn_wide_longer_cal_pll",
    # hetero_qw2 against hetero_point (the previous choice): +0.038 +- 0.019, 5 of 6 splits
    # (validation rows of splits 0-5, section 13); hetero_qw2_t4 (Student-t noise) against
    # hetero_qw2: +0.222 +- 0.045, 17 of 20 (validation rows of all 20 splits, section 24)
    "wine": "bgpn_het_qw2_t4",
    # hetero_point_pll against hetero_pll: +0.92, 3 of 3; hetero_point_pll_lr02_s4000_p40 (longer:
    # lr 0.02, 4000 steps, patience 40) against hetero_point_pll: +0.175 +- 0.110, 5 of 6
    # (validation rows of splits 0-5, section 22)
    "yacht": "bgpn_het_point_longer_pll",
}
#: each set's chosen column as five networks mixed (``ens5``), where the mixture won on the
#: validation rows by the rule fixed before any cell ran: the mean paired gain over member 0
#: (the chosen column's own network) positive and larger than its standard error
#: (``benchmarks/uci_ensemble.py``, section 19); sets not listed were not run. The mixture's own
#: predictive scale (``mixcal``) where its cross-fitted validation gain passed the same rule
#: (``uci_ensemble.py --calibration``, section 20): kin8nm +0.022 +- 0.001, 20 of 20; naval, run
#: only calibrated, mixture against member 0 +0.223 +- 0.203 (11 of 20), then its scale +0.073 +-
#: 0.014 (20 of 20); protein, likewise, +0.083 +- 0.018 (5 of 5), then +0.015 +- 0.001 (5 of 5)
ENSEMBLES = {
    "boston": "bgpn_long_ens5",
    "concrete": "bgpn_het_qw2_long_ens5",
    # section 22's chosen column, run only calibrated: mixture against member 0 +0.045 +- 0.003
    # (20 of 20), then its scale +0.009 +- 0.000 (20 of 20)
    "kin8nm": "bgpn_wide_point_longer_cal_ens5_mixcal_pll",
    "naval": "bgpn_long_warm1500_cal_ens5_mixcal",
    "protein": "bgpn_wide_longer_cal_ens5_mixcal_pll",
    "wine": "bgpn_het_qw2_ens5",
    "yacht": "bgpn_het_point_ens5_pll",
}


def chosen_columns(ensembles: bool = False) -> dict[str, str]:
    """Each set's chosen Bayesian GPN column (:data:`CHOSEN`, ``bgpn`` where none), a fresh
    dict; with ``ensembles``, its five-network mixture where adopted (:data:`ENSEMBLES`)."""
    columns = {name: CHOSEN.get(name, "bgpn") for name in SETS}
    return {**columns, **ENSEMBLES} if ensembles else columns


#: the deep GP's column where validation chose another than ``dgp`` (section 26): Student-t
#: noise (``dgp_t4``) against the Gaussian on the validation rows of all 20 splits, offered where
#: the Bayesian GPN was (section 24); concrete +0.091 +- 0.040 (16 of 20), wine +0.009 +- 0.006
#: (14 of 20); boston +0.028 +- 0.050 (11 of 20): kept Gaussian
DGP_CHOSEN = {"concrete": "dgp_t4", "wine": "dgp_t4"}


def dgp_chosen_columns() -> dict[str, str]:
    """Each set's chosen deep GP column (:data:`DGP_CHOSEN`, ``dgp`` where none)."""
    return {name: DGP_CHOSEN.get(name, "dgp") for name in SETS}


#: the configuration issue 15 ran (point weights, no validation)
ISSUE_CONFIG = {**BGPN_CONFIG, "weights": "point", "validation": False}


#: published test log-likelihoods, mean and standard error over the 20 splits (5 for protein),
#: 1 hidden layer of 50 units (100 for protein): issue 15's table (Hernandez-Lobato & Adams
#: 2015; Gal & Ghahramani 2016; Lakshminarayanan et al. 2017; Wu et al. 2019)
PUBLISHED_COLUMNS = ("PBP", "MC dropout", "deep ensemble", "DVI", "hoDVI")
PUBLISHED = {
    "boston": ((-2.57, 0.09), (-2.46, 0.25), (-2.41, 0.25), (-2.41, 0.02), (-2.58, 0.04)),
    "concrete": ((-3.16, 0.02), (-3.04, 0.09), (-3.06, 0.18), (-3.06, 0.01), (-3.23, 0.01)),
    "energy": ((-2.04, 0.02), (-1.99, 0.09), (-1.38, 0.22), (-1.01, 0.06), (-2.09, 0.06)),
    "kin8nm": ((0.90, 0.01), (0.95, 0.03), (1.20, 0.02), (1.13, 0.00), (1.01, 0.01)),
    "naval": ((3.73, 0.01), (3.80, 0.05), (5.63, 0.05), (6.29, 0.04), (5.84, 0.06)),
    "power": ((-2.84, 0.01), (-2.80, 0.05), (-2.79, 0.04), (-2.80, 0.00), (-2.82, 0.00)),
    "protein": ((-2.97, 0.00), (-2.89, 0.01), (-2.83, 0.02), (-2.85, 0.01), (-2.94, 0.00)),
    "wine": ((-0.97, 0.01), (-0.93, 0.06), (-0.94, 0.12), (-0.90, 0.01), (-0.96, 0.01)),
    "yacht": ((-1.63, 0.02), (-1.55, 0.12), (-1.18, 0.21), (-0.47, 0.03), (-1.41, 0.03)),
}


# ---------------------------------------------------------------------------------- metrics
def metrics_of(
    mean: Tensor, var: Tensor, y: Tensor, y_std: float, weights: Tensor | None = None
) -> dict[str, float]:
    """Test metrics of a Gaussian-mixture predictive, in original units.

    Args:
        mean, var: ``[T, S]`` component means and variances (observation noise included) in
            standardised units; ``T = 1`` is a single Gaussian.
        y: ``[S]`` or ``[S, 1]`` standardised targets.
        y_std: the training split's target standard deviation.
        weights: ``[T]`` component weights summing to 1 (``None``: equal weights).

    Returns:
        ``log_lik`` (mean log predictive density, original units: standardised minus
        ``log y_std``), ``rmse`` (of the mixture mean, original units) and ``coverage90`` (share
        of targets inside the central 90 % interval of the mixture, its 5 % and 95 % quantiles:
        :func:`pyro_gpn.metrics.mixture_central_interval`; ``mean +- 1.645 sd`` for ``T = 1``).
    """
    mean, var = mean.double(), var.double().clamp_min(1e-12)
    if mean.dim() != 2 or var.shape != mean.shape:
        raise ValueError(f"mean and var must both be [T, S], got {mean.shape} and {var.shape}")
    y = y.reshape(-1).double()
    if y.shape[0] != mean.shape[1]:
        raise ValueError(f"y has {y.shape[0]} rows, the predictive {mean.shape[1]}")
    if weights is None:
        weights = torch.full((mean.shape[0],), 1.0 / mean.shape[0], dtype=mean.dtype)
    weights = weights.double().reshape(-1)
    if weights.shape[0] != mean.shape[0] or not abs(float(weights.sum()) - 1.0) < 1e-5:
        raise ValueError(f"weights must be [{mean.shape[0]}] summing to 1, got {weights}")
    weights = weights / weights.sum()  # a float32 rule sums to 1 within its rounding only
    comp = -0.5 * (math.log(2 * math.pi) + var.log() + (y[None] - mean).square() / var)
    log_lik = torch.logsumexp(comp + weights.log()[:, None], 0)
    mix_mean = (weights[:, None] * mean).sum(0)
    lower, upper = mixture_central_interval(weights, mean, var, 0.9)
    inside = (y >= lower) & (y <= upper)
    return {
        "log_lik": float(log_lik.mean()) - math.log(y_std),
        "rmse": float((y - mix_mean).square().mean().sqrt()) * y_std,
        "coverage90": float(inside.double().mean()),
    }


# ---------------------------------------------------------------------------------- models
def _width(name: str) -> int:
    return 100 if name == "protein" else 50


def bgpn_sizes(name: str, num_features: int, hidden: Sequence[int] = (1,)) -> list[int]:
    """Layer widths ``[D, H_1, ..., H_K, 1]`` of the Bayesian GPN on set ``name``.

    Args:
        name: the UCI set (its benchmark width: 50 units, 100 for protein).
        num_features: ``D``.
        hidden: one entry per hidden GPN layer, its width in units of the set's benchmark
            width: ``(1,)`` is the benchmark's ``[D, 50, 1]``, ``(1, 1)`` two hidden layers
            ``[D, 50, 50, 1]``, ``(2,)`` one of twice the width ``[D, 100, 1]``.

    Raises:
        ValueError: ``hidden`` is empty or holds anything but positive integers.
    """
    hidden = tuple(hidden)
    if not hidden or not all(
        isinstance(k, int) and not isinstance(k, bool) and k > 0 for k in hidden
    ):
        raise ValueError(f"hidden must be a non-empty sequence of positive integers, got {hidden}")
    return [num_features, *(k * _width(name) for k in hidden), 1]


def noise_std_of(head) -> float:
    """A fitted Gaussian head's noise standard deviation (standardised units; the first
    output; a Student-t head's ``sigma sqrt(nu / (nu - 2))``); for a heteroscedastic head, its
    value where the noise feature is 0, ``exp(a / 2)`` (with Student-t noise: the t's scale
    there, not its standard deviation)."""
    if hasattr(head, "noise_std"):
        return float(head.noise_std.detach().reshape(-1)[0])
    return float((0.5 * head.noise_offset.detach()).exp().reshape(-1)[0])


def quantisation_noise_std(y: Tensor) -> float:
    """The standard deviation ``Delta / sqrt(12)`` of rounding the targets ``y`` to their grid,
    where ``Delta`` is the smallest gap between two distinct values of ``y`` (the recording
    resolution: 1 quality level on wine, 0.001 on naval, float rounding on kin8nm): the
    variance a quantised observation adds to the continuous one it records (Sheppard's
    correction), in ``y``'s units. ``y`` needs two distinct values."""
    values = torch.unique(y.detach().reshape(-1).double())
    if values.numel() < 2:
        raise ValueError("y needs at least two distinct values to have a resolution")
    return float((values[1:] - values[:-1]).min()) / math.sqrt(12.0)


def calibrated(model: str) -> str:
    """The column of Bayesian GPN column ``model`` with its predictive scale fitted on the
    validation rows (the ``cal`` modifier, before a ``_pll`` suffix); ``model`` itself if it
    has it."""
    base = model.removesuffix(PLL)
    if "cal" in base.split("_"):
        return model
    return f"{base}_cal{model[len(base) :]}"


def bgpn_config(model: str, name: str) -> dict:
    """The configuration of the Bayesian GPN column ``model`` on set ``name`` (``fit_bgpn``'s
    ``config``): the recommendations with the changes its name lists
    (:data:`BGPN_MODIFIERS`); the suffix ``_pll`` trains on the predictive log-likelihood
    objective instead of the ELBO, ``bgpn_trace`` on Pyro's sampled ``Trace_ELBO`` and
    ``bgpn_issue`` is the configuration issue 15 ran (:data:`ISSUE_CONFIG`)."""
    base = model.removesuffix(PLL)
    if model not in MODELS or base not in BGPN_MODELS:
        pll = [m for m in MODELS if m.endswith(PLL)]
        raise ValueError(f"model must be one of {BGPN_MODELS + tuple(pll)}, got {model!r}")
    if base == "bgpn_issue":
        return ISSUE_CONFIG
    if base == "bgpn_trace":
        return {**BGPN_CONFIG, "elbo": "trace"}
    config = dict(BGPN_CONFIG)
    for modifier in base.split("_")[1:]:
        config.update(BGPN_MODIFIERS[modifier])
        if modifier in SCHEDULES:
            schedule = SCHEDULES[modifier].get(name, {})
            config.update(schedule)
            if "num_steps" in schedule:
                config["set_steps"] = schedule["num_steps"]
    if model.endswith(PLL):
        config["elbo"] = "predictive"
    return config


def mixture_predictor(mixture: Callable) -> Callable:
    """``predict(x) -> (mean [S, D'], var [S, D'], weights)`` of the metric code from a
    predictive mixture ``mixture(x) -> (weights, mean, var)`` (a network's head or an
    ensemble's), evaluated without gradients."""

    def predict(x):
        with torch.no_grad():
            weights, mean, var = mixture(x)
        return mean.reshape(mean.shape[0], -1), var.reshape(mean.shape[0], -1), weights

    return predict


def fit_bgpn(data, config: dict, seed: int) -> dict:
    """The closed-form variational GPN (:class:`pyro_gpn.models.VariationalGPN`, trained by
    :func:`pyro_gpn.inference.fit_vgpn` on the training rows, stopped on the validation rows);
    returns predictions (``predict``), the fitted network (``net``) and fit facts.

    With ``config["members"] = K > 1`` (the ``ens5`` modifier), ``K`` such networks are fitted
    with model seeds ``seed + 1000 k`` and ``predict`` is their equal-weight mixture
    (:class:`pyro_gpn.models.NetworkEnsemble`: each member's own predictive mixture, weights
    divided by ``K``); member 0 is the single network of
    the same column without the modifier, and its test and validation metrics are kept
    (``single``) for the paired comparison. Times and epochs are the members' sums. With
    ``config["mixture_calibrate"]`` (the ``mixcal`` modifier) the mixture's own predictive scale
    is fitted on the validation rows, and the cell records :func:`calibration_facts` of it."""
    from pyro_gpn.inference import fit_predictive_scale
    from pyro_gpn.models import NetworkEnsemble

    members = config.get("members", 1)
    if config.get("mixture_calibrate") and members == 1:
        raise ValueError("the mixcal modifier calibrates a mixture: use it with ens5")
    if members == 1:
        return _fit_bgpn_member(data, config, seed)
    fits = [_fit_bgpn_member(data, config, seed + 1000 * k) for k in range(members)]
    first = fits[0]
    ensemble = NetworkEnsemble([f["net"] for f in fits])

    predict = mixture_predictor(ensemble.predictive_mixture)

    facts = _ensemble_facts(fits, data)
    if config.get("mixture_calibrate"):
        fit_predictive_scale(ensemble, data.x_val, data.y_val)
        facts["mixture_calibration"] = calibration_facts(ensemble, predict, data)
    return {
        **{k: v for k, v in first.items() if k not in ("predict", "net")},
        **facts,
        "predict": predict,
        "net": ensemble,
        "member_best_step": [f["best_step"] for f in fits],
        "steps": sum(f["steps"] for f in fits),
    }


def candidate_rows(models: dict, data) -> dict[str, dict[str, list[float]]]:
    """Every candidate network's own predictive on the split's rows, uncalibrated, so that any
    rule of choosing or mixing the candidates can be scored afterwards without refitting:
    ``val_log_density`` and ``test_log_density`` per row (standardised units: subtract
    ``log y_std`` for original units) and ``test_cdf``, the predictive's distribution function
    at each test target (a mixture's 90 % central interval holds a row exactly when
    ``0.05 <= sum_k w_k F_k(y) <= 0.95``)."""
    from pyro_gpn.inference import predictive_scale_of

    out = {}
    for name, net in models.items():
        scale = predictive_scale_of(net)
        kept = scale.clone()
        scale.fill_(1.0)
        try:
            with torch.no_grad():
                val = net.log_predictive(data.x_val, data.y_val)
                test = net.log_predictive(data.x_test, data.y_test)
                weights, mean, var = net.head.predictive_mixture(net.hidden(data.x_test))
        finally:
            scale.copy_(kept)
        y = data.y_test.reshape(1, -1).double()
        z = (y - mean.reshape(mean.shape[0], -1).double()) / var.reshape(var.shape[0], -1).sqrt()
        cdf = (weights.double()[:, None] * torch.special.ndtr(z)).sum(0)
        out[name] = {
            "val_log_density": val.double().tolist(),
            "test_log_density": test.double().tolist(),
            "test_cdf": cdf.tolist(),
        }
    return out


def fit_bgpn_auto(data, seed: int, combine: str = "best") -> dict:
    """The Bayesian GPN as the library chooses it itself (``bgpn_auto``; ``bgpn_select``:
    ``combine="stack"``, the default, a mixture's scale fitted where the score cross-fitted with
    the stacking inside rises, :func:`pyro_gpn.inference.crossfitted_stacked_scores`, ``uci.md``
    section 30; the ``bgpn_stack`` cells ran the same with section 29's rule, a stacked mixture
    left unscaled, and take no new cells):
    :func:`pyro_gpn.inference.select_vgpn` with its default portfolio
    (:data:`pyro_gpn.recommended.VGPN_PORTFOLIO`) on the split's training rows, every candidate
    stopped and scored on the split's validation rows, the benchmark's width (50 units, 100 for
    protein) and the library's mini-batch rule. The cell records every candidate's validation
    score and time, the choice (the stacking weights) and whether the predictive scale was
    fitted (with the cross-fitted scores that decided, ``crossfit_std``); ``fit_s`` and
    ``epochs`` are the sums over the candidates that finished (a failed candidate's time is in
    ``candidate_s`` only), ``chosen_fit_s``, ``chosen_epochs``, ``steps`` and ``best_step``
    the best single candidate's. A stacked column also records
    :func:`candidate_rows`, and the cross-fitted validation score of choosing against stacking
    (:func:`pyro_gpn.inference.crossfitted_combination`)."""
    from pyro_gpn.inference import crossfitted_combination, predictive_scale_of, select_vgpn
    from pyro_gpn.models import NetworkEnsemble
    from pyro_gpn.recommended import VGPN

    selection = select_vgpn(
        data.x_train,
        data.y_train,
        data.x_val,
        data.y_val,
        hidden=_width(data.name),
        combine=combine,
        seed=seed,
        log=lambda line: print(f"  {data.name} seed {seed}: {line}", flush=True),
    )
    model = selection.model
    batch = VGPN.batch_for(selection.num_train)
    steps_per_epoch = 1 if not batch else max(1, math.ceil(selection.num_train / batch))
    chosen = selection.fits[selection.candidate.name]

    if isinstance(model, NetworkEnsemble):
        predict = mixture_predictor(model.predictive_mixture)
    else:
        predict = mixture_predictor(lambda x: model.head.predictive_mixture(model.hidden(x)))
    extra = {}
    if combine == "stack":
        rows = candidate_rows(selection.models, data)
        log_densities = torch.tensor([r["val_log_density"] for r in rows.values()]).T
        extra = {
            "candidate_rows": rows,
            "combine_crossfit_std": crossfitted_combination(log_densities),
        }

    return {
        "predict": predict,
        "net": model,
        "chosen": selection.candidate.name,
        "weights": selection.weights,
        "candidate_val_log_lik_std": selection.scores,
        "candidate_s": selection.fit_seconds,
        "candidate_errors": selection.errors,
        "crossfit_std": selection.crossfit,
        "calibrated": selection.calibrated,
        "predictive_scale": predictive_scale_of(model).tolist(),
        "fit_s": sum(f.wall_time for f in selection.fits.values()),
        "chosen_fit_s": chosen.wall_time,
        "epochs": sum(f.num_steps for f in selection.fits.values()) / steps_per_epoch,
        "chosen_epochs": chosen.num_steps / steps_per_epoch,
        "steps": chosen.num_steps,
        "best_step": chosen.best_step,
        "batch_size": batch,
        "noise_std": noise_std_of(selection.models[selection.candidate.name].head),
        "sizes": bgpn_sizes(data.name, data.num_features, (selection.candidate.width_factor,)),
        "config": selection.candidate.as_dict(),
        **extra,
    }


def _ensemble_facts(fits: list[dict], data) -> dict:
    """What an ensemble cell records of its members (fit dicts with ``predict``): member 0's
    own test and validation metrics (``single``, the column without the ensemble), every
    member's validation log-likelihood and noise, and the summed fit time and epochs."""
    y_std = float(data.y_std)
    first = fits[0]["predict"]
    return {
        "single": {
            "test": _score(first, data.x_test, data.y_test, y_std),
            "val": _score(first, data.x_val, data.y_val, y_std),
        },
        "members": len(fits),
        "member_val_log_lik": [
            _score(f["predict"], data.x_val, data.y_val, y_std)["log_lik"] for f in fits
        ],
        "member_noise_std": [f["noise_std"] for f in fits],
        "fit_s": sum(f["fit_s"] for f in fits),
        "epochs": sum(f["epochs"] for f in fits),
    }


def bgpn_head(config: dict):
    """The head of a Bayesian GPN column's ``config``: ``"gaussian"``, the heteroscedastic head
    (``het``; with ``t4``, its Student-t noise) or the Student-t head (``t4`` alone)."""
    from pyro_gpn.heads import HeteroscedasticGaussianHead, StudentTHead

    df = config.get("df")
    if config.get("head") == "heteroscedastic":
        return HeteroscedasticGaussianHead(1, noise_floor=config.get("noise_floor", 0.0), df=df)
    return "gaussian" if df is None else StudentTHead(1, df=df)


def _fit_bgpn_member(data, config: dict, seed: int) -> dict:
    """One network of :func:`fit_bgpn`."""
    from pyro_gpn.inference import fit_vgpn
    from pyro_gpn.models import VariationalGPN

    torch.manual_seed(seed)
    head = bgpn_head(config)
    sizes = bgpn_sizes(data.name, data.num_features, config.get("hidden", (1,)))
    model = VariationalGPN(
        sizes,
        head=head,
        whiten=config["whiten"],
        targets_init=config["targets_init"],
        weights=config["weights"],
        weight_prior_scale=config["weight_prior_scale"],
    )
    validation = config.get("validation", True)
    batch = VGPN.batch_for(data.x_train.shape[0]) if data.name in LARGE else None
    fit = fit_vgpn(
        model,
        data.x_train,
        data.y_train,
        data.x_val if validation else None,
        data.y_val if validation else None,
        val_fraction=None if validation else 0.0,
        num_steps=config.get(
            "set_steps", LARGE_STEPS["value"] if data.name in LARGE else config["num_steps"]
        ),
        lr=config["lr"],
        lr_decay=config["lr_decay"],
        batch_size=batch,
        eval_every=config["eval_every"],
        patience=config["patience"],
        seed=seed,
        elbo=config["elbo"],
        noise_warmup=config.get("noise_warmup", 0),
        calibrate=config.get("calibrate", False),
    )
    steps_per_epoch = 1 if not batch else max(1, math.ceil(data.x_train.shape[0] / batch))

    predict = mixture_predictor(lambda x: model.head.predictive_mixture(model.hidden(x)))

    facts = {}
    if config.get("calibrate"):
        facts["calibration"] = calibration_facts(model, predict, data)
    return {
        **facts,
        "predict": predict,
        "net": model,
        "fit_s": fit.wall_time,
        "epochs": fit.num_steps / steps_per_epoch,
        "steps": fit.num_steps,
        "best_step": fit.best_step,
        "batch_size": batch,
        "noise_std": noise_std_of(model.head),
        "sizes": sizes,
        "config": config,
    }


def calibration_facts(model, predict, data) -> dict:
    """What the predictive scale of a calibrated Bayesian GPN (``fit_vgpn(calibrate=True)``),
    or of a calibrated mixture of them (``mixcal``), did, for the choice and its check: the
    fitted ``scale``; ``val_crossfit``, the validation log-likelihood of
    :func:`crossfitted_scores`; and ``test_uncalibrated``, the test metrics at scale 1, which
    must reproduce the uncalibrated column's cell (a check, never a choice). The scale is left
    as the fit set it."""
    y_std = float(data.y_std)
    from pyro_gpn.inference import crossfitted_scores

    raw, calibrated = crossfitted_scores(
        model, data.x_val, data.y_val, lambda x, y: _score(predict, x, y, y_std)["log_lik"]
    )
    from pyro_gpn.inference import predictive_scale_of

    scale = predictive_scale_of(model)
    fitted = scale.clone()
    try:
        scale.fill_(1.0)
        test_uncalibrated = _score(predict, data.x_test, data.y_test, y_std)
    finally:
        scale.copy_(fitted)
    return {
        "scale": fitted.tolist(),
        "val_crossfit": {"log_lik_uncalibrated": raw, "log_lik_calibrated": calibrated},
        "test_uncalibrated": test_uncalibrated,
    }


def _train_net(net, data, seed: int, lr: float, batch_size: int, epochs: int, patience: int):
    from pyro_gpn.inference.trainer import TrainConfig, Trainer

    cfg = TrainConfig(
        lr=lr,
        batch_size=batch_size,
        max_epochs=epochs,
        patience=patience,
        seed=seed,
        task="regression",
        progress=False,
    )
    t0 = time.perf_counter()
    res = Trainer(net, cfg).fit((data.x_train, data.y_train), (data.x_val, data.y_val))
    return time.perf_counter() - t0, res.epochs, res.best_epoch


def fit_clt(data, seed: int) -> dict:
    from pyro_gpn.network import GPNNet

    torch.manual_seed(seed)
    net = GPNNet(
        [data.num_features, _width(data.name), 1],
        mode="meanvar",
        head="gaussian",
        targets_init="identity",
    )
    wall, epochs, best = _train_net(net, data, seed, *_mlp_schedule(data))

    def predict(x):
        with torch.no_grad():
            out = net.eval()(x)
        return out.mean.reshape(1, -1), out.variance.reshape(1, -1)

    return {
        "predict": predict,
        "fit_s": wall,
        "epochs": epochs,
        "best_epoch": best,
        "noise_std": float(net.noise_std.detach().reshape(-1)[0]),
    }


def _mlp_schedule(data) -> tuple[float, int, int, int]:
    """``(lr, batch, max_epochs, patience)`` of the Trainer-based models: batch 32, <= 300
    epochs on the small sets; batch 128, <= 40 epochs on the large ones."""
    if data.name in LARGE:
        return 1e-2, 128, 40, 5
    return 1e-2, 32, 300, 10


def _mlp(data, dropout: float, seed: int):
    from pyro_gpn.models.baselines import FixedActivationNet

    torch.manual_seed(seed)
    return FixedActivationNet(
        [data.num_features, _width(data.name), 1], head="gaussian", dropout=dropout
    )


def _mc_predict(net, x, passes: int = 100):
    net.train()  # sampled dropout masks
    with torch.no_grad():
        outs = [net(x) for _ in range(passes)]
    net.eval()
    mean = torch.stack([o.mean.reshape(-1) for o in outs])
    var = torch.stack([o.variance.reshape(-1) for o in outs])
    return mean, var


def fit_mcdrop(data, seed: int, rates=(0.01, 0.05, 0.1)) -> dict:
    best = None
    total, tried = 0.0, {}
    for rate in rates:
        net = _mlp(data, rate, seed)
        wall, epochs, best_epoch = _train_net(net, data, seed, *_mlp_schedule(data))
        total += wall
        torch.manual_seed(seed)
        val = metrics_of(*_mc_predict(net, data.x_val), data.y_val, float(data.y_std))
        tried[rate] = val["log_lik"]
        if best is None or val["log_lik"] > best[0]:
            best = (val["log_lik"], rate, net, wall, epochs, best_epoch)
    _, rate, net, wall, epochs, best_epoch = best

    def predict(x):
        torch.manual_seed(seed)
        return _mc_predict(net, x)

    return {
        "predict": predict,
        "fit_s": total,
        "fit_s_chosen": wall,
        "epochs": epochs,
        "best_epoch": best_epoch,
        "dropout": rate,
        "val_ll_by_rate": tried,
        "noise_std": float(net.noise_std.detach().reshape(-1)[0]),
    }


def _equal_mixture(predicts: Sequence) -> Callable:
    """The equal-weight mixture of members' predictions: ``predict(x)`` concatenating every
    member's ``(mean [T_k, S], var [T_k, S])`` components (each member's own components equally
    weighted, as its sample draws or its single Gaussian are)."""

    def predict(x):
        parts = [member(x) for member in predicts]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    return predict


def fit_ensemble(data, seed: int, members: int = 5) -> dict:
    nets, total, epochs = [], 0.0, []
    for k in range(members):
        net = _mlp(data, 0.0, 1000 * seed + k)
        wall, ep, _ = _train_net(net, data, 1000 * seed + k, *_mlp_schedule(data))
        nets.append(net.eval())
        total += wall
        epochs.append(ep)

    def one(net):
        def predict(x):
            with torch.no_grad():
                out = net(x)
            return out.mean.reshape(1, -1), out.variance.reshape(1, -1)

        return predict

    predict = _equal_mixture([one(net) for net in nets])
    return {"predict": predict, "fit_s": total, "epochs": float(np.sum(epochs))}


def student_t_likelihood(df: float):
    """GPyTorch's ``StudentTLikelihood`` with its degrees of freedom fixed at ``df`` (as the
    Bayesian GPN's ``StudentTHead(df=...)``), its scale learned."""
    from gpytorch.likelihoods import StudentTLikelihood

    likelihood = StudentTLikelihood()
    likelihood.deg_free = df
    likelihood.raw_deg_free.requires_grad_(False)
    return likelihood


def student_t_predictive(
    mean_f: Tensor, var_f: Tensor, scale2: float, df: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The predictive of Student-t noise (scale ``sqrt(scale2)``, ``df``) on the Gaussian latent
    outputs ``N(mean_f, var_f)`` (``[T, S]``, equal weights) as a Gaussian mixture ``(mean, var,
    weights)`` of :func:`metrics_of`: every latent component times the t's scale mixture
    (:func:`pyro_gpn.losses.student_t_scale_mixture`), exact given each Gaussian."""
    from pyro_gpn.losses import student_t_scale_mixture

    log_w, factors = student_t_scale_mixture(df, dtype=torch.float64)
    T, S = mean_f.shape
    K = factors.shape[0]
    mean = mean_f.double()[:, None, :].expand(T, K, S).reshape(T * K, S)
    var = (var_f.double()[:, None, :] + scale2 * factors[None, :, None]).reshape(T * K, S)
    weights = (log_w.exp() / T).expand(T, K).reshape(-1)
    return mean, var, weights / weights.sum()


def build_dgp(dims: int, hidden: int = 10, inducing: int = 64, df: float | None = None):
    """GPyTorch's 2-layer deep GP as in its DeepGP example (``hidden`` GPs, ``inducing`` points);
    Gaussian noise, or Student-t noise with ``df`` degrees of freedom (:func:`student_t_likelihood`:
    the deep GP's side of the GPN columns with Student-t noise, uci.md section 26)."""
    from gpytorch.distributions import MultivariateNormal
    from gpytorch.kernels import RBFKernel, ScaleKernel
    from gpytorch.likelihoods import GaussianLikelihood
    from gpytorch.means import ConstantMean, LinearMean
    from gpytorch.models.deep_gps import DeepGP, DeepGPLayer
    from gpytorch.variational import CholeskyVariationalDistribution, VariationalStrategy

    class HiddenLayer(DeepGPLayer):  # the structure of GPyTorch's DeepGP example
        def __init__(self, input_dims, output_dims, num_inducing, mean_type):
            if output_dims is None:
                points = torch.randn(num_inducing, input_dims)
                batch_shape = torch.Size([])
            else:
                points = torch.randn(output_dims, num_inducing, input_dims)
                batch_shape = torch.Size([output_dims])
            dist = CholeskyVariationalDistribution(num_inducing, batch_shape=batch_shape)
            strategy = VariationalStrategy(self, points, dist, learn_inducing_locations=True)
            super().__init__(strategy, input_dims, output_dims)
            self.mean_module = (
                ConstantMean(batch_shape=batch_shape)
                if mean_type == "constant"
                else LinearMean(input_dims)
            )
            self.covar_module = ScaleKernel(
                RBFKernel(batch_shape=batch_shape, ard_num_dims=input_dims),
                batch_shape=batch_shape,
            )

        def forward(self, x):
            return MultivariateNormal(self.mean_module(x), self.covar_module(x))

    class TwoLayerDGP(DeepGP):
        def __init__(self, dims):
            super().__init__()
            self.hidden_layer = HiddenLayer(dims, hidden, inducing, "linear")
            self.last_layer = HiddenLayer(hidden, None, inducing, "constant")
            self.likelihood = GaussianLikelihood() if df is None else student_t_likelihood(df)

        def forward(self, x):
            return self.last_layer(self.hidden_layer(x))

    return TwoLayerDGP(dims)


def fit_dgp(
    data,
    seed: int,
    hidden: int = 10,
    inducing: int = 64,
    samples: int = 10,
    steps: int = 2000,
    lr: float = 1e-2,
    eval_every: int = 25,
    patience: int = 20,
    batch_size: int | None = None,
    df: float | None = None,
) -> dict:
    """Fits :func:`build_dgp` (``df``: Student-t noise) by Adam on the ELBO, choosing the step
    on the validation rows' log-likelihood (every ``eval_every`` steps, ``patience`` checks).
    ``noise_std`` is the likelihood's ``sqrt(noise)``: the Gaussian's standard deviation, the
    t's scale (whose standard deviation is ``sqrt(df / (df - 2))`` times it)."""
    import gpytorch
    from gpytorch.mlls import DeepApproximateMLL, VariationalELBO

    torch.manual_seed(seed)
    x, y = data.x_train, data.y_train.reshape(-1)
    model = build_dgp(data.num_features, hidden, inducing, df)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    mll = DeepApproximateMLL(VariationalELBO(model.likelihood, model, x.shape[0]))

    def predict(xs):
        model.eval()
        with torch.no_grad(), gpytorch.settings.num_likelihood_samples(samples):
            if df is None:
                pred = model.likelihood(model(xs))
                out = pred.mean.reshape(samples, -1), pred.variance.reshape(samples, -1)
            else:
                latent = model(xs)
                out = student_t_predictive(
                    latent.mean.reshape(samples, -1),
                    latent.variance.reshape(samples, -1),
                    float(model.likelihood.noise),
                    df,
                )
        model.train()
        return out

    best, best_state, since, step_s, n_steps = -math.inf, None, 0, 0.0, 0
    gen = torch.Generator().manual_seed(seed)
    num = x.shape[0]
    per_epoch = 1 if batch_size is None else math.ceil(num / batch_size)
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        if batch_size is None:
            xb, yb = x, y
        else:
            idx = torch.randperm(num, generator=gen)[:batch_size]
            xb, yb = x[idx], y[idx]
        with gpytorch.settings.num_likelihood_samples(samples):
            opt.zero_grad()
            loss = -mll(model(xb), yb)
            loss.backward()
            opt.step()
        step_s += time.perf_counter() - t0
        n_steps = step
        if step % eval_every == 0:
            torch.manual_seed(seed)
            val = _score(predict, data.x_val, data.y_val, 1.0)["log_lik"]
            if val > best:
                best, best_state, since = val, copy.deepcopy(model.state_dict()), 0
            else:
                since += 1
                if since > patience:
                    break
    if best_state is not None:
        model.load_state_dict(best_state)

    def predict_seeded(xs):
        torch.manual_seed(seed)
        return predict(xs)

    return {
        "predict": predict_seeded,
        "fit_s": step_s,
        "epochs": n_steps / per_epoch,
        "noise_std": float(model.likelihood.noise.detach().sqrt()),
    }


def fit_dgp_ensemble(data, seed: int, members: int = 5, **options) -> dict:
    """``members`` deep GPs (:func:`fit_dgp`, model seeds ``seed + 1000 k``; member 0 is the
    ``dgp`` column's own fit) predicting the equal-weight mixture of their predictive samples
    (section 19: the deep GP's side of the five-network comparison)."""
    fits = [fit_dgp(data, seed + 1000 * k, **options) for k in range(members)]
    predict = _equal_mixture([f["predict"] for f in fits])
    return {**_ensemble_facts(fits, data), "predict": predict, "noise_std": fits[0]["noise_std"]}


def _score(predict, x: Tensor, y: Tensor, y_std: float) -> dict[str, float]:
    """:func:`metrics_of` of a model's ``predict(x)``: ``(mean, var)`` (equal weights) or
    ``(mean, var, weights)``."""
    mean, var, *weights = predict(x)
    return metrics_of(mean, var, y, y_std, weights[0] if weights else None)


def log_target_std(name: str, split: int) -> float:
    """``log y_std`` of a split: the standard deviation of the training split's targets
    (training and validation rows, as the data loader standardises) that the metrics convert
    standardised log densities to original units with."""
    from pyro_gpn.data.uci_regression import load_uci_regression

    data = load_uci_regression(name, DATA_DIR, split=split, seed=0, download=False)
    return math.log(float(data.y_std))


def run_cell(model: str, name: str, split: int, seed: int = 0) -> dict:
    """One cell: ``model`` fitted on split ``split`` of UCI set ``name`` and scored
    (:func:`score_cell`)."""
    from pyro_gpn.data.uci_regression import load_uci_regression

    if model == "bgpn_stack":
        raise SystemExit(
            "bgpn_stack holds the cells of uci.md section 29's rule (a stacked mixture left "
            "unscaled), which the library no longer follows: run bgpn_select (today's rule)"
        )
    data = load_uci_regression(name, DATA_DIR, split=split, seed=seed, download=False)
    return score_cell(model, data, split, seed)


def score_cell(model: str, data, split: int, seed: int = 0) -> dict:
    """Fit ``model`` on ``data`` (a :class:`~pyro_gpn.data.RegressionData`: its training rows,
    its validation rows for every choice) with seed ``seed + split``, and score it on the test
    and validation rows: the cell's record (metrics in original units, time, the fit's own
    fields). ``data.name`` decides the per-set settings (width, large-set batches and steps)."""
    name = data.name
    t0, c0 = time.perf_counter(), time.process_time()
    if model.removesuffix(PLL) in BGPN_MODELS:
        fit = fit_bgpn(data, bgpn_config(model, name), seed + split)
    elif model in ("bgpn_auto", "bgpn_select"):
        fit = fit_bgpn_auto(data, seed + split, "best" if model == "bgpn_auto" else "stack")
    elif model == "clt":
        fit = fit_clt(data, seed + split)
    elif model == "mcdrop":
        fit = fit_mcdrop(data, seed + split)
    elif model == "ensemble":
        fit = fit_ensemble(data, seed + split)
    elif model in ("dgp", "dgp_ens5", "dgp_t4"):
        fitter = fit_dgp_ensemble if model == "dgp_ens5" else fit_dgp
        options = {"df": 4.0} if model == "dgp_t4" else {}
        fit = fitter(
            data, seed + split, batch_size=LARGE_BATCH if name in LARGE else None, **options
        )
    else:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    predict = fit.pop("predict")
    fit.pop("net", None)
    y_std = float(data.y_std)
    test = _score(predict, data.x_test, data.y_test, y_std)
    val = _score(predict, data.x_val, data.y_val, y_std)
    return {
        "model": model,
        "set": name,
        "split": split,
        "seed": seed,
        "num_train": int(data.x_train.shape[0]),
        "num_val": int(data.x_val.shape[0]),
        "num_test": int(data.x_test.shape[0]),
        "test": test,
        "val": val,
        "cell_s": total,
        "cell_cpu_s": cpu,
        "s_per_epoch": fit.get("fit_s_chosen", fit["fit_s"]) / max(fit["epochs"], 1e-9),
        **fit,
    }


# ---------------------------------------------------------------------------------- driver
def _atomic_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=float))
    os.replace(tmp, path)


def load_cells(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def summary(out: Path, models=MODELS) -> str:
    """Markdown tables of what is in ``out``: per (set, model) mean ± s.e. over the splits that
    ran (listed in brackets), and the median wall time per fit with the load it ran under."""
    cells = load_cells(out)
    by: dict[tuple[str, str], list[dict]] = {}
    for c in cells:
        by.setdefault((c["set"], c["model"]), []).append(c)

    def ms(vals, d=2):
        v = np.asarray(vals, dtype=float)
        if len(v) == 1:
            return f"{v[0]:.{d}f}"
        return f"{v.mean():.{d}f} ± {v.std(ddof=1) / math.sqrt(len(v)):.{d}f}"

    def splits(cs):
        return ",".join(str(c["split"]) for c in sorted(cs, key=lambda c: c["split"]))

    present = [m for m in models if any(k[1] == m for k in by)]
    lines = []
    for metric, d in (("log_lik", 2), ("rmse", 4), ("coverage90", 2)):
        lines.append(f"\n**test {metric}** (mean ± s.e. over the splits in brackets)\n")
        lines.append("| set | " + " | ".join(present) + " |")
        lines.append("| --- |" + " --- |" * len(present))
        for name in SETS:
            row = []
            for m in present:
                cs = by.get((name, m))
                row.append(
                    f"{ms([c['test'][metric] for c in cs], d)} [{splits(cs)}]" if cs else "–"
                )
            if any(r != "–" for r in row):
                lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines.append(
        "\n**wall seconds per fit** (median over cells; load average at the end; median process "
        "CPU seconds over the [n] cells that recorded it)\n"
    )
    lines.append("| set | " + " | ".join(present) + " |")
    lines.append("| --- |" + " --- |" * len(present))
    for name in SETS:
        row = []
        for m in present:
            cs = by.get((name, m))
            if not cs:
                row.append("–")
                continue
            wall = np.median([c["cell_s"] for c in cs])
            load = np.median([c.get("load_avg_1m_end", float("nan")) for c in cs])
            cpu = [c["cell_cpu_s"] for c in cs if "cell_cpu_s" in c]
            cpu_text = f", CPU {np.median(cpu):.0f} s [{len(cpu)}]" if cpu else ""
            row.append(f"{wall:.0f} s (load {load:.0f}{cpu_text})")
        if any(r != "–" for r in row):
            lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def published_table(out: Path, model: str = "bgpn") -> str:
    """Markdown: ``model``'s test log-likelihood (mean ± s.e. over the splits that ran, listed)
    beside the published rows (:data:`PUBLISHED`), and whether it is ahead of each (``+``: the
    mean is higher). ``model="chosen"``: each set's validation choice (:data:`CHOSEN`);
    ``"ensembles"``: its five-network mixture where adopted (:data:`ENSEMBLES`), else that;
    ``"bgpn_stack_library"``: section 29's library rule (a stacked mixture left unscaled) on
    the ``bgpn_stack`` cells (:func:`benchmarks.uci_paired.library_metrics`). Sets where the
    model did not run are left out."""
    cells = load_cells(out)
    if model == "bgpn_stack_library":
        from benchmarks.uci_paired import library_metrics

        cells = [
            {
                **c,
                "model": model,
                "test": library_metrics(c, partial(log_target_std, c["set"], int(c["split"]))),
            }
            for c in cells
            if c["model"] == "bgpn_stack"
        ]
    lines = [
        f"| set | {model} (splits) | " + " | ".join(PUBLISHED_COLUMNS) + " |",
        "| --- | --- |" + " --- |" * len(PUBLISHED_COLUMNS),
    ]
    for name in SETS:
        columns = chosen_columns(model == "ensembles") if model in ("chosen", "ensembles") else {}
        wanted = columns.get(name, model)
        cs = sorted(
            (c for c in cells if c["set"] == name and c["model"] == wanted),
            key=lambda c: c["split"],
        )
        if not cs:
            continue
        v = np.asarray([c["test"]["log_lik"] for c in cs], dtype=float)
        se = f" ± {v.std(ddof=1) / math.sqrt(len(v)):.2f}" if len(v) > 1 else ""
        ours = f"{v.mean():.2f}{se} [{','.join(str(c['split']) for c in cs)}]"
        if model in ("chosen", "ensembles"):
            ours += f" `{wanted}`"
        row = [f"{m:.2f} ± {e:.2f} ({'+' if v.mean() > m else '−'})" for m, e in PUBLISHED[name]]
        lines.append(f"| {name} | {ours} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def machine() -> dict:
    """The machine a cell ran on (recorded in every cell since 2026-11-28)."""
    return {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def aggregate(out: Path, diag: Path | None = None) -> dict:
    """Means and standard errors per (model, set) and per (variant, set) of the diagnosis, with
    the time per fit (wall and process-CPU seconds per cell, seconds per epoch), the commands
    and the machine."""

    def stats(vals):
        v = np.asarray(vals, dtype=float)
        if not len(v):  # e.g. the deep GP's cells record no noise_std: no NaN in the JSON
            return None
        se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else None
        return {"mean": float(v.mean()), "se": se, "n": len(v)}

    def group(cells, key, part):
        by: dict[str, dict[str, list[dict]]] = {}
        for c in cells:
            by.setdefault(c[key], {}).setdefault(c["set"], []).append(c)
        return {
            k: {
                name: {
                    **{
                        m: stats([c[part][m] for c in cs])
                        for m in ("log_lik", "rmse", "coverage90")
                    },
                    "splits": sorted(c["split"] for c in cs),
                    "noise_std": stats([c["noise_std"] for c in cs if "noise_std" in c]),
                    **{
                        t: stats([c[t] for c in cs if t in c])
                        for t in ("cell_s", "cell_cpu_s", "s_per_epoch")
                    },
                    "load_avg_1m_end": stats(
                        [c["load_avg_1m_end"] for c in cs if "load_avg_1m_end" in c]
                    ),
                }
                for name, cs in sets.items()
            }
            for k, sets in by.items()
        }

    result = {
        "commands": {
            "cells": "python benchmarks/uci.py --sets SET... --splits SPLIT... --models MODEL... "
            "(or pyro-gpn uci ...; every new cell records its own command line under 'command')",
            "this file": "python benchmarks/uci.py --summary --json docs/results/uci.json",
        },
        "machine": {
            "cells": "a 2-core x86_64 CPU VM shared with other jobs, torch on one thread per "
            "process (OMP_NUM_THREADS=1); each cell records its load average at the end "
            "('load_avg_1m_end') and, since 2026-11-28, the machine ('machine')",
            "aggregated_on": machine(),
        },
        "times": "cell_s / cell_cpu_s: wall / process-CPU seconds of a whole cell (fit, "
        "validation and scoring); s_per_epoch: fit seconds per epoch of the training rows; each "
        "as mean, se and n over the cells that record it (cell_cpu_s since the second session)",
        "benchmark_test": group(load_cells(out), "model", "test"),
    }
    if diag is not None and diag.exists():
        result["diagnosis_validation"] = group(load_cells(diag), "variant", "val")
    result["published"] = {
        name: dict(zip(PUBLISHED_COLUMNS, rows, strict=True)) for name, rows in PUBLISHED.items()
    }
    result["bgpn_config"] = BGPN_CONFIG
    result["issue_config"] = ISSUE_CONFIG
    result["bgpn_long_schedules"] = SET_SCHEDULES
    result["chosen"] = chosen_columns()
    result["ensembles"] = dict(ENSEMBLES)
    return result


def _bounded_int(low: int, high: int | None) -> Callable[[str], int]:
    """An ``argparse`` type: an integer in ``[low, high]`` (no upper bound if ``high`` is
    ``None``), refused by ``argparse`` with the range otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"at least {low}" if high is None else f"in {low}-{high}"
            raise argparse.ArgumentTypeError(f"expected an integer {bounds}, got {value}")
        return value

    return parse


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--sets", nargs="+", default=["boston", "concrete", "energy", "wine", "yacht"])
    p.add_argument(
        "--splits",
        nargs="+",
        type=_bounded_int(0, NUM_SPLITS - 1),
        default=list(range(NUM_SPLITS)),
        help=f"fixed splits 0-{NUM_SPLITS - 1} (protein's others than 0-4 are skipped)",
    )
    p.add_argument(
        "--models",
        nargs="+",
        default=["bgpn", "clt", "mcdrop", "dgp"],
        help="benchmark models (chosen: each set's validation-chosen Bayesian GPN)",
    )
    p.add_argument("--seed", type=_bounded_int(0, 2**32 - 1), default=0)
    p.add_argument("--out", default=str(ROOT / "docs/results/uci_runs"))
    p.add_argument("--summary", action="store_true", help="print the table and exit")
    p.add_argument("--large-steps", type=_bounded_int(1, None), default=LARGE_STEPS["value"])
    p.add_argument("--json", default=None, help="with --summary: write the aggregate here")
    p.add_argument("--diag", default=str(ROOT / "docs/results/uci_diagnose_runs"))
    a = p.parse_args(argv)
    unknown = sorted({m for m in a.models if m not in (*MODELS, "chosen")})
    if unknown:
        p.error(f"unknown model(s) {unknown}: choose from chosen, {', '.join(MODELS)}")
    bad_sets = sorted(set(a.sets) - set(SETS))
    if bad_sets:
        p.error(f"unknown set(s) {bad_sets}: choose from {', '.join(SETS)}")
    if "protein" in a.sets and not a.summary:
        skipped = sorted({k for k in a.splits if k >= NUM_SPLITS_PROTEIN})
        if a.sets == ["protein"] and set(a.splits) <= set(skipped):
            p.error(f"protein has {NUM_SPLITS_PROTEIN} splits (0-4), got --splits {skipped}")
        if skipped:
            print(f"# protein has {NUM_SPLITS_PROTEIN} splits: skipping its splits {skipped}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.summary:
        print(summary(out))
        print("\n**against the published rows** (test log-likelihood)\n")
        print(published_table(out))
        print("\n**the validation-chosen Bayesian GPN against the published rows**\n")
        print(published_table(out, "chosen"))
        print("\n**five Bayesian GPNs mixed where validation adopted it (else as above)**\n")
        print(published_table(out, "ensembles"))
        print(
            "\n**the best single candidate (`bgpn_auto`, `select_vgpn(combine='best')`) "
            "against the published rows**\n"
        )
        print(published_table(out, "bgpn_auto"))
        print("\n**the library's stacked portfolio (`bgpn_stack`) against the published rows**\n")
        print(published_table(out, "bgpn_stack"))
        print(
            "\n**the same with section 29's rule, mixtures unscaled (`bgpn_stack_library`), "
            "against the published rows**\n"
        )
        try:  # it rebuilds calibrated mixtures, which needs each split's target scale
            print(published_table(out, "bgpn_stack_library"))
        except DataUnavailableError as error:
            print(f"(not available without the data sets: {error})")
        print(
            "\n**the library's default today (`bgpn_select`: a mixture's scale cross-fitted "
            "with the stacking inside) against the published rows**\n"
        )
        print(published_table(out, "bgpn_select"))
        if a.json:
            _atomic_json(Path(a.json), aggregate(out, Path(a.diag)))
        return 0
    LARGE_STEPS["value"] = a.large_steps
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(
        f"# {platform.node()} torch {torch.__version__} threads {torch.get_num_threads()}",
        flush=True,
    )
    chosen = chosen_columns()
    command = " ".join(
        [prog or "python benchmarks/uci.py", *(argv if argv is not None else sys.argv[1:])]
    )
    for split in a.splits:
        for name in a.sets:
            if name == "protein" and split >= NUM_SPLITS_PROTEIN:
                continue
            for model in dict.fromkeys(chosen[name] if m == "chosen" else m for m in a.models):
                path = out / f"{model}__{name}__{split:02d}.json"
                if path.exists():
                    continue
                print(
                    f"[{time.strftime('%H:%M:%S')}] {model} {name} split {split} (load "
                    f"{os.getloadavg()[0]:.2f})",
                    flush=True,
                )
                cell = run_cell(model, name, split, a.seed)
                cell["load_avg_1m_end"] = os.getloadavg()[0]
                cell["machine"] = machine()
                cell["command"] = command
                _atomic_json(path, cell)
                t = cell["test"]
                print(
                    f"    test ll {t['log_lik']:.3f} rmse {t['rmse']:.3f} cov90 "
                    f"{t['coverage90']:.2f} | {cell['cell_s']:.0f}s, "
                    f"{cell['s_per_epoch']:.4f} s/epoch",
                    flush=True,
                )
    print(summary(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
