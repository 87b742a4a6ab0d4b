"""``benchmarks.nuts_informed_chain --fits``: the anchor's Gauss-Newton curvature against the
observed Hessian of the integrated likelihood at a fit (``docs/results/nuts.md``)."""

from __future__ import annotations

import pytest

from benchmarks.nuts_informed_chain import main


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fits_report_curvature(tmp_path):
    report = main(["--checkpoint-dir", str(tmp_path), "--fits", "--num-chains", "1"])
    fit = report["fit0"]
    assert fit["corr_with_fit0"] == 1.0 and fit["a_range"][0] < fit["a_range"][1]
    hess, gauss_newton = fit["hessian_trace_max_median"], fit["gauss_newton_trace_max_median"]
    # the recorded figures: 15,715 / 901.5 against 17,943 / 903.4
    assert abs(gauss_newton[1] / hess[1] - 1) < 0.05
    assert abs(gauss_newton[0] / hess[0] - 1) < 0.25
    with pytest.raises(ValueError, match="checkpoint-dir"):
        main(["--checkpoint-dir", str(tmp_path)])
