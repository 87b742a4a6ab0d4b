"""Session-wide test setup.

Triton fixes interpreter vs compiled mode when it is first imported, and PyTorch may import it
early (e.g. through ``torch._dynamo``). Without a GPU the fused-kernel tests run in Triton's
interpreter, so switch it on before anything imports Triton.
"""

import os

import pyro
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def fresh_param_store():
    """An empty Pyro parameter store before and after the test. ``PyroModule`` parameters live in
    Pyro's global store under their bare names, so a network built by an earlier test would hand
    a later one of the same names its values and shapes; a module that builds networks uses it
    for every test with ``pytestmark = pytest.mark.usefixtures("fresh_param_store")``."""
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()
