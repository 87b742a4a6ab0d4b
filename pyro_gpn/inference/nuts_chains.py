"""How :func:`pyro_gpn.inference.mcmc.run_nuts` runs its chains: one Pyro ``MCMC`` per chain,
one after another or in worker processes, with a progress line per chain as it goes and a
checkpoint file per finished chain, so that an interrupted run resumes where it stopped.

Pyro's own parallel chains need ``num_chains <= cpu_count - 1`` (on a 2-core machine: never),
and its sequential chains write nothing until every chain is done; running each chain as its own
``MCMC`` lifts both limits. The chains are merged back into one ``MCMC`` object
(:func:`merge_chains`), so that ArviZ and the rest of the library see an ordinary multi-chain run.
"""

from __future__ import annotations

import hashlib
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyro
import torch
from pyro.infer import MCMC
from torch import Tensor

from ..io import CorruptFileError, load_torch, save_torch
from .nuts_kernel import RecordingNUTS

__all__ = ["ChainSpec", "chain_key", "merge_chains", "run_chain", "run_chains"]


@dataclass
class ChainSpec:
    """Everything one chain needs, picklable for a worker process.

    ``model`` is the Pyro model callable (e.g. ``NonParametricGPN(...).model``), ``args`` its
    arguments, ``kernel_kwargs`` the keyword arguments of :class:`RecordingNUTS`,
    ``initial_params`` the chain's unconstrained start (``None``: the kernel's init strategy),
    ``inverse_mass`` the metric to start from (``[D, D]`` or ``{site: diagonal}``) or ``None``.
    ``progress_every``: print a line to stderr every that many iterations (``0``: silent).
    """

    model: Callable
    args: tuple
    num_samples: int
    warmup_steps: int
    seed: int
    chain: int
    num_chains: int
    kernel_kwargs: dict = field(default_factory=dict)
    initial_params: dict[str, Tensor] | None = None
    inverse_mass: Tensor | dict[str, Tensor] | None = None
    progress_every: int = 0
    disable_progbar: bool = True


def chain_key(spec: ChainSpec) -> str:
    """A digest of what determines a chain's draws (model settings, data, sampler settings,
    seed, start): a checkpoint is reused only when its key matches."""
    digest = hashlib.sha256()
    owner = getattr(spec.model, "__self__", spec.model)
    digest.update(type(owner).__name__.encode())
    settings = {
        k: v
        for k, v in sorted(vars(owner).items())
        if not k.startswith("_") and isinstance(v, (int, float, str, bool, list, tuple))
    }
    digest.update(repr(settings).encode())
    digest.update(repr(sorted(spec.kernel_kwargs.items())).encode())
    numbers = (spec.num_samples, spec.warmup_steps, spec.seed, spec.chain)
    digest.update(repr(numbers).encode())
    metric = spec.inverse_mass
    metric = [metric[k] for k in sorted(metric)] if isinstance(metric, dict) else [metric]
    tensors = list(spec.args) + list((spec.initial_params or {}).values()) + metric
    for t in tensors:
        if isinstance(t, Tensor):
            digest.update(t.detach().cpu().contiguous().numpy().tobytes())
        else:
            digest.update(repr(t).encode())
    return digest.hexdigest()[:16]


def _progress_hook(spec: ChainSpec, start: float) -> Callable:
    total = spec.warmup_steps + spec.num_samples

    def hook(kernel, params, stage, i):
        done = i + 1 + (spec.warmup_steps if stage == "Sample" else 0)
        if done % spec.progress_every and done != total:
            return
        rec = kernel.records[-1] if kernel.records else {}
        steps = rec.get("n_steps") or [kernel._grad_calls]
        print(
            f"chain {spec.chain + 1}/{spec.num_chains} {stage.lower()} {done}/{total}: "
            f"step size {float(kernel.step_size):.3g}, leapfrog {steps[-1]}, "
            f"divergences {len(kernel._divergences)}, {time.perf_counter() - start:.0f} s",
            file=sys.stderr,
            flush=True,
        )

    return hook


def run_chain(spec: ChainSpec) -> dict:
    """Run one chain; returns ``{"samples": {site: [1, N, ...]}, "diagnostics", "stats",
    "wall_s", "cpu_s"}`` (samples in the constrained space, as ``MCMC.get_samples``)."""
    pyro.set_rng_seed(spec.seed * 7919 + spec.chain)
    inverse_mass = None if spec.inverse_mass is None else [spec.inverse_mass]
    kernel = RecordingNUTS(spec.model, inverse_mass=inverse_mass, **spec.kernel_kwargs)
    start, cpu = time.perf_counter(), time.process_time()
    hook = _progress_hook(spec, start) if spec.progress_every else None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.trace. is deprecated")
        mcmc = MCMC(
            kernel,
            num_samples=spec.num_samples,
            warmup_steps=spec.warmup_steps,
            num_chains=1,
            initial_params=spec.initial_params,
            disable_progbar=spec.disable_progbar,
            hook_fn=hook,
        )
        mcmc.run(*spec.args)
    return {
        "samples": mcmc.get_samples(group_by_chain=True),
        "diagnostics": mcmc._diagnostics[0],
        "stats": kernel.records[-1],
        "wall_s": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu,
    }


def run_chains(
    specs: list[ChainSpec],
    *,
    workers: int = 1,
    checkpoint_dir: str | Path | None = None,
) -> list[dict]:
    """Run the chains, ``workers`` at a time (``1``: in this process, one after another; more:
    in spawned worker processes), and return their :func:`run_chain` results in chain order.

    With ``checkpoint_dir``, every finished chain is saved there atomically as
    ``chain{c}-{key}.pt`` (:func:`chain_key`) with its SHA-256 in ``chain{c}-{key}.pt.sha256``,
    and a chain whose file exists is loaded instead of run again, after checking it against its
    checksum. A file that fails the check, has no checksum or cannot be loaded is reported (a
    ``UserWarning`` naming it and why) and its chain is run again, overwriting it.
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    folder = None if checkpoint_dir is None else Path(checkpoint_dir)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    results: dict[int, dict] = {}
    todo = []
    for spec in specs:
        path = None if folder is None else folder / f"chain{spec.chain}-{chain_key(spec)}.pt"
        saved = None if path is None or not path.exists() else _load_chain(path)
        if saved is not None:
            results[spec.chain] = saved
            if spec.progress_every:
                print(f"chain {spec.chain + 1}: loaded {path}", file=sys.stderr, flush=True)
        else:
            todo.append((spec, path))

    def finish(spec: ChainSpec, path: Path | None, result: dict) -> None:
        results[spec.chain] = result
        if path is not None:  # atomically, with a checksum: a failed save leaves no file
            save_torch(result, path)
        if spec.progress_every:
            print(
                f"chain {spec.chain + 1}/{spec.num_chains} done: {result['wall_s']:.0f} s wall, "
                f"{result['cpu_s']:.0f} s CPU",
                file=sys.stderr,
                flush=True,
            )

    if workers == 1 or len(todo) <= 1:
        for spec, path in todo:
            finish(spec, path, run_chain(spec))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [(spec, path, pool.submit(run_chain, spec)) for spec, path in todo]
            for spec, path, future in futures:
                finish(spec, path, future.result())
    return [results[s.chain] for s in specs]


def _load_chain(path: Path) -> dict | None:
    """The saved chain at ``path`` after checking it against its checksum, or ``None`` (with a
    warning naming the file and why) when it is damaged, unverifiable or not a chain."""
    try:
        result = load_torch(path, weights_only=False)
        if not isinstance(result, dict) or not {"samples", "diagnostics", "stats"} <= result.keys():
            raise CorruptFileError(path, "does not hold a chain's samples and diagnostics")
    except CorruptFileError as e:
        warnings.warn(
            f"the saved chain {path} cannot be used ({e}); running its chain again",
            stacklevel=3,
        )
        return None
    return result


def merge_chains(results: list[dict], template: MCMC) -> MCMC:
    """One ``MCMC`` holding the chains of ``results`` (``template``: an unrun ``MCMC`` with the
    kernel, ``num_samples`` and ``num_chains`` of the run), as if Pyro had run them together:
    ``get_samples``, ``diagnostics`` and ArviZ's ``from_pyro`` work on it."""
    names = results[0]["samples"].keys()
    template._samples = {k: torch.cat([r["samples"][k] for r in results]) for k in names}
    template._diagnostics = [r["diagnostics"] for r in results]
    return template
