"""The NUTS kernel's dense mass-matrix adaptation: the shrunk window estimate against its
formula written out, full rank with fewer draws than dimensions, and wired into the kernel."""

from __future__ import annotations

import pytest
import torch

from pyro_gpn.inference.nuts_kernel import RecordingNUTS, ShrunkBlockMassMatrix
from pyro_gpn.models.sampled_targets import SampledTargetsGPN

F64 = torch.float64


def _adapted(draws: torch.Tensor, diagonal: bool = False) -> torch.Tensor:
    adapter = ShrunkBlockMassMatrix()
    dim = draws.shape[-1]
    adapter.configure({("a",): (dim,) if diagonal else (dim, dim)}, options={"dtype": F64})
    for row in draws:
        adapter.update({"a": row}, None)
    adapter.end_adaptation()
    return adapter.inverse_mass_matrix[("a",)]


@pytest.mark.parametrize("n", [5, 25, 400])
def test_dense_window_estimate_matches_the_formula(n):
    dim = 30
    g = torch.Generator().manual_seed(n)
    scales = torch.logspace(-3, 0, dim, dtype=F64)  # posterior scales 0.001 .. 1
    draws = torch.randn(n, dim, generator=g, dtype=F64) * scales
    got = _adapted(draws)
    sample = torch.cov(draws.T)  # written out independently of Pyro's Welford
    weight = n / (n + dim)
    want = weight * sample + (1 - weight) * torch.diag(sample.diagonal())
    want = want * n / (n + 5) + 1e-3 * 5 / (n + 5) * torch.eye(dim, dtype=F64)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-14)
    # full rank with fewer draws than dimensions: weight * S is positive semi-definite, so every
    # eigenvalue is at least the shrinkage's share of the smallest sample variance
    bound = (1 - weight) * n / (n + 5) * sample.diagonal().min()
    assert torch.linalg.eigvalsh(got).min() > 0.999 * bound
    if n < dim:  # the plain sample covariance is singular there
        assert torch.linalg.matrix_rank(sample) == n - 1


def test_diagonal_blocks_are_pyros():
    g = torch.Generator().manual_seed(0)
    draws = torch.randn(20, 4, generator=g, dtype=F64) * 3
    want = draws.var(0) * 20 / 25 + 1e-3 * 5 / 25
    torch.testing.assert_close(_adapted(draws, diagonal=True), want)


def test_kernel_uses_the_shrunk_adapter_only_when_asked():
    model = SampledTargetsGPN([1, 2, 1], num_inducing=4).model
    assert isinstance(
        RecordingNUTS(model, shrink_dense=True).mass_matrix_adapter, ShrunkBlockMassMatrix
    )
    assert not isinstance(RecordingNUTS(model).mass_matrix_adapter, ShrunkBlockMassMatrix)


def test_per_site_starting_diagonals_land_on_their_coordinates():
    """``inverse_mass={site: diagonal}`` is spread over Pyro's blocks (a dense block of the
    per-unit sites, a diagonal one of the rest) in each block's own site order."""
    from pyro_gpn.models.nonparametric import NonParametricGPN

    model = NonParametricGPN([1, 2, 1])
    x = torch.linspace(-1, 1, 6, dtype=F64)[:, None]
    y = torch.sin(3 * x[:, 0])
    block = tuple(sorted(model.parameter_sites()))
    probe = RecordingNUTS(model.model, full_mass=[block])
    probe.setup(0, x, y, None)
    shapes = {k: v.shape for k, v in probe.initial_params.items()}
    start, given = 1.0, {}
    for name in sorted(shapes):  # distinct values per coordinate
        size = int(torch.Size(shapes[name]).numel())
        given[name] = torch.arange(start, start + size, dtype=F64)
        start += size
    kernel = RecordingNUTS(model.model, full_mass=[block], inverse_mass=[given])
    kernel.setup(0, x, y, None)
    blocks = kernel.mass_matrix_adapter.inverse_mass_matrix
    assert len(blocks) == 2
    for names, matrix in blocks.items():
        want = torch.cat([given[n] for n in names])
        got = matrix.diagonal() if matrix.dim() == 2 else matrix
        torch.testing.assert_close(got, want)
        if matrix.dim() == 2:
            assert names == block
            torch.testing.assert_close(matrix, torch.diag(want))


def test_per_site_starting_diagonals_keep_each_blocks_structure():
    """The per-unit sites' block stays a dense ``[D, D]`` matrix (the given diagonal, zeros
    elsewhere) and the per-row sites' block a vector: the structure ``full_mass`` asked for."""
    from pyro_gpn.models.nonparametric import NonParametricGPN

    model = NonParametricGPN([1, 2, 1])
    x = torch.linspace(-1, 1, 6, dtype=F64)[:, None]
    y = torch.sin(3 * x[:, 0])
    block = tuple(sorted(model.parameter_sites()))
    sizes = {"W1": 2, "W2": 2, "sigma1": 2, "sigma2": 1, "Za2_train": 6}
    given = {k: torch.full((n,), 0.5 + i, dtype=F64) for i, (k, n) in enumerate(sizes.items())}
    kernel = RecordingNUTS(model.model, full_mass=[block], inverse_mass=[given])
    kernel.setup(0, x, y, None)
    blocks = kernel.mass_matrix_adapter.inverse_mass_matrix
    assert set(blocks) == {block, ("Za2_train",)}
    dense = torch.diag(torch.cat([given[k] for k in block]))
    torch.testing.assert_close(blocks[block], dense, rtol=0, atol=0)
    torch.testing.assert_close(blocks[("Za2_train",)], given["Za2_train"], rtol=0, atol=0)
