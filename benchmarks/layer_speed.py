"""Speed and memory of one GPN layer, and of a whole training step, against tanh (paper
tab:gpn_exp_mem_time).

One layer of 50 units with 50 inputs (the paper's hidden layer), forward + backward pass:

* ``tanh`` -- ``Linear(50, 50)`` + tanh, the fixed-activation baseline (float32);
* ``<mode>-<dtype>-<backend>`` -- a GPN layer with ``mode`` ``mean`` (means only),
  ``meanvar`` (means and variances, input variances given) or ``cov`` (full covariance, input
  covariances given), its GP algebra in ``f64`` (the layers' default ``compute_dtype``) or
  ``f32`` (``compute_dtype=None``), on backend ``reference`` (plain PyTorch), ``cpu`` (the
  Numba kernels, :mod:`pyro_gpn.moments.cpu_kernels`) or ``triton`` (CUDA).

Whole network (``--nets``): one training step (loss, backward, Adam step) of the paper's Letter
network ``GPNNet([16, 30, 15, 26])`` (softmax head) and of a UCI regression network
``GPNNet([13, 50, 1])`` (gaussian head), propagating ``--net-modes`` (``meanvar``, ``cov``),
each against the tanh network of the same sizes (cross-entropy resp. squared error), on every
backend.

Each variant is timed in the same process, interleaved round by round, and reported as the
median over rounds and as a ratio to ``tanh`` measured in the same run; ``cpu-x`` is the same
ratio of the median *process CPU time* (less sensitive to other jobs on a shared machine).
Peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on CPU from the PyTorch profiler's
allocation events (op granularity; the Numba kernels' NumPy buffers are not seen).

Usage (the documented run, one line)::

    OMP_NUM_THREADS=1 python benchmarks/layer_speed.py --out docs/results/layer_speed.md

``--baseline REV`` also times the package as it was at git revision ``REV`` (extracted with
``git archive`` into a temporary folder and imported as ``pyro_gpn_base``) in the same process:
its variants carry the suffix ``@REV`` (for example ``meanvar-f64-cpu@429b211``), so an old and
a new kernel are compared side by side under the same load.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from types import ModuleType

import torch
from torch.profiler import ProfilerActivity, profile

from pyro_gpn import GPNLayer, GPNNet, Moments
from pyro_gpn.moments.backend import backend, numba_available, triton_available

MODES = ("mean", "meanvar", "cov")
DTYPES = ("f64", "f32")
PAPER = {"tanh": (9, 30), "mean": (29, 94), "meanvar": (36, 113), "cov": (118, 227)}
NETS = {"letter": ([16, 30, 15, 26], "softmax"), "uci": ([13, 50, 1], "gaussian")}


_BASELINES: dict[str, ModuleType] = {}


def load_baseline(rev: str) -> ModuleType:
    """The ``pyro_gpn`` package at git revision ``rev``, imported as ``pyro_gpn_base``."""
    if rev in _BASELINES:
        return _BASELINES[rev]
    if _BASELINES:
        raise ValueError("one --baseline revision per process")
    # a fixed folder per revision, reused: its Numba cache survives between runs
    root = pathlib.Path(tempfile.gettempdir()) / f"gpn_baseline_{rev}"
    if not (root / "pyro_gpn_base").is_dir():
        root.mkdir(parents=True, exist_ok=True)
        repo = pathlib.Path(__file__).resolve().parent.parent
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", rev, "pyro_gpn"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
        for path in (root / "pyro_gpn").rglob("*.py"):
            text = path.read_text()
            path.write_text(re.sub(r"\bpyro_gpn\b(?=[.\s])", "pyro_gpn_base", text))
        (root / "pyro_gpn").rename(root / "pyro_gpn_base")
    sys.path.insert(0, str(root))
    module = importlib.import_module("pyro_gpn_base")
    _BASELINES[rev] = module
    return module


def _package(variant: str) -> tuple[str, ModuleType | None]:
    """``variant`` without its ``@REV`` suffix, and the baseline package it names (or None)."""
    if "@" not in variant:
        return variant, None
    name, rev = variant.split("@", 1)
    return name, load_baseline(rev)


def backends_for(device: torch.device) -> list[str]:
    """The backends that can run on ``device``."""
    if device.type == "cuda":
        return ["reference", "triton"] if triton_available() else ["reference"]
    return ["reference", "cpu"] if numba_available() else ["reference"]


def all_variants(
    device: torch.device,
    modes=MODES,
    dtypes=DTYPES,
    baseline: str | None = None,
    backends: list[str] | None = None,
) -> list[str]:
    out = ["tanh"]
    for mode in modes:
        for dt in dtypes:
            for be in backends_for(device):
                if not backends or be in backends:
                    out += _variants(mode, dt, be, baseline)
    return out


def _variants(mode: str, dt: str, be: str, baseline: str | None) -> list[str]:
    """The variant names of ``mode`` on backend ``be`` in dtype ``dt`` (none where it cannot
    run), and of the baseline revision where it has them."""
    if be == "cpu" and dt == "f32" and mode != "mean":
        return []  # float32 algebra: the layer's Cholesky factors need the reference path
    out = [f"{mode}-{dt}-{be}"]
    # the baseline's kernels; for cov its reference path (before Mehler's series, the only one
    # that had the cross term); in float32 its reference path too (the float32 layers' path)
    if baseline and (be == "reference" if mode == "cov" else (be != "reference" or dt == "f32")):
        out.append(f"{mode}-{dt}-{be}@{baseline}")
    return out


def _wrap(step: Callable[[], None], name: str, pkg: ModuleType | None = None) -> Callable[[], None]:
    if name == "auto":
        return step
    chooser = backend if pkg is None else pkg.moments.backend.backend

    def run() -> None:
        with chooser(name):
            step()

    return run


def make_step(variant: str, batch: int, width: int, device: torch.device) -> Callable[[], None]:
    """A closure running one forward + backward pass of ``variant``."""
    gen = torch.Generator().manual_seed(0)
    mean = torch.rand(batch, width, generator=gen).to(device)
    if variant == "tanh":
        layer = torch.nn.Linear(width, width).to(device)

        def step() -> None:
            torch.tanh(layer(mean)).sum().backward()

        return step
    variant, pkg = _package(variant)
    layer_cls, moments_cls = (GPNLayer, Moments) if pkg is None else (pkg.GPNLayer, pkg.Moments)
    mode, precision, name = variant.split("-")
    compute_dtype = None if precision == "f32" else torch.float64
    layer = layer_cls(width, width, compute_dtype=compute_dtype).to(device)
    Moments_ = moments_cls
    if mode == "mean":
        inputs = Moments_(mean, validate=False)
    elif mode == "meanvar":
        var = (0.1 * torch.rand(batch, width, generator=gen)).to(device)
        inputs = Moments_(mean, var=var, validate=False)
    else:
        a = torch.randn(batch, width, width, generator=gen) / width
        cov = (0.1 * a @ a.mT + 0.01 * torch.eye(width)).to(device)
        inputs = Moments_(mean, cov=cov, validate=False)

    def step() -> None:
        out = layer.propagate(inputs, mode)
        total = out.mean.sum()
        if out.var is not None:
            total = total + out.var.sum()
        if out.cov is not None:
            total = total + out.cov.sum()
        total.backward()

    return _wrap(step, name, pkg)


def make_net_step(variant: str, net: str, batch: int, device: torch.device) -> Callable[[], None]:
    """One training step (loss, backward, Adam step) of network ``net``: ``tanh`` or
    ``<mode>-<dtype>-<backend>`` (``mode`` ``meanvar`` or ``cov``)."""
    sizes, head = NETS[net]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, sizes[0], generator=gen).to(device)
    if head == "softmax":
        y = torch.randint(0, sizes[-1], (batch,), generator=gen).to(device)
    else:
        y = torch.randn(batch, sizes[-1], generator=gen).to(device)
    torch.manual_seed(0)
    if variant == "tanh":
        layers: list[torch.nn.Module] = []
        for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(torch.nn.Linear(m, n))
            if i < len(sizes) - 2:
                layers.append(torch.nn.Tanh())
        model = torch.nn.Sequential(*layers).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        lossf = torch.nn.CrossEntropyLoss() if head == "softmax" else torch.nn.MSELoss()

        def step() -> None:
            opt.zero_grad()
            lossf(model(x), y).backward()
            opt.step()

        return step
    variant, pkg = _package(variant)
    net_cls = GPNNet if pkg is None else pkg.GPNNet
    mode, precision, name = variant.split("-")
    compute_dtype = None if precision == "f32" else torch.float64
    model = net_cls(sizes, mode=mode, head=head, compute_dtype=compute_dtype).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        (model.loss(x, y) + model.penalty() / batch).backward()
        opt.step()

    return _wrap(step, name, pkg)


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


def time_steps(
    steps: dict[str, Callable[[], None]],
    rounds: int,
    device: torch.device,
    slow_rounds: int | None = None,
    memory: bool = True,
) -> dict[str, dict]:
    """Median wall and CPU times of ``steps`` (interleaved rounds after warm-up); variants
    starting with ``cov`` run in the first ``slow_rounds`` rounds only (default: all)."""
    slow_rounds = rounds if slow_rounds is None else slow_rounds
    first_call = {}
    for v, step in steps.items():  # warm-up (the first call compiles the Numba kernels)
        start = time.perf_counter()
        step()
        first_call[v] = time.perf_counter() - start
        for _ in range(1 if v.startswith("cov") else 4):
            step()
    times: dict[str, list[float]] = {v: [] for v in steps}
    cpu: dict[str, list[float]] = {v: [] for v in steps}
    for i in range(rounds):  # interleaved, so load changes hit every variant alike
        for v, step in steps.items():
            if v.startswith("cov") and i >= slow_rounds:
                continue
            _sync(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            step()
            _sync(device)
            times[v].append(time.perf_counter() - start)
            cpu[v].append(time.process_time() - start_cpu)
    results = {}
    for v in steps:
        ms = [1e3 * t for t in times[v]]
        q = statistics.quantiles(ms, n=4) if len(ms) > 1 else (ms[0], ms[0], ms[0])
        results[v] = {
            "median_ms": statistics.median(ms),
            "iqr_ms": (q[0], q[2]),
            "cpu_ms": 1e3 * statistics.median(cpu[v]),
            "first_s": first_call[v],
            "peak_mb": peak_memory(steps[v], device) if memory else float("nan"),
        }
    for v in steps:
        results[v]["ratio"] = results[v]["median_ms"] / results["tanh"]["median_ms"]
        results[v]["cpu_ratio"] = results[v]["cpu_ms"] / max(results["tanh"]["cpu_ms"], 1e-9)
    return results


def benchmark(
    batch: int,
    width: int,
    rounds: int,
    device: torch.device,
    variants=None,
    cov_rounds: int | None = None,
) -> dict[str, dict]:
    """Layer variants (see the module docstring) against ``tanh``."""
    variants = variants or all_variants(device)
    steps = {v: make_step(v, batch, width, device) for v in variants}
    return time_steps(steps, rounds, device, cov_rounds)


def benchmark_net(
    net: str,
    batch: int,
    rounds: int,
    device: torch.device,
    dtypes=DTYPES,
    baseline: str | None = None,
    backends: list[str] | None = None,
    modes: tuple[str, ...] = ("meanvar",),
) -> dict[str, dict]:
    """Training steps of network ``net`` in ``modes`` on every backend against its tanh
    network."""
    variants = ["tanh"]
    for mode in modes:
        for dt in dtypes:
            for be in backends_for(device):
                if not backends or be in backends:
                    variants += _variants(mode, dt, be, baseline)
    steps = {v: make_net_step(v, net, batch, device) for v in variants}
    return time_steps(steps, rounds, device, memory=False)


def load_average() -> str:
    try:
        return "{:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())
    except OSError:
        return "n/a"


def machine_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return (
        f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )


def _table(res: dict[str, dict], paper: bool) -> list[str]:
    head = "| variant | median ms | IQR ms | x tanh | CPU-time x tanh | first call s | peak MB |"
    rule = "|---|---|---|---|---|---|---|"
    if paper:
        head += " paper ms (GPU, 2017) |"
        rule += "---|"
    lines = [head, rule]
    for v, r in res.items():
        row = (
            f"| {v} | {r['median_ms']:.3f} | {r['iqr_ms'][0]:.3f}–{r['iqr_ms'][1]:.3f} | "
            f"{r['ratio']:.2f} | {r['cpu_ratio']:.2f} | {r['first_s']:.2f} | "
            f"{r['peak_mb']:.2f} |"
        )
        if paper:
            row += f" {PAPER[v.split('-')[0]][0]} |"
        lines.append(row)
    return lines


def to_markdown(all_results: list[tuple[str, str, dict]], command: str, args) -> str:
    lines = [
        "# Layer and network speed (paper Table tab:gpn_exp_mem_time)",
        "",
        f"Command: `{command}`",
        "",
        f"Date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='minutes')}. "
        f"Load average before / after: {args.load_before} / {load_average()}. "
        f"Layer: {args.width} units with {args.width} inputs, R = 14, {args.rounds} interleaved "
        f"rounds (cov: {args.cov_rounds}), network steps {args.net_rounds} rounds, after "
        "warm-up calls; median time of forward + backward (networks: loss, backward, Adam "
        "step), [25 %, 75 %] quantiles, ratio to the tanh layer (network) measured in the same "
        "run, the same ratio of median process CPU time, the first call's time (includes "
        "loading or compiling the Numba kernels) and peak live tensor memory of one pass.",
        "",
    ]
    for machine, title, res in all_results:
        lines += [f"## {machine}, {title}", ""]
        lines += _table(res, paper=title.startswith("layer"))
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="*", default=[256, 1024])
    parser.add_argument("--width", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--cov-rounds", type=int, default=3, help="rounds for cov variants")
    parser.add_argument("--nets", nargs="*", default=list(NETS), choices=list(NETS))
    parser.add_argument("--net-batch", type=int, default=256)
    parser.add_argument("--net-rounds", type=int, default=30)
    parser.add_argument(
        "--net-modes",
        nargs="+",
        default=["meanvar"],
        choices=["meanvar", "cov"],
        help="what the networks propagate between layers",
    )
    parser.add_argument(
        "--device", nargs="+", default=None, help="cpu and/or cuda (default: all present)"
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--out", default=None, help="write a markdown table here")
    parser.add_argument(
        "--baseline", default=None, help="also time the package at this git revision (@REV)"
    )
    parser.add_argument(
        "--backends", nargs="+", default=None, help="only these backends (default: all present)"
    )
    args = parser.parse_args(argv)
    args.load_before = load_average()
    devices = args.device or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    all_results = []

    def report(machine: str, title: str, res: dict) -> None:
        all_results.append((machine, title, res))
        print(f"{machine}, {title}  (load {load_average()})", flush=True)
        for v, r in res.items():
            print(
                f"  {v:22s} {r['median_ms']:9.3f} ms  x{r['ratio']:7.2f}"
                f"  cpu x{r['cpu_ratio']:7.2f}"
                f"  first {r['first_s']:6.2f} s  {r['peak_mb']:8.2f} MB",
                flush=True,
            )

    for name in devices:
        device = torch.device(name)
        machine = machine_description(device)
        for batch in args.batch or []:
            variants = all_variants(device, args.modes, args.dtypes, args.baseline, args.backends)
            res = benchmark(batch, args.width, args.rounds, device, variants, args.cov_rounds)
            report(machine, f"layer, batch {batch}", res)
        for net in args.nets:
            res = benchmark_net(
                net,
                args.net_batch,
                args.net_rounds,
                device,
                args.dtypes,
                args.baseline,
                args.backends,
                tuple(args.net_modes),
            )
            sizes = "x".join(map(str, NETS[net][0]))
            report(machine, f"{net} network {sizes} training step, batch {args.net_batch}", res)
    if args.out:
        command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads:
            command = f"OMP_NUM_THREADS={threads} {command}"
        with open(args.out, "w") as fh:
            fh.write(to_markdown(all_results, command, args))


if __name__ == "__main__":
    main()
