"""Deprecated: the ``pyro-gpn`` command moved to :mod:`pyro_gpn.experiments.cli`.

``python -m pyro_gpn.cli`` still runs it; this module re-exports the old names for one release.
"""

import sys
import warnings

from .experiments.cli import build_parser, main, split_metrics

if __name__ != "__main__":
    warnings.warn(
        "pyro_gpn.cli is deprecated: use pyro_gpn.experiments.cli (the `pyro-gpn` command is "
        "unchanged)",
        DeprecationWarning,
        stacklevel=2,
    )

__all__ = ["build_parser", "main", "split_metrics"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
