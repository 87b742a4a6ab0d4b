"""Execute the notebooks in this folder top to bottom and save their outputs.

    python notebooks/execute.py                 # all notebooks, full mode, outputs saved
    python notebooks/execute.py 03_*.ipynb      # some of them
    python notebooks/execute.py --smoke         # PYRO_GPN_SMOKE=1, nothing saved (what CI runs)

Each notebook reads ``PYRO_GPN_SMOKE`` in its first code cell: ``1`` shrinks sample counts and
training steps so that the whole notebook runs in well under a minute.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def execute(path: Path, smoke: bool, timeout: int = 1800, save: bool = True) -> float:
    """Run one notebook in a fresh kernel (cwd = this folder); return the wall time in seconds."""
    notebook = nbformat.read(path, as_version=4)
    env_before = {name: os.environ.get(name) for name in ("PYRO_GPN_SMOKE", "MPLBACKEND")}
    os.environ["PYRO_GPN_SMOKE"] = "1" if smoke else "0"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # the kernel inherits this process's environment: a non-interactive MPLBACKEND (Agg, as set
    # on CI) would make plt.show() a no-op and the saved notebook would have no figures
    inline = "module://matplotlib_inline.backend_inline"
    os.environ["MPLBACKEND"] = inline if save else os.environ.get("MPLBACKEND", inline)
    try:
        start = time.perf_counter()
        NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(HERE)}},
        ).execute()
        elapsed = time.perf_counter() - start
    finally:
        for name, value in env_before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if save:
        nbformat.write(notebook, path)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebook files (default: all in this folder)")
    parser.add_argument("--smoke", action="store_true", help="PYRO_GPN_SMOKE=1; outputs not saved")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = [Path(p).resolve() for p in args.notebooks] or sorted(HERE.glob("[0-9]*.ipynb"))
    for path in paths:
        elapsed = execute(path, smoke=args.smoke, timeout=args.timeout, save=not args.smoke)
        print(
            f"{path.name}: {elapsed:.1f} s ({'smoke' if args.smoke else 'full, saved'})", flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
