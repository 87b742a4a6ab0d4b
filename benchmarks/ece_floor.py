"""How small can a calibration error measured on a few hundred test images be?

Issue 17 asks for a variational GPN CNN whose expected calibration error (ECE, 15 bins) is at
most half the ReLU CNN's. On the 360 test images of the 8x8 digits, ECE is a noisy, positively
biased estimate: even a perfectly calibrated model shows a non-zero ECE. This script measures
that floor by consistency resampling (Broecker & Smith 2007, "Increasing the reliability of
reliability diagrams"): for each trained model it draws ``--draws`` label sets
``y* ~ Categorical(p)`` from the model's own test probabilities ``p`` -- the labels a model
calibrated by construction would see -- and scores ``ECE(p, y*)``. It reports, per model and
seed, the observed test ECE, the floor's mean and 90 % range, and the fraction of resampled ECEs
at or above the observed one (a p-value of "this model is calibrated").

The models are `benchmarks/conv_rnn.py`'s (same data, network, trainer and seeds).

    OMP_NUM_THREADS=1 python benchmarks/ece_floor.py digits --seeds 0 1 2 3 4 5 6 7 8 9 \
        --models relu vgpn --json docs/results/conv_rnn_runs/ece_floor.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conv_rnn import CNN, _append, digits_data, gpn_cnn, mnist_data, train  # noqa: E402

from pyro_gpn.metrics import expected_calibration_error  # noqa: E402


def consistency_floor(
    probs: torch.Tensor, draws: int, seed: int, num_bins: int = 15
) -> torch.Tensor:
    """ECE of ``probs [S, C]`` against ``draws`` label sets drawn from ``probs`` itself."""
    g = torch.Generator().manual_seed(seed)
    probs = probs.to(torch.float64)
    probs = probs / probs.sum(-1, keepdim=True)
    labels = torch.multinomial(probs, draws, replacement=True, generator=g).T  # [draws, S]
    return torch.stack([expected_calibration_error(probs, y, num_bins) for y in labels])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("task", choices=("digits", "mnist"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--models", nargs="+", default=["relu", "vgpn"])
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--objective", default=None, choices=("closed_form", "predictive"))
    ap.add_argument("--data-dir", default=os.environ.get("PYRO_GPN_TEST_DATA"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.task == "digits":
        train_set, val_set, test_set, shape, _ = digits_data()
    else:
        train_set, val_set, test_set, shape, _ = mnist_data(args.data_dir)
    x_test, y_test = test_set
    for seed in args.seeds:
        for name in args.models:
            torch.manual_seed(seed)
            if name in ("relu", "tanh"):
                model = CNN(shape, (8, 16), 10, name)
            else:
                n = train_set[0].shape[0]
                model = gpn_cnn(shape, (8, 16), 10, name == "vgpn", n, args.objective)
            train(model, train_set, val_set, args.epochs, 3e-3, 64, 5, seed)
            model.eval()
            with torch.no_grad():
                probs = (
                    model.probs(x_test) if isinstance(model, CNN) else model.predict(x_test).probs
                )
            probs = probs.to(torch.float64)
            observed = float(
                expected_calibration_error(probs / probs.sum(-1, keepdim=True), y_test)
            )
            floor = consistency_floor(probs, args.draws, seed)
            row = {
                "task": args.task,
                "model": name,
                "seed": seed,
                "objective": getattr(model, "objective", None),
                "test_images": int(y_test.shape[0]),
                "test_ece": observed,
                "floor_mean": float(floor.mean()),
                "floor_q05": float(floor.quantile(0.05)),
                "floor_q95": float(floor.quantile(0.95)),
                "p_calibrated": float((floor >= observed).double().mean()),
                "test_error": float((probs.argmax(-1) != y_test).double().mean()),
                "mean_confidence": float(probs.max(-1).values.mean()),
                "draws": args.draws,
            }
            print(json.dumps(row), flush=True)
            _append(args.json, row)


if __name__ == "__main__":
    main()
