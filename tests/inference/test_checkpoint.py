"""Tests of :mod:`pyro_gpn.inference.checkpoint` on its own: the random generators' states
restored exactly, and the checksum rule of ``load_checkpoint`` (verified when a checksum file
exists, unverified for a checkpoint written before checksums existed)."""

from __future__ import annotations

import dataclasses
import hashlib
import random

import numpy as np
import pytest
import torch

from pyro_gpn.inference.checkpoint import (
    CHECKPOINT_NAME,
    load_checkpoint,
    plain_settings,
    rng_state,
    set_rng_state,
)
from pyro_gpn.inference.train_config import TrainConfig
from pyro_gpn.io import CorruptFileError, checksum_path

CPU = torch.device("cpu")


def _draws(generator: torch.Generator) -> tuple:
    return (
        [np.random.standard_normal() for _ in range(3)],  # noqa: NPY002
        np.random.randint(0, 2**31, size=2).tolist(),  # noqa: NPY002
        random.random(),
        torch.rand(3).tolist(),
        torch.rand(2, generator=generator).tolist(),
    )


@pytest.fixture
def _global_generators():
    """Leave the global generators as the test found them."""
    saved = np.random.get_state(), random.getstate(), torch.get_rng_state()  # noqa: NPY002
    yield
    np.random.set_state(saved[0])  # noqa: NPY002
    random.setstate(saved[1])
    torch.set_rng_state(saved[2])


@pytest.mark.usefixtures("_global_generators")
def test_a_restored_state_continues_every_generator_exactly():
    """After one legacy NumPy normal (which caches the second of its pair) the state is saved;
    the draws after a restore are those that followed the save, NumPy's cached normal included."""
    np.random.seed(3)  # noqa: NPY002
    random.seed(3)
    torch.manual_seed(3)
    shuffle = torch.Generator().manual_seed(5)
    np.random.standard_normal()  # noqa: NPY002
    state = rng_state(shuffle, CPU)
    want = _draws(shuffle)
    _draws(shuffle)  # move every generator on
    set_rng_state(state, shuffle, CPU)
    assert _draws(shuffle) == want


def test_a_checkpoint_is_verified_when_it_has_a_checksum_and_loads_without_one(tmp_path):
    """``checkpoint.pt`` written before checksums existed (no ``.sha256`` beside it) loads
    unverified; with a checksum file its digest must match the bytes (SHA-256 by hashlib)."""
    config = TrainConfig()
    path = tmp_path / CHECKPOINT_NAME
    torch.save({"config": plain_settings(dataclasses.asdict(config)), "step": 7}, path)
    assert not checksum_path(path).exists()
    assert load_checkpoint(tmp_path, config)["step"] == 7
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    checksum_path(path).write_text(f"{digest}  {path.name}\n")
    assert load_checkpoint(tmp_path, config)["step"] == 7
    checksum_path(path).write_text(f"{'0' * 64}  {path.name}\n")
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        load_checkpoint(tmp_path, config)
