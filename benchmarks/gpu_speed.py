"""GPU speed and memory of the GPN moment kernels: reference, torch.compile and fused Triton.

On one CUDA device, forward + backward of one layer for

* ``tanh``     -- ``Linear(W, W)`` + tanh, the fixed-activation baseline;
* ``mean``     -- GPN layer propagating means only (deterministic inputs);
* ``meanvar``  -- GPN layer propagating means and variances (``eq:gpn_normal_Sigmatilde``);
* ``cov``      -- GPN layer propagating full covariances (``eq:gpn_normal_Sigmatilde_cov``),

each GPN variant evaluated three ways:

* ``reference`` -- eager PyTorch, ``backend("reference")``;
* ``compile``   -- ``torch.compile`` of the same reference step;
* ``fused``     -- the Triton kernels of :mod:`pyro_gpn.moments.fused`, through
  ``backend("fused")``. If ``GPNLayer.propagate`` does not dispatch to them (checked by counting
  kernel calls), the layer's activations are handed to the fused functions directly and the
  table says so.

Layers of 50 units at batch 1024 and 512 units at batch 4096 (inputs = units), then one full
training step (loss, backward, Adam) of the paper's 16x30x15x26 network
(``GPNNet([16, 30, 15, 26], mode="meanvar", head="softmax")``) at batch 1024, with a tanh MLP
of the same shape as the baseline.

Time: median of CUDA-event timings over repetitions after warm-up (each repetition one forward
+ backward, gradients set to ``None`` between). Memory: ``torch.cuda.max_memory_allocated``
during one repetition, minus what was allocated before it (inputs and parameters excluded).
A configuration that runs out of memory or fails is reported as such, not skipped silently.

Usage (needs a CUDA device; refuses otherwise)::

    python benchmarks/gpu_speed.py --out docs/results/gpu_speed.md
    python benchmarks/gpu_speed.py --quick          # small sizes, a smoke test of the script
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

LAYER_CONFIGS = ((50, 1024), (512, 4096))  # (units = inputs, batch)
QUICK_LAYER_CONFIGS = ((16, 64),)
MODES = ("mean", "meanvar", "cov")
WAYS = ("reference", "compile", "fused")
NET_SIZES = (16, 30, 15, 26)
NET_BATCH = 1024


@dataclass
class Result:
    label: str
    median_ms: float | None = None
    peak_mb: float | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def time_step(
    step: Callable[[], None], warmup: int, reps: int, budget_s: float
) -> tuple[float, float]:
    """Median ms (CUDA events) and peak MB of ``step``; fewer reps if one takes long."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    torch.cuda.synchronize()
    first = start.elapsed_time(end)
    reps = max(3, min(reps, int(1e3 * budget_s / max(first, 1e-3))))
    times = []
    for _ in range(reps):
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return statistics.median(times), peak


def measure(label: str, make: Callable[[], Callable[[], None]], args) -> Result:
    """Build and time one step; out-of-memory and other failures become a note."""
    try:
        step = make()
        ms, mb = time_step(step, args.warmup, args.reps, args.budget)
        return Result(label, ms, mb)
    except torch.cuda.OutOfMemoryError:
        return Result(label, note="out of memory")
    except Exception as err:  # noqa: BLE001 - reported in the table
        return Result(label, note=f"failed: {type(err).__name__}: {str(err).splitlines()[0][:80]}")
    finally:
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# fused-kernel dispatch check
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def count_fused_calls() -> Iterator[list[int]]:
    """Count forward calls of the fused autograd functions, however they were imported."""
    from pyro_gpn.moments import fused

    calls = [0]
    classes = (fused._ResponseMean, fused._ResponseMeanVar)
    originals = [cls.forward for cls in classes]

    def wrap(original):
        def forward(*a, **k):
            calls[0] += 1
            return original(*a, **k)

        return staticmethod(forward)

    for cls, original in zip(classes, originals, strict=True):
        cls.forward = wrap(original)
    try:
        yield calls
    finally:
        for cls, original in zip(classes, originals, strict=True):
            cls.forward = staticmethod(original)


def fused_direct(layer, inputs, mode: str):
    """The layer's output moments from the fused functions, bypassing ``response_moments``
    (``"mean"`` and ``"meanvar"``; in ``"cov"`` mode the kernels give the mean and variance
    inside ``response_moments``, and Mehler's series the off-diagonal: no direct path)."""
    from pyro_gpn import Moments
    from pyro_gpn.moments.fused import fused_response_mean, fused_response_meanvar

    beta, reduction = layer.response_weights()
    args = (layer.inducing_points, layer.lengthscales, beta)
    noise = layer.noise_std.square()
    if mode == "mean":
        mean = fused_response_mean(inputs.mean @ layer.weight, None, *args)
        return Moments(mean, validate=False)
    if mode == "meanvar":
        act = inputs.diagonal().linear(layer.weight)
        mean, var = fused_response_meanvar(act.mean, act.var, *args, reduction, noise)
        return Moments(mean, var=var, validate=False)
    raise RuntimeError(f"mode {mode!r} did not dispatch to the fused kernels")


# ---------------------------------------------------------------------------------------------
# steps
# ---------------------------------------------------------------------------------------------
def layer_inputs(mode: str, batch: int, width: int, device: torch.device):
    from pyro_gpn import Moments

    gen = torch.Generator().manual_seed(0)
    mean = torch.rand(batch, width, generator=gen).to(device)
    if mode == "mean":
        return Moments(mean, validate=False)
    var = (0.1 * torch.rand(batch, width, generator=gen)).to(device)
    return Moments(mean, var=var, validate=False)  # "cov": linear_full gives full covariances


def _total(out) -> torch.Tensor:
    total = out.mean.sum()
    if out.var is not None:
        total = total + out.var.sum()
    if out.cov is not None:
        total = total + out.cov.sum()
    return total


def make_layer_step(
    way: str, mode: str, batch: int, width: int, device, state: dict, dtype: torch.dtype | None
):
    from pyro_gpn import GPNLayer
    from pyro_gpn.moments.backend import backend

    torch.manual_seed(0)
    layer = GPNLayer(width, width, compute_dtype=dtype).to(device)
    inputs = layer_inputs(mode, batch, width, device)
    params = list(layer.parameters())

    def forward():
        return _total(layer.propagate(inputs, mode))

    if way == "fused":
        with backend("fused"), count_fused_calls() as calls:
            forward().backward()
        dispatched = calls[0] > 0
        state["dispatched"] = dispatched

        def fused_forward():
            if dispatched:
                with backend("fused"):
                    return forward()
            return _total(fused_direct(layer, inputs, mode))

        run = fused_forward
    elif way == "compile":
        compiled = torch.compile(forward)

        def run():
            with backend("reference"):
                return compiled()
    else:

        def run():
            with backend("reference"):
                return forward()

    def step() -> None:
        for p in params:
            p.grad = None
        run().backward()

    return step


def make_tanh_step(batch: int, width: int, device):
    torch.manual_seed(0)
    layer = torch.nn.Linear(width, width).to(device)
    x = torch.rand(batch, width, device=device)

    def step() -> None:
        layer.zero_grad(set_to_none=True)
        torch.tanh(layer(x)).sum().backward()

    return step


def make_train_step(way: str, device, state: dict, dtype: torch.dtype | None = None):
    from pyro_gpn import GPNNet
    from pyro_gpn.moments.backend import backend

    torch.manual_seed(0)
    x = torch.rand(NET_BATCH, NET_SIZES[0], device=device)
    y = torch.randint(NET_SIZES[-1], (NET_BATCH,), device=device)
    if way == "tanh":
        dims = NET_SIZES
        mods: list[torch.nn.Module] = []
        for i in range(len(dims) - 1):
            mods.append(torch.nn.Linear(dims[i], dims[i + 1]))
            if i < len(dims) - 2:
                mods.append(torch.nn.Tanh())
        net = torch.nn.Sequential(*mods).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()

        return step
    net = GPNNet(list(NET_SIZES), mode="meanvar", head="softmax", compute_dtype=dtype).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = torch.compile(net.loss) if way == "compile" else net.loss
    name = "fused" if way == "fused" else "reference"
    if way == "fused":
        with backend("fused"), count_fused_calls() as calls:
            loss_fn(x, y).backward()
        state["dispatched"] = calls[0] > 0

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with backend(name):
            loss_fn(x, y).backward()
        opt.step()

    return step


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def _fmt(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def table(rows: list[Result], baseline: str) -> list[str]:
    """Rows with their ratio to the same mode and dtype's ``baseline`` way and to ``tanh``."""
    ref = {r.label: r.median_ms for r in rows}
    tanh = next((r.median_ms for r in rows if r.label.split("/")[-1] == "tanh"), None)
    lines = [
        "| variant | median ms | peak MB | x reference | x tanh | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        parts = r.label.split("/")
        base = None
        if len(parts) == 3:
            base = ref.get(f"{parts[0]}/{baseline}/{parts[2]}")
        ratio = None if r.median_ms is None or not base else r.median_ms / base
        vs_tanh = None if r.median_ms is None or not tanh else r.median_ms / tanh
        lines.append(
            f"| {r.label} | {_fmt(r.median_ms, 3)} | {_fmt(r.peak_mb, 1)} | "
            f"{_fmt(ratio, 2)} | {_fmt(vs_tanh, 1)} | {r.note} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warmup", type=int, default=5, help="warm-up calls per step")
    parser.add_argument("--reps", type=int, default=50, help="timed repetitions (at most)")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of timing per step")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (script smoke test)")
    parser.add_argument("--skip-compile", action="store_true", help="leave out torch.compile")
    parser.add_argument(
        "--compute-dtypes",
        default="float32,float64",
        help="comma-separated compute dtypes of the GPN algebra: float32 (the activations' own "
        "dtype) and float64 (the layers' default)",
    )
    parser.add_argument("--out", default=None, help="write the markdown report here")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print(
            "gpu_speed.py needs a CUDA device and none is present; nothing was measured.",
            file=sys.stderr,
        )
        return 2
    from pyro_gpn.moments.backend import triton_available

    if not triton_available():
        print(
            "gpu_speed.py needs triton for the fused kernels (pip install triton).", file=sys.stderr
        )
        return 2

    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    ways = [w for w in WAYS if not (w == "compile" and args.skip_compile)]
    configs = QUICK_LAYER_CONFIGS if args.quick else LAYER_CONFIGS
    dtypes = {"float32": None, "float64": torch.float64}
    names = [n.strip() for n in args.compute_dtypes.split(",") if n.strip()]
    if not names or any(n not in dtypes for n in names):
        parser.error(f"--compute-dtypes takes float32 and/or float64, got {args.compute_dtypes!r}")
    sections: list[tuple[str, list[Result]]] = []

    for width, batch in configs:
        rows = [measure("tanh", lambda b=batch, w=width: make_tanh_step(b, w, device), args)]
        for mode in MODES:
            for dname in names:
                for way in ways:
                    state: dict = {}
                    res = measure(
                        f"{mode}/{way}/{dname}",
                        lambda way=way, mode=mode, b=batch, w=width, s=state, d=dtypes[dname]: (
                            make_layer_step(way, mode, b, w, device, s, d)
                        ),
                        args,
                    )
                    if way == "fused" and state.get("dispatched") is False:
                        res.note = (res.note + " fused functions called directly").strip()
                    rows.append(res)
                    print(f"{width} units, batch {batch}: {res}", flush=True)
        sections.append((f"One layer: {width} units, {width} inputs, batch {batch}", rows))

    rows = [measure("train/tanh", lambda: make_train_step("tanh", device, {}), args)]
    for dname in names:
        for way in ways:
            state = {}
            res = measure(
                f"train/{way}/{dname}",
                lambda way=way, s=state, d=dtypes[dname]: make_train_step(way, device, s, d),
                args,
            )
            if way == "fused" and state.get("dispatched") is False:
                res.note = "backend('fused') did not reach the fused kernels"
            rows.append(res)
            print(f"train step: {res}", flush=True)
    net = "x".join(str(s) for s in NET_SIZES)
    sections.append(
        (f"Training step: GPNNet {net}, meanvar, softmax head, batch {NET_BATCH}", rows)
    )

    import triton

    command = "python " + " ".join(["benchmarks/gpu_speed.py", *(argv or sys.argv[1:])])
    lines = [
        "# GPU speed: reference vs torch.compile vs fused Triton kernels",
        "",
        f"Command: `{command}`",
        "",
        f"GPU: {torch.cuda.get_device_name(device)}; torch {torch.__version__}, "
        f"triton {triton.__version__}, CUDA {torch.version.cuda}; "
        f"{datetime.date.today().isoformat()}.",
        "",
        "Forward + backward per step (training: loss, backward and Adam). Median of CUDA-event "
        f"timings over up to {args.reps} repetitions after {args.warmup} warm-up calls; peak MB "
        "is `torch.cuda.max_memory_allocated` during one step minus the memory held before it. "
        "`x reference` is the ratio to the eager reference of the same mode and compute dtype; "
        "`x tanh` the ratio to the `Linear + tanh` step (float32) of the same section.",
        "",
    ]
    for title, rows in sections:
        lines += [f"## {title}", "", *table(rows, "reference"), ""]
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
