"""Per-chain running of NUTS: checkpoints that resume, worker processes that give the same
draws as the sequential path, progress lines, and the merged multi-chain ``MCMC``."""

from __future__ import annotations

import errno
import io
import os
import warnings

import pytest
import torch
from pyro.infer import MCMC, NUTS

from pyro_gpn.inference import nuts_chains
from pyro_gpn.inference.mcmc import run_nuts
from pyro_gpn.inference.nuts_chains import ChainSpec, chain_key, run_chains
from pyro_gpn.models.nonparametric import NonParametricGPN

F64 = torch.float64


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-2, 2, 10, dtype=F64)[:, None]
    y = torch.sin(x[:, 0]) + 0.1 * torch.randn(10, generator=g, dtype=F64)
    return x, y, x[:3]


def _run(**kwargs):
    x, y, x_test = _data()
    settings = dict(num_samples=8, warmup_steps=8, num_chains=2, init_steps=10, seed=3)
    return run_nuts(NonParametricGPN([1, 1]), x, y, x_test, **(settings | kwargs))


def test_checkpoints_resume_without_rerunning(tmp_path, monkeypatch):
    first = _run(checkpoint_dir=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 4 and [f.split("-")[0] for f in files] == ["chain0"] * 2 + ["chain1"] * 2
    assert [f.rsplit(".", 1)[-1] for f in files] == ["pt", "sha256"] * 2  # each with its checksum

    def fail(spec):
        raise AssertionError("a checkpointed chain was run again")

    monkeypatch.setattr(nuts_chains, "run_chain", fail)
    again = _run(checkpoint_dir=tmp_path)
    for name, value in first.samples.items():
        torch.testing.assert_close(again.samples[name], value)
    assert again.sample_stats == first.sample_stats
    # other settings: a different key, so the chains must run (and here they fail)
    with pytest.raises(AssertionError, match="run again"):
        _run(checkpoint_dir=tmp_path, seed=4)
    with pytest.raises(AssertionError, match="run again"):  # more draws: not the saved chain
        _run(checkpoint_dir=tmp_path, num_samples=9)


def test_one_lost_chain_is_rerun_alone(tmp_path, monkeypatch):
    first = _run(checkpoint_dir=tmp_path)
    (lost,) = tmp_path.glob("chain1-*.pt")
    lost.unlink()
    calls = []
    real = nuts_chains.run_chain
    monkeypatch.setattr(
        nuts_chains, "run_chain", lambda spec: calls.append(spec.chain) or real(spec)
    )
    again = _run(checkpoint_dir=tmp_path)
    assert calls == [1]
    torch.testing.assert_close(again.samples["W1"], first.samples["W1"])


@pytest.mark.parametrize("damage", ["truncated", "no checksum", "not a chain"])
def test_a_damaged_chain_file_is_reported_and_its_chain_rerun(tmp_path, monkeypatch, damage):
    first = _run(checkpoint_dir=tmp_path)
    (bad,) = tmp_path.glob("chain1-*.pt")
    if damage == "truncated":  # bytes lost after the checksum was written
        bad.write_bytes(bad.read_bytes()[:100])
    elif damage == "no checksum":
        (tmp_path / f"{bad.name}.sha256").unlink()
    else:  # a valid, verified torch file that holds something else
        nuts_chains.save_torch({"samples": {}}, bad)
    calls = []
    real = nuts_chains.run_chain
    monkeypatch.setattr(
        nuts_chains, "run_chain", lambda spec: calls.append(spec.chain) or real(spec)
    )
    with pytest.warns(UserWarning, match=f"saved chain {bad}.*running its chain again"):
        again = _run(checkpoint_dir=tmp_path)
    assert calls == [1]  # chain 0's verified file is used, chain 1 runs again
    torch.testing.assert_close(again.samples["W1"], first.samples["W1"])
    calls.clear()
    _run(checkpoint_dir=tmp_path)  # the rerun wrote a verifiable file: nothing runs now
    assert calls == []


def test_chain_key_depends_on_what_sets_the_draws():
    x, y, _ = _data()
    model = NonParametricGPN([1, 1])
    base = dict(
        model=model.model,
        args=(x, y, None),
        num_samples=5,
        warmup_steps=5,
        seed=0,
        chain=0,
        num_chains=2,
    )
    key = chain_key(ChainSpec(**base))
    assert key == chain_key(ChainSpec(**base))
    assert key == chain_key(ChainSpec(**base, progress_every=3))  # progress: same draws
    assert key != chain_key(ChainSpec(**(base | {"seed": 1})))
    assert key != chain_key(ChainSpec(**(base | {"chain": 1})))
    assert key != chain_key(ChainSpec(**(base | {"args": (x, y + 1e-9, None)})))
    assert key != chain_key(
        ChainSpec(**(base | {"model": NonParametricGPN([1, 1], jitter=1e-5).model}))
    )
    assert key != chain_key(ChainSpec(**base, kernel_kwargs={"max_tree_depth": 5}))
    assert key != chain_key(ChainSpec(**(base | {"num_samples": 6})))
    assert key != chain_key(ChainSpec(**(base | {"warmup_steps": 6})))
    start = {"W1": torch.zeros(1, 1, dtype=F64), "sigma1": torch.zeros(1, dtype=F64)}
    moved = {"W1": torch.zeros(1, 1, dtype=F64), "sigma1": torch.full((1,), 0.5, dtype=F64)}
    with_start = chain_key(ChainSpec(**base, initial_params=start))
    assert with_start != key
    assert with_start != chain_key(ChainSpec(**base, initial_params=moved))
    dense = chain_key(ChainSpec(**base, inverse_mass=torch.eye(2, dtype=F64)))
    assert dense != key
    assert dense != chain_key(ChainSpec(**base, inverse_mass=2 * torch.eye(2, dtype=F64)))
    diagonal = {"W1": torch.ones(1, dtype=F64), "sigma1": torch.ones(1, dtype=F64)}
    by_site = chain_key(ChainSpec(**base, inverse_mass=diagonal))
    assert by_site != key
    scaled = diagonal | {"sigma1": torch.full((1,), 3.0, dtype=F64)}
    assert by_site != chain_key(ChainSpec(**base, inverse_mass=scaled))


def test_workers_give_the_sequential_draws():
    """Chains in two spawned processes: the same draws as one after another (each chain is
    seeded by its own index), and the per-transition statistics come back too."""
    one = _run(workers=1)
    two = _run(workers=2)
    for name, value in one.samples.items():
        torch.testing.assert_close(two.samples[name], value)
    torch.testing.assert_close(two.y_test.mean(0), one.y_test.mean(0))
    assert two.sample_stats is not None and len(two.sample_stats) == 2
    assert two.sample_stats == one.sample_stats


def test_chains_differ_and_merge_into_one_run():
    result = _run()
    w = result.mcmc.get_samples(group_by_chain=True)["W1"]
    assert w.shape == (2, 8, 1, 1) and not torch.equal(w[0], w[1])
    assert result.num_chains == 2 and result.num_samples == 8
    idata = result.to_arviz()
    assert idata.posterior.sizes["chain"] == 2 and idata.sample_stats["energy"].shape == (2, 8)
    assert set(result.mcmc.diagnostics()["divergences"]) == {"chain 0", "chain 1"}


def test_progress_lines(capsys):
    _run(progress_every=4)
    lines = capsys.readouterr().err.splitlines()
    assert "chain 1/2 warmup 4/16: step size" in lines[0]
    assert sum("sample 16/16" in line for line in lines) == 2
    assert sum(" done: " in line for line in lines) == 2


def test_bad_workers_raise():
    with pytest.raises(ValueError, match="workers"):
        run_chains([], workers=0)


def test_every_seed_and_chain_pair_has_its_own_draws():
    """Chain ``c`` of seed ``s`` is seeded by the pair: a rerun repeats it, and neighbouring
    pairs whose sum agrees (seed 0 chain 1, seed 1 chain 0) are different chains, so runs with
    consecutive seeds share no chain."""
    x, y, _ = _data()
    model = NonParametricGPN([1, 1])
    base = dict(model=model.model, args=(x, y, None), num_samples=3, warmup_steps=2, num_chains=2)

    def draws(seed, chain):
        return nuts_chains.run_chain(ChainSpec(**base, seed=seed, chain=chain))["samples"]["W1"]

    torch.testing.assert_close(draws(0, 1), draws(0, 1), rtol=0, atol=0)
    assert not torch.equal(draws(0, 1), draws(1, 0))
    assert not torch.equal(draws(2, 0), draws(1, 1))


def test_the_merged_run_keeps_each_chains_draws_and_divergences():
    """``merge_chains`` stacks the chains in order and keeps every chain's own diagnostics
    (here hand-made divergences), as Pyro's multi-chain ``MCMC`` reports them."""
    model = NonParametricGPN([1, 1])
    w = torch.arange(12, dtype=F64).reshape(2, 1, 6, 1, 1)
    divergent = [[], [2, 5]]
    chains = [
        {
            "samples": {"W1": w[c], "sigma1": torch.full((1, 6, 1), 0.1 * (c + 1), dtype=F64)},
            "diagnostics": {"divergences": divergent[c], "acceptance rate": 0.9},
        }
        for c in range(2)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        template = MCMC(NUTS(model.model), num_samples=6, warmup_steps=0, num_chains=2)
    mcmc = nuts_chains.merge_chains(chains, template)
    torch.testing.assert_close(mcmc.get_samples(group_by_chain=True)["W1"], w[:, 0])
    assert mcmc.diagnostics()["divergences"] == {"chain 0": [], "chain 1": [2, 5]}


def test_a_chain_file_is_written_atomically(tmp_path, monkeypatch):
    """A save that fails half-way (a full disk) leaves no chain file behind, so that the next
    run reruns the chain instead of finding a truncated file that cannot be loaded."""
    x, y, _ = _data()
    spec = ChainSpec(
        model=NonParametricGPN([1, 1]).model,
        args=(x, y, None),
        num_samples=3,
        warmup_steps=2,
        seed=0,
        chain=0,
        num_chains=1,
    )
    real_save = torch.save

    def disk_full(obj, target, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer)
        half = buffer.getvalue()[: len(buffer.getvalue()) // 2]
        if isinstance(target, (str, os.PathLike)):
            with open(target, "wb") as handle:
                handle.write(half)
        else:
            target.write(half)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="space"):
        run_chains([spec], checkpoint_dir=tmp_path)
    monkeypatch.undo()
    assert list(tmp_path.glob("chain0-*")) == []
    (result,) = run_chains([spec], checkpoint_dir=tmp_path)
    (saved,) = tmp_path.glob("chain0-*.pt")
    loaded = torch.load(saved, weights_only=False)
    torch.testing.assert_close(loaded["samples"]["W1"], result["samples"]["W1"])
