"""Seeded train / hold-out partitions of sample indices.

Randomness comes from :func:`numpy.random.default_rng` (PCG64), whose streams numpy keeps stable
across releases, so a seed names the same partition on every machine.
"""

from __future__ import annotations

import numpy as np

__all__ = ["holdout_split"]


def holdout_split(
    num_samples: int,
    fraction: float,
    seed: int,
    strata: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(num_samples)`` into kept and held-out indices, both sorted ascending.

    Exactly ``round(fraction * num_samples)`` random samples are held out. With ``strata``
    ([num_samples] labels) the split is stratified: class ``c`` with ``n_c`` samples gives
    ``floor(fraction * n_c)`` samples, plus one more for the classes with the largest remainders
    until the total is reached, so class proportions are kept in both parts.

    Args:
        num_samples: number of samples to partition.
        fraction: share to hold out, in [0, 1).
        seed: seed of the random permutation.
        strata: optional class label per sample.

    Returns:
        ``(kept, held_out)``: int64 index arrays.
    """
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must lie in [0, 1), got {fraction}")
    if strata is not None and len(strata) != num_samples:
        raise ValueError(f"strata must have {num_samples} entries, got {len(strata)}")
    rng = np.random.default_rng(seed)
    groups = (
        [np.arange(num_samples)]
        if strata is None
        else [np.flatnonzero(strata == label) for label in np.unique(strata)]
    )
    quota = fraction * np.array([len(group) for group in groups], dtype=np.float64)
    counts = np.floor(quota).astype(np.int64)
    shortfall = round(fraction * num_samples) - int(counts.sum())
    counts[np.argsort(counts - quota, kind="stable")[:shortfall]] += 1
    held_out = [rng.permutation(group)[:count] for group, count in zip(groups, counts, strict=True)]
    mask = np.zeros(num_samples, dtype=bool)
    mask[np.concatenate(held_out).astype(np.int64)] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)
