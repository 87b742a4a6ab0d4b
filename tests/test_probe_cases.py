"""The fault probe's classifier (``tests/probe_cases.py``) puts known outcomes in the right class.

The probe's cases themselves are not run here: many fail on purpose until issue 14 is fixed
(``docs/results/fault_probe.md`` holds today's picture). These tests keep the machinery honest
so that the cases can become a parametrised test as they are fixed.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from pyro_gpn._validation import check_finite

from .probe_cases import FAULTS, FIXES, KINDS, Case, CliResult, cases, classify


def _case(run, **kw) -> Case:
    return Case("synthetic/x", "synthetic", "value", run, **{"names": ("x",), **kw})


def _raise_torch_error(tmp):
    return torch.ones(2, 3) @ torch.ones(2, 3)  # shape error from inside torch


def test_a_library_check_naming_the_argument_is_clear(tmp_path):
    outcome = classify(_case(lambda t: check_finite("x", torch.tensor([math.nan]))), tmp_path)
    assert outcome.kind == "clear", outcome
    assert "x contains NaN values" in outcome.message


def test_a_library_check_naming_another_argument_is_unclear(tmp_path):
    run = lambda t: check_finite("features.mean", torch.tensor([math.nan]))
    assert classify(_case(run), tmp_path).kind == "unclear"


def test_an_error_from_inside_torch_is_unclear_even_if_it_names_the_argument(tmp_path):
    outcome = classify(_case(_raise_torch_error, names=("mat1",)), tmp_path)
    assert outcome.kind == "unclear" and "RuntimeError" in outcome.message


def test_results_are_handled_only_when_finite_and_checked(tmp_path):
    good = _case(lambda t: torch.ones(3), expect="result")
    assert classify(good, tmp_path).kind == "handled"
    nan = _case(lambda t: torch.tensor([1.0, math.nan]), expect="result")
    assert classify(nan, tmp_path).kind == "silent"
    garbage_accepted = _case(lambda t: torch.ones(3))  # expect="error" by default
    assert classify(garbage_accepted, tmp_path).kind == "silent"
    wrong = _case(lambda t: torch.ones(3), expect="result", check=lambda r, w: "wrong value")
    assert classify(wrong, tmp_path).message == "wrong value"


def test_a_warning_naming_the_argument_turns_a_silent_result_into_handled(tmp_path):
    import warnings

    def run(tmp):
        warnings.warn("x is of order 1e6: standardise the inputs", stacklevel=1)
        return torch.ones(1)

    assert classify(_case(run), tmp_path).kind == "handled"


def test_a_hang_is_a_crash(tmp_path):
    outcome = classify(_case(lambda t: time.sleep(10), timeout=0.3), tmp_path)
    assert outcome.kind == "crash" and "hang" in outcome.message


@pytest.mark.parametrize(
    ("result", "kind"),
    [
        (CliResult(1, "", "Traceback (most recent call last):\n  ...\nKeyError: 'x'\n"), "crash"),
        (CliResult(2, "", "pyro-gpn: error: x is broken\n"), "clear"),
        (CliResult(2, "", "pyro-gpn: error: something is broken\n"), "unclear"),
        (CliResult(0, "test: rmse 0.9\n", ""), "silent"),
        (CliResult(-9, "", "", timed_out=True), "crash"),
    ],
)
def test_command_line_outcomes(tmp_path, result, kind):
    assert classify(_case(lambda t: result), tmp_path).kind == kind


def test_a_post_check_problem_downgrades_a_clear_error(tmp_path):
    def run(tmp):
        (tmp / ".x.tmp").write_text("partial")
        check_finite("x", torch.tensor([math.inf]))

    post = lambda tmp: "leftover" if list(tmp.glob("*.tmp")) else None
    outcome = classify(_case(run, post=post), tmp_path)
    assert outcome.kind == "unclear" and "leftover" in outcome.message


def test_the_case_table_is_well_formed():
    table = cases()
    assert len({case.id for case in table}) == len(table) > 150
    for case in table:
        assert case.fault in FAULTS, case.id
        assert case.expect in ("error", "result", "either"), case.id
        assert case.names or case.expect == "result", case.id
    assert set(KINDS) == {"clear", "handled", "unclear", "silent", "crash"}
    assert set(FIXES) <= {case.id for case in table}
