"""Speed and memory of one GPN layer against a fixed-activation layer (paper tab:gpn_exp_mem_time).

One layer of 50 units with 50 inputs (the paper's hidden layer), forward + backward pass:

* ``tanh``     -- ``Linear(50, 50)`` + tanh, the fixed-activation baseline;
* ``mean``     -- GPN layer propagating means only;
* ``meanvar``  -- GPN layer propagating means and variances (input variances given);
* ``cov``      -- GPN layer propagating the full covariance (input covariances given);
* ``meanvar-f32`` -- ``meanvar`` with the GP algebra in float32 (``compute_dtype=None``)
  instead of the layers' default float64: the price of the numerically safe default.

Each variant is timed in the same process, interleaved round by round, and reported as the
median over rounds and as a ratio to ``tanh`` measured in the same run. Peak memory is the
peak of live tensor memory during one forward + backward pass: on CUDA
``torch.cuda.max_memory_allocated``; on CPU from the PyTorch profiler's allocation events (op
granularity, so temporaries freed inside a single op are not seen).

Usage::

    python benchmarks/layer_speed.py                       # CPU (and CUDA when present)
    python benchmarks/layer_speed.py --batch 256 1024 --rounds 200 --out docs/results/layer_speed.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from pyro_gpn import GPNLayer, Moments

VARIANTS = ("tanh", "mean", "meanvar", "cov", "meanvar-f32")
PAPER = {
    "tanh": (9, 30),
    "mean": (29, 94),
    "meanvar": (36, 113),
    "cov": (118, 227),
    "meanvar-f32": (36, 113),
}


def make_step(variant: str, batch: int, width: int, device: torch.device) -> Callable[[], None]:
    """A closure running one forward + backward pass of ``variant``."""
    gen = torch.Generator().manual_seed(0)
    mean = torch.rand(batch, width, generator=gen).to(device)
    if variant == "tanh":
        layer = torch.nn.Linear(width, width).to(device)

        def step() -> None:
            torch.tanh(layer(mean)).sum().backward()

        return step
    mode, _, precision = variant.partition("-")
    compute_dtype = None if precision == "f32" else torch.float64
    layer = GPNLayer(width, width, compute_dtype=compute_dtype).to(device)
    if mode == "mean":
        inputs = Moments(mean, validate=False)
    elif mode == "meanvar":
        var = (0.1 * torch.rand(batch, width, generator=gen)).to(device)
        inputs = Moments(mean, var=var, validate=False)
    else:
        a = torch.randn(batch, width, width, generator=gen) / width
        cov = (0.1 * a @ a.mT + 0.01 * torch.eye(width)).to(device)
        inputs = Moments(mean, cov=cov, validate=False)

    def step() -> None:
        out = layer.propagate(inputs, mode)
        total = out.mean.sum()
        if out.var is not None:
            total = total + out.var.sum()
        if out.cov is not None:
            total = total + out.cov.sum()
        total.backward()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(step: Callable[[], None], device: torch.device) -> float:
    """Peak live tensor memory in MB of one call of ``step`` (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = []
    for e in prof.events():
        delta = e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        events.append((e.time_range.start, delta))
    events.sort()
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak / 2**20


def benchmark(
    batch: int,
    width: int,
    rounds: int,
    device: torch.device,
    variants=VARIANTS,
    cov_rounds: int | None = None,
) -> dict[str, dict]:
    """Median times of ``variants``; the costly ``cov`` variant runs in the first
    ``cov_rounds`` rounds only (default: all)."""
    cov_rounds = rounds if cov_rounds is None else cov_rounds
    steps = {v: make_step(v, batch, width, device) for v in variants}
    for v, step in steps.items():  # warm-up
        for _ in range(2 if v == "cov" else 5):
            step()
    times: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(rounds):  # interleaved, so load changes hit every variant alike
        for v, step in steps.items():
            if v == "cov" and i >= cov_rounds:
                continue
            _sync(device)
            start = time.perf_counter()
            step()
            _sync(device)
            times[v].append(time.perf_counter() - start)
    results = {}
    for v in variants:
        ms = [1e3 * t for t in times[v]]
        q = statistics.quantiles(ms, n=4) if len(ms) > 1 else (ms[0], ms[0], ms[0])
        results[v] = {
            "median_ms": statistics.median(ms),
            "iqr_ms": (q[0], q[2]),
            "peak_mb": peak_memory(steps[v], device),
        }
    for v in variants:
        results[v]["ratio"] = results[v]["median_ms"] / results["tanh"]["median_ms"]
    return results


def machine_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return (
        f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )


def to_markdown(all_results: list[tuple[str, int, dict]], command: str, args) -> str:
    lines = [
        "# Layer speed and memory (paper Table tab:gpn_exp_mem_time)",
        "",
        f"Command: `{command}`",
        "",
        f"Date: {datetime.date.today().isoformat()}. One layer of {args.width} units with "
        f"{args.width} inputs, {args.rounds} interleaved rounds "
        f"(cov: {args.cov_rounds or args.rounds}) "
        "after warm-up calls; median "
        "time of forward + backward, [25 %, 75 %] quantiles, ratio to the tanh layer measured "
        "in the same run, and peak live tensor memory of one pass.",
        "",
    ]
    for machine, batch, res in all_results:
        lines += [
            f"## {machine}, batch {batch}",
            "",
            "| variant | median ms | IQR ms | x tanh | peak MB | paper ms (GPU, 2017) | paper MB |",
            "|---|---|---|---|---|---|---|",
        ]
        for v, r in res.items():
            lines.append(
                f"| {v} | {r['median_ms']:.3f} | {r['iqr_ms'][0]:.3f}–{r['iqr_ms'][1]:.3f} | "
                f"{r['ratio']:.2f} | {r['peak_mb']:.2f} | {PAPER[v][0]} | {PAPER[v][1]} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--width", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument(
        "--device", nargs="+", default=None, help="cpu and/or cuda (default: all present)"
    )
    parser.add_argument(
        "--cov-rounds", type=int, default=None, help="rounds for cov (default: all)"
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", default=None, help="write a markdown table here")
    args = parser.parse_args(argv)
    devices = args.device or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    all_results = []
    for name in devices:
        device = torch.device(name)
        for batch in args.batch:
            res = benchmark(
                batch,
                args.width,
                args.rounds,
                device,
                ["tanh", *[v for v in args.variants if v != "tanh"]],
                cov_rounds=args.cov_rounds,
            )
            machine = machine_description(device)
            all_results.append((machine, batch, res))
            print(f"{machine}, batch {batch}")
            for v, r in res.items():
                print(
                    f"  {v:8s} {r['median_ms']:8.3f} ms  x{r['ratio']:6.2f}  {r['peak_mb']:8.2f} MB"
                )
    if args.out:
        command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
        with open(args.out, "w") as fh:
            fh.write(to_markdown(all_results, command, args))


if __name__ == "__main__":
    main()
