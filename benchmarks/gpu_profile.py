"""Where the time of a GPN layer step goes on a CUDA device: launches, syncs, host overhead.

For each step of :mod:`gpu_speed` named on the command line (``mode/way/dtype`` at a
``width x batch``, or ``train/way/dtype``), after warm-up:

* the wall time of one step with and without a final synchronisation, and its CUDA time
  (the sum of the kernels' times), so host-bound steps show as wall >> CUDA;
* every synchronising call (``torch.cuda.set_sync_debug_mode("warn")``) with the library
  line that caused it;
* the profiler's table of operators (self CPU time), the number of kernel launches and the
  kernels by CUDA time.

    python benchmarks/gpu_profile.py meanvar/fused/float64 mean/fused/float64 train/fused/float64

It runs on the CPU too (no sync debugging, no CUDA times): ``--device cpu``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_speed  # noqa: E402

DTYPES = {"float32": None, "float64": torch.float64}


def make_step(spec: str, width: int, batch: int, device: torch.device):
    parts = spec.split("/")
    if parts[0] == "train":
        dtype = DTYPES[parts[2]] if len(parts) == 3 else None
        return gpu_speed.make_train_step(parts[1], device, {}, dtype)
    if parts[0] == "tanh":
        return gpu_speed.make_tanh_step(batch, width, device)
    mode, way, dname = parts
    return gpu_speed.make_layer_step(way, mode, batch, width, device, {}, DTYPES[dname])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def syncs_of(step, device: torch.device) -> list[str]:
    """The library (or benchmark) lines at which one step synchronised with the device."""
    if device.type != "cuda":
        return []
    found = []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for w in caught:
        if "synchroniz" not in str(w.message):
            continue
        found.append(f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0][:90]}")
    return found


def _stack_of_syncs(step, device) -> list[str]:
    """The Python stack (library frames) of each synchronising call, by raising on the first
    ones: ``set_sync_debug_mode("error")``, one step per sync found, up to ten."""
    if device.type != "cuda":
        return []
    stacks = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    except RuntimeError:
        frames = traceback.extract_tb(sys.exc_info()[2])
        stacks.append(
            " <- ".join(
                f"{Path(f.filename).name}:{f.lineno}"
                for f in reversed(frames)
                if "pyro_gpn" in f.filename or "benchmarks" in f.filename
            )
        )
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return stacks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="+", help="mode/way/dtype or train/way/dtype or tanh")
    parser.add_argument("--width", type=int, default=50)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=25, help="rows of each profiler table")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    for spec in args.steps:
        print(f"\n######## {spec} ({args.width} units, batch {args.batch}, {device})", flush=True)
        step = make_step(spec, args.width, args.batch, device)
        for _ in range(5):
            step()
        sync(device)
        reps = 20
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        host_ms = (time.perf_counter() - t0) / reps * 1e3
        sync(device)
        wall_ms = (time.perf_counter() - t0) / reps * 1e3
        print(
            f"host time per step (no sync) {host_ms:.3f} ms; wall with final sync {wall_ms:.3f} ms"
        )
        lines = syncs_of(step, device)
        print(f"synchronising calls in one step: {len(lines)}")
        for line, n in collections.Counter(lines).most_common():
            print(f"  {n} x {line}")
        for stack in _stack_of_syncs(step, device):
            print(f"  first sync's stack: {stack}")
        with profile(activities=activities) as prof:
            for _ in range(3):
                step()
            sync(device)
        events = prof.key_averages()
        launches = sum(
            e.count
            for e in events
            if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")
        )
        print(f"kernel launches per step: {launches / 3:.0f}")
        print(
            events.table(
                sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=50
            )
        )
        if device.type == "cuda":
            print(
                events.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=50)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
