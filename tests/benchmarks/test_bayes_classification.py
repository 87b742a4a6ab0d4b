"""The metrics and table of ``benchmarks/bayes_classification.py``."""

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss

from benchmarks.bayes_classification import class_metrics, summary


def test_class_metrics_match_sklearn():
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(200, 5, generator=gen, dtype=torch.float64).softmax(-1)
    y = torch.randint(0, 5, (200,), generator=gen)
    got = class_metrics(probs, y)
    assert got["nll"] == pytest.approx(log_loss(y.numpy(), probs.numpy(), labels=range(5)))
    assert got["error"] == pytest.approx(np.mean(probs.argmax(1).numpy() != y.numpy()))


def test_class_metrics_of_a_zero_probability_stay_finite_and_reject_bad_shapes():
    got = class_metrics(torch.tensor([[1.0, 0.0]], dtype=torch.float64), torch.tensor([1]))
    assert got["error"] == 1.0 and 600 < got["nll"] < 800  # -log(1e-300), not inf
    with pytest.raises(ValueError, match="probs"):
        class_metrics(torch.ones(3), torch.zeros(3))
    with pytest.raises(ValueError, match="probs"):
        class_metrics(torch.ones(3, 2), torch.zeros(4))


def test_summary_puts_the_bayesian_rows_beside_the_ml_rows(tmp_path):
    runs, paper = tmp_path / "runs", tmp_path / "paper"
    runs.mkdir(), paper.mkdir()
    for seed, err in enumerate((0.10, 0.12)):
        ml = dict(model="gpn-meanvar", init="random", share="none", seed=seed, train_time_s=5.0)
        ml.update(train_error=0.05, val_error=0.08, test_error=err)
        (paper / f"letter__gpn-meanvar__random__none__seed{seed}.json").write_text(json.dumps(ml))
        cell = dict(tag="bgpn", set="letter", seed=seed, cell_cpu_s=3.0, load_avg_1m_end=1.0)
        cell.update(train_error=0.04, val_error=0.07, test_error=err - 0.02, test_nll=0.3 + seed)
        (runs / f"bgpn__letter__seed{seed}.json").write_text(json.dumps(cell))
    table = summary(runs, paper)
    ml_row = next(r for r in table.splitlines() if "ML GPN (gpn-meanvar, random, none)" in r)
    bayes_row = next(r for r in table.splitlines() if "Bayesian GPN (bgpn)" in r)
    assert "0.1100 ± 0.0141" in ml_row and "not recorded" in ml_row
    assert (
        "0.0900 ± 0.0141" in bayes_row and "0.800 ± 0.707" in bayes_row and "| 0,1 |" in bayes_row
    )
