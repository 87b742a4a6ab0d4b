"""The reduced MNIST experiment: the paper's 784x30x15x10 networks on the 10,000 test images only.

The full experiment (``pyro-gpn train mnist ...``) needs the 60,000 training images, which are
not available offline here. ``load_dataset("mnist-test-only")`` splits the 10,000 official test
images, stratified and seeded, into 8,000 for training (7,200 train + 800 validation) and 2,000
for testing, so the numbers are **not** comparable with the paper's (which trains on 54,000
rows): they compare the fixed-tanh network with the GPN mean + variance network under the
paper's protocol on less data.

Each run is one ``pyro-gpn train`` command (the grid's protocol: Adam 1e-3, /10 on a validation
plateau of 30 epochs, stop at 1e-6, best-validation parameters, batch 128); finished runs are
skipped, so the script can be continued. Usage::

    OMP_NUM_THREADS=1 python benchmarks/mnist_reduced.py --data-dir ../shared/datasets \\
        --work-dir /tmp/mnist-reduced --seeds 0 1 2 --out docs/results/mnist_reduced.md
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

MODELS = {
    "tanh": ["--model", "tanh"],
    "gpn-meanvar": ["--model", "gpn", "--mode", "meanvar", "--init", "random"],
}
PAPER = {"tanh": (0.0162, 0.0451, 0.0546), "gpn-meanvar": (0.0212, 0.0426, 0.0521)}


def train_command(model: str, seed: int, out: Path, data_dir: str | None) -> list[str]:
    command = ["pyro-gpn", "train", "mnist-test-only", *MODELS[model], "--seed", str(seed)]
    command += ["--patience", "30", "--max-epochs", "1000", "--batch-size", "128"]
    if data_dir:
        command += ["--data-dir", data_dir]
    return command + ["--out", str(out), "--threads", "1", "--quiet", "--resume"]


def _mean_sd(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def to_markdown(results: dict[str, list[dict]], script_command: str) -> str:
    first = next(r for runs in results.values() for r in runs)
    lines = [
        "# Reduced MNIST (784x30x15x10 on the 10,000 test images only)",
        "",
        "**Not the paper's experiment**: only the 10,000 official test images are available here.",
        f"Data: {first['data']}. Written by `benchmarks/mnist_reduced.py`:",
        "",
        f"    {script_command}",
        "",
        f"Machine: {first['machine']}, torch {first['torch']}, one thread per run, other jobs "
        "running beside it. Protocol: the paper grid's (`docs/results/paper_protocol.md`): Adam "
        "1e-3, /10 on a validation plateau of 30 epochs, stop at 1e-6, best-validation "
        "parameters, batch 128. Each run's exact `pyro-gpn train` command is in its "
        "`result.json`; mean ± sample standard deviation over seeds.",
        "",
        "| model | seeds | train error | val error | test error | epochs | train s "
        "| paper (60k) train / val / test |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, runs in results.items():
        if not runs:
            continue
        errors = {
            split: _mean_sd([r[f"{split}_error"] for r in runs])
            for split in ("train", "val", "test")
        }
        seeds = ", ".join(str(r["seed"]) for r in runs)
        epochs = ", ".join(str(r["epochs"]) for r in runs)
        seconds = ", ".join(f"{r['wall_time_s']:.0f}" for r in runs)
        paper = " / ".join(f"{v:.4f}" for v in PAPER[model])
        lines.append(
            f"| {model} | {seeds} | {errors['train']} | {errors['val']} | {errors['test']} "
            f"| {epochs} | {seconds} | {paper} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="folder with the MNIST t10k files")
    parser.add_argument("--work-dir", default="mnist-reduced", help="one folder per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--out", default=None, help="write the markdown table here")
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    results: dict[str, list[dict]] = {model: [] for model in args.models}
    for seed in args.seeds:
        for model in args.models:
            out = work / f"{model}-seed{seed}"
            if not (out / "result.json").exists():
                command = train_command(model, seed, out, args.data_dir)
                print("$", shlex.join(command), flush=True)
                subprocess.run(command, check=True)
            record = json.loads((out / "result.json").read_text())
            results[model].append({"seed": seed, **_errors(record), **record})
    script = "OMP_NUM_THREADS=1 python benchmarks/mnist_reduced.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    markdown = to_markdown(results, script)
    print(markdown)
    if args.out:
        Path(args.out).write_text(markdown)
    return 0


def _errors(record: dict) -> dict[str, float]:
    """``train_error``, ``val_error`` and ``test_error`` of a ``pyro-gpn train`` result."""
    metrics = record["metrics"]
    return {f"{split}_error": metrics[split]["error"] for split in ("train", "val", "test")}


if __name__ == "__main__":
    sys.exit(main())
