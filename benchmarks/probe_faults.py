"""Fault probe: every public entry point against bad inputs, damaged files, kills and races.

Runs the cases of ``tests/probe_cases.py`` (one fresh temporary folder each) and writes a report
with the count per class (clear / handled / unclear / silent / crash, defined in that module),
a table per entry point and every case that is not clear or handled, with its message.

Usage::

    python benchmarks/probe_faults.py                               # all cases
    python benchmarks/probe_faults.py --only 'cli/|trainer/'        # a regex over case ids
    python benchmarks/probe_faults.py --out docs/results/fault_probe.md --json probe.json

Command-line cases start ``python -m pyro_gpn.cli`` in subprocesses from the repository root
(so they exercise this checkout); the disk faults are simulated (``open``, ``os.open`` and
``os.fdopen`` patched to raise ``ENOSPC`` after 200 bytes of a file, or ``EROFS``) because a
full or read-only file system cannot be created without privileges.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import logging
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.probe_cases import KINDS, cases, classify, fix_for  # noqa: E402

NOTES = [
    "",
    "Seeds: `torch.manual_seed(0)` before every case, data from fixed generators (seeds 1-3).",
    "Disk faults are simulated in the process: `open`, `os.open` and `os.fdopen` patched for",
    "paths inside the output folder (`ENOSPC` after 200 bytes of a file, or `EROFS` on every",
    "write). The concurrency cases are timing-dependent. `tests/test_faults.py` runs the same",
    "cases as tests (the command-line ones marked slow); `KNOWN_FAILING` there lists the cases",
    "that are not yet clear or handled.",
]


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


@contextlib.contextmanager
def _muted():
    """Hide the library's progress bars, logs and warnings printed while the cases run."""
    sink = io.StringIO()
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(sink):
            yield
    finally:
        logging.disable(logging.NOTSET)


def run(selected, verbose: bool = True) -> list[dict]:
    rows = []
    for number, case in enumerate(selected, 1):
        with tempfile.TemporaryDirectory(prefix="probe-") as tmp, _muted():
            outcome = classify(case, Path(tmp))
        rows.append(
            {
                "id": case.id,
                "entry": case.entry,
                "fault": case.fault,
                "kind": outcome.kind,
                "message": outcome.message,
                "seconds": round(outcome.seconds, 2),
                "note": case.note,
                "fix": fix_for(case.id),
            }
        )
        if verbose:
            print(
                f"[{number:3d}/{len(selected)}] {outcome.kind:8s} {case.id:45s} "
                f"{outcome.seconds:6.1f}s  {outcome.message[:90]}",
                flush=True,
            )
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report(rows: list[dict], command: str, wall: float) -> str:
    import pyro
    import torch

    counts = Counter(row["kind"] for row in rows)
    entries = sorted({row["entry"] for row in rows}, key=lambda e: (e.startswith("cli"), e))
    lines = [
        "# Fault probe: bad inputs, damaged files, kills and races at every public entry point",
        "",
        "What a user meets when something is wrong: each case is one call with one fault, run by",
        "`benchmarks/probe_faults.py` from the table `tests/probe_cases.py` and classified",
        "automatically:",
        "",
        "* **clear**: an exception raised by pyro_gpn whose message names the argument or the",
        "  file; on the command line a non-zero exit whose message names it;",
        "* **handled**: a correct result (checked against a reference where there is one: the",
        "  float32 computation, the same row in a batch, an uninterrupted run);",
        "* **unclear**: an exception from inside torch / pyro / Python, or a message that names",
        "  neither the argument nor the file (or a clear error that leaves partial files behind);",
        "* **silent**: a wrong or non-finite result, or success on garbage;",
        "* **crash**: a raw traceback from the command line, or a hang.",
        "",
        f"Command: `{command}`  ",
        f"Code: commit `{_git('rev-parse', '--short', 'HEAD')}` "
        f"(branch `{_git('rev-parse', '--abbrev-ref', 'HEAD')}`), torch {torch.__version__}, "
        f"pyro {pyro.__version__}, Python {platform.python_version()}  ",
        f"Machine: {platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, "
        f"CUDA {'available' if torch.cuda.is_available() else 'not available'} "
        f"(shared with other jobs)  ",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{len(rows)} cases in {wall:.0f} s",
        *NOTES,
        "",
        "## Counts",
        "",
        "| " + " | ".join(KINDS) + " | total |",
        "|" + "---:|" * (len(KINDS) + 1),
        "| " + " | ".join(str(counts.get(k, 0)) for k in KINDS) + f" | {len(rows)} |",
        "",
        "## Per entry point",
        "",
        "| entry point | " + " | ".join(KINDS) + " |",
        "|---|" + "---:|" * len(KINDS),
    ]
    for entry in entries:
        mine = Counter(row["kind"] for row in rows if row["entry"] == entry)
        lines.append(
            f"| `{entry}` | " + " | ".join(str(mine.get(k, 0) or "") for k in KINDS) + " |"
        )
    for kind in ("crash", "silent", "unclear"):
        chosen = [row for row in rows if row["kind"] == kind]
        if not chosen:
            continue
        lines += ["", f"## {kind} ({len(chosen)})", "",
                  "| case | fault | what happened | boundary check it needs |",
                  "|---|---|---|---|"]  # fmt: skip
        for row in chosen:
            note = f" *({row['note']})*" if row["note"] else ""
            lines.append(
                f"| `{row['id']}` | {row['fault']} | {_cell(row['message'])}{note} | "
                f"{_cell(row.get('fix', ''))} |"
            )
    lines += [
        "",
        "## clear and handled",
        "",
        ", ".join(
            f"`{row['id']}` ({row['kind']})" for row in rows if row["kind"] in ("clear", "handled")
        ),  # fmt: skip
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="regex over case ids (default: all)")
    parser.add_argument("--out", default=None, help="markdown report (default: print only)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON")
    parser.add_argument("--quiet", action="store_true", help="no line per case")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    import torch

    torch.set_num_threads(1)
    selected = [c for c in cases() if args.only is None or re.search(args.only, c.id)]
    start = time.perf_counter()
    rows = run(selected, verbose=not args.quiet)
    wall = time.perf_counter() - start
    command = "python benchmarks/probe_faults.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    text = report(rows, command, wall)
    counts = Counter(row["kind"] for row in rows)
    print(" / ".join(f"{counts.get(k, 0)} {k}" for k in KINDS))
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
