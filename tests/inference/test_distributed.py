"""Data-parallel training: `Trainer` and `fit_svi`, unchanged, on two CPU processes (gloo) take
the same steps as one process with the same global batch; checkpoints written by rank 0 resume
(both loops), with every rank's random state, also when rank 0 alone has the folder; rank 0's
errors with the folder reach every rank at once; the plumbing's reductions are exact."""

import math
import os
import time
from datetime import timedelta

import pyro
import pyro.distributions as pdist
import pytest
import torch
import torch.multiprocessing as mp

from pyro_gpn import GPNNet, GPNSequential
from pyro_gpn.inference import ClosedFormELBO, TrainConfig, Trainer, fit_svi
from pyro_gpn.inference.checkpoint import (
    gather_rng_state,
    own_rng_state,
    rng_state,
    set_rng_state,
)
from pyro_gpn.inference.distributed import (
    DistContext,
    current_context,
    init_distributed,
    on_main_rank,
    reduce_metrics,
    shard,
    shard_weight,
)
from pyro_gpn.inference.svi import batch_seed
from pyro_gpn.io import RunInUseError, RunLock, load_torch
from pyro_gpn.layers import GPNConv2d, MomentAvgPool2d, MomentFlatten
from pyro_gpn.models import VariationalGPN

EPOCHS = 13  # 57 rows in batches of 16: 4 steps per epoch (the last of 9 rows, split 5 / 4)
SVI_STEPS = 50
ROWS = 57


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(ROWS, 16, generator=g)
    y = (x[:, :8].sum(1) > x[:, 8:].sum(1)).long() + (x[:, 0] > 0.8).long()
    return x, y


def _model(kind: str, init_seed: int = 0):
    torch.manual_seed(init_seed)
    if kind == "dense":
        return GPNNet([16, 5, 3], mode="meanvar", head="softmax")
    blocks = [GPNConv2d(1, 3, 3, (4, 4), padding=1), MomentAvgPool2d(2), MomentFlatten()]
    return GPNSequential(blocks, (1, 4, 4), num_outputs=3)


def _config(**kwargs):
    return TrainConfig(batch_size=16, lr=1e-2, seed=3, progress=False, patience=2, **kwargs)


def _train(kind: str, epochs: int = EPOCHS, out_dir=None, resume: bool = False, init_seed: int = 0):
    model = _model(kind, init_seed)
    x, y = _data()
    trainer = Trainer(model, _config(max_epochs=epochs, out_dir=out_dir))
    result = trainer.fit((x, y), (x[:20], y[:20]), resume=resume)
    return model.state_dict(), result.history


def _svi(num_steps: int = SVI_STEPS, seed: int = 3, init_seed: int = 0, **kwargs):
    pyro.clear_param_store()
    torch.manual_seed(init_seed)
    x, y = _data()
    target = (x[:, :1] - x[:, 1:2]).double()
    vgpn = VariationalGPN([16, 4, 1], num_data=ROWS)
    fit = fit_svi(
        vgpn.model,
        vgpn.guide,
        x.double(),
        target,
        loss=ClosedFormELBO(vgpn),
        num_steps=num_steps,
        batch_size=16,
        lr=1e-2,
        seed=seed,
        progress=False,
        **kwargs,
    )
    return {k: v.detach().clone() for k, v in vgpn.state_dict().items()}, fit.losses


def _svi_alone(num_steps: int = SVI_STEPS):
    """The single-process run of the global batches of ``_svi`` on several processes: those
    come from a generator seeded with ``batch_seed(3)``, a single process's from the global
    generator, seeded here alike (the closed-form ELBO draws nothing else)."""
    return _svi(num_steps, seed=batch_seed(3))


SEEN: list[list[float]] = []  # the inputs of every call of _local_model in this process


def _local_model(x, y, num_data=None):
    """A latent per sample: each rank draws as many random numbers as its share of the batch."""
    SEEN.append(x.tolist())
    shift = pyro.param("shift", torch.tensor(0.0, dtype=torch.float64))
    with pyro.plate("data", num_data, subsample=torch.arange(x.shape[0])):
        z = pyro.sample("z", pdist.Normal(torch.zeros_like(x), 1.0))
        pyro.sample("y", pdist.Normal(z + shift, 0.5), obs=y)


def _local_guide(x, y, num_data=None):
    slope = pyro.param("slope", torch.tensor(0.1, dtype=torch.float64))
    with pyro.plate("data", num_data, subsample=torch.arange(x.shape[0])):
        pyro.sample("z", pdist.Normal(slope * x, 0.3))


def _monte_carlo_svi(num_steps: int, seed: int = 3, **kwargs):
    """Trace_ELBO on _local_model: batches of 9 split 5 / 4 between the two ranks."""
    pyro.clear_param_store()
    x = torch.arange(40, dtype=torch.float64)
    fit = fit_svi(
        _local_model,
        _local_guide,
        x,
        torch.sin(x),
        num_steps=num_steps,
        batch_size=9,
        lr=0.05,
        seed=seed,
        progress=False,
        **kwargs,
    )
    params = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
    return params, fit.losses


def _claim_locked_folder(out: str) -> list[tuple[str, float]]:
    """fit_svi and Trainer.fit into a folder another process has locked: each call's error
    type and seconds."""
    outcomes = []
    for run in (
        lambda: _svi(2, out_dir=out + ".locked"),
        lambda: _train("dense", epochs=1, out_dir=out + ".locked"),
    ):
        start = time.perf_counter()
        try:
            run()
            outcomes.append(("no error", time.perf_counter() - start))
        except Exception as error:
            outcomes.append((type(error).__name__, time.perf_counter() - start))
    return outcomes


def _slow_down_checkpoints(seconds: float) -> None:
    import pyro_gpn.inference.svi as svi_module

    write = svi_module.save_svi_checkpoint

    def slow(*args, **kwargs) -> None:
        time.sleep(seconds)
        write(*args, **kwargs)

    svi_module.save_svi_checkpoint = slow


def _worker(rank: int, world: int, job: str, out: str, timeout: float) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    # a file rendezvous (no port to race for) and a timeout: a hang fails instead of waiting
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"file://{out}.rendezvous",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout),
    )
    if job == "svi":
        result = _svi()
    elif job == "svi_resume":
        if rank == 0:  # a slow disk: rank 1 must still find the last checkpoint on return
            _slow_down_checkpoints(0.5)
        _svi(SVI_STEPS // 2, out_dir=out + ".svi", checkpoint_every=10)
        written = load_torch(f"{out}.svi/svi_checkpoint.pt")["step"]
        # from another initialisation: a restart instead of a resumption would not repeat the run
        resumed = _svi(out_dir=out + ".svi", checkpoint_every=10, resume=True, init_seed=99)
        result = (*resumed, written)
    elif job == "svi_monte_carlo":
        straight = _monte_carlo_svi(12)
        seen = list(SEEN)
        private = f"{out}.mc{rank}"  # rank 1's folder stays empty: rank 0's is not shared
        _monte_carlo_svi(5, out_dir=private, checkpoint_every=2)
        torch.manual_seed(100 + rank)  # scrambled: the checkpoint must restore every rank's
        # and another seed (a resumption may change it: the restored generators replace it), so
        # that a restart instead of a resumption would draw other batches
        resumed = _monte_carlo_svi(12, seed=11, out_dir=private, resume=True)
        fresh = _monte_carlo_svi(12, seed=11)  # what a restart would give
        result = straight, resumed, seen, fresh
    elif job == "resume":  # rank 1's folder stays empty: rank 0's is not shared
        _train("dense", epochs=2, out_dir=f"{out}.run{rank}")
        # from another initialisation: a restart instead of a resumption would not repeat the run
        result = _train("dense", epochs=4, out_dir=f"{out}.run{rank}", resume=True, init_seed=99)
    elif job == "locked":
        result = _claim_locked_folder(out)
    elif job == "rank0_only":  # out_dir on rank 0 alone, None on rank 1
        folder = f"{out}.only" if rank == 0 else None
        result = (
            _train("dense", epochs=2, out_dir=None if folder is None else folder + "/trainer"),
            _svi(12, out_dir=None if folder is None else folder + "/svi", checkpoint_every=5),
        )
    else:
        result = _train(job)
    torch.save(result, f"{out}.{rank}")
    torch.distributed.destroy_process_group()
    # Leave without the interpreter's teardown: once in a full CI run (2026-11-24) a rank
    # aborted there ("terminate called without an active exception": a C++ thread pool
    # destroyed while joinable) after its result was saved; the test checks the results,
    # not the teardown of the libraries' thread pools.
    os._exit(0)


def _spawn(job: str, tmp_path, deadline: float = 300.0, timeout: float = 120.0) -> list:
    """Run ``job`` on 2 processes; fail (killing them) after ``deadline`` seconds, and let a
    collective wait ``timeout`` seconds at most."""
    out = str(tmp_path / "state")
    context = mp.start_processes(
        _worker, args=(2, job, out, timeout), nprocs=2, join=False, start_method="spawn"
    )
    end = time.monotonic() + deadline
    while not context.join(timeout=max(end - time.monotonic(), 0.1)):
        if time.monotonic() >= end:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{job!r} on 2 processes did not finish in {deadline:g} s")
    return [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(2)]


def _max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name] - value).abs().max()) for name, value in b.items())


@pytest.mark.parametrize("kind", ["dense", pytest.param("conv", marks=pytest.mark.slow)])
def test_trainer_two_processes_equal_one(tmp_path, kind):
    ranks = _spawn(kind, tmp_path)
    state, history = _train(kind)
    assert history[-1]["step"] == 4 * EPOCHS
    for rank_state, rank_history in ranks:
        assert _max_difference(rank_state, state) <= 1e-5
        assert len(rank_history) == len(history)
        for a, b in zip(rank_history, history, strict=True):
            assert a["step"] == b["step"] and a["lr"] == b["lr"]
            for key in ("train_loss", "val_loss", "val_error"):
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    start = _model(kind).state_dict()  # the run moved the parameters
    assert _max_difference(state, start) > 1e-2


def test_fit_svi_closed_form_two_processes_equal_one(tmp_path):
    ranks = _spawn("svi", tmp_path)
    state, losses = _svi_alone()
    for rank_state, rank_losses in ranks:
        assert _max_difference(rank_state, state) <= 1e-5
        assert rank_losses == pytest.approx(losses, rel=1e-6)
    pyro.clear_param_store()
    torch.manual_seed(0)
    start = VariationalGPN([16, 4, 1], num_data=ROWS).state_dict()
    assert _max_difference(state, start) > 1e-2


def test_distributed_resume_continues_the_run(tmp_path):
    """Rank 0 writes the checkpoint into its folder and resumes from it; rank 1, given a folder
    of its own (another machine, no shared file system), receives it from rank 0."""
    ranks = _spawn("resume", tmp_path)
    state, history = _train("dense", epochs=4)
    for rank_state, rank_history in ranks:
        assert [row["epoch"] for row in rank_history] == [1, 2, 3, 4]
        assert _max_difference(rank_state, state) <= 1e-5
    assert (tmp_path / "state.run0" / "checkpoint.pt").exists()
    assert not (tmp_path / "state.run1").exists()
    # the resumed runs' initialisation, trained from scratch, ends elsewhere
    assert _max_difference(_train("dense", epochs=4, init_seed=99)[0], state) > 1e-3


def test_distributed_fit_svi_resume_continues_the_run(tmp_path):
    """Two processes run half of the closed-form fit_svi into a folder (rank 0 writes the
    checkpoint, slowly; fit_svi returns on every rank once it is written), then two fresh calls
    resume to the end from it: the losses and parameters of one process's uninterrupted run."""
    ranks = _spawn("svi_resume", tmp_path)
    state, losses = _svi_alone()
    for rank_state, rank_losses, written in ranks:
        assert written == SVI_STEPS // 2
        assert len(rank_losses) == SVI_STEPS
        assert _max_difference(rank_state, state) <= 1e-5
        assert rank_losses == pytest.approx(losses, rel=1e-6)
    saved = torch.load(tmp_path / "state.svi" / "svi_checkpoint.pt", weights_only=True)
    assert saved["step"] == SVI_STEPS
    # the resumed calls' initialisation, trained from scratch, ends elsewhere
    assert _max_difference(_svi(seed=batch_seed(3), init_seed=99)[0], state) > 1e-3


def test_distributed_fit_svi_resume_restores_every_rank(tmp_path):
    """A Monte Carlo ELBO with a latent per sample, on batches that split 5 / 4: the ranks'
    random states differ. The global batches still agree (the ranks' shares of each step are
    disjoint), and a resumption from rank 0's checkpoint -- rank 1's own folder stays empty --
    with scrambled generators repeats the uninterrupted 2-process run exactly, on both ranks."""
    ranks = _spawn("svi_monte_carlo", tmp_path)
    (straight_0, resumed_0, seen_0, fresh_0), (straight_1, resumed_1, seen_1, _) = ranks
    assert len(seen_0) == len(seen_1) > 12
    for a, b in zip(seen_0, seen_1, strict=True):
        assert (len(a), len(b)) == (5, 4) and not set(a) & set(b), (a, b)
    # the first global batch: from the derived seed, not the global generator's stream
    first = sorted(int(i) for i in seen_0[0] + seen_1[0])
    derived = torch.randperm(40, generator=torch.Generator().manual_seed(batch_seed(3)))
    same = torch.randperm(40, generator=torch.Generator().manual_seed(3))
    assert first == sorted(derived[:9].tolist()) != sorted(same[:9].tolist())
    for (params, losses), (again, resumed_losses) in (
        (straight_0, resumed_0),
        (straight_1, resumed_1),
    ):
        assert len(resumed_losses) == 12
        assert resumed_losses == pytest.approx(losses, rel=0, abs=1e-12)
        assert _max_difference(again, params) <= 1e-12
    assert straight_0[1] == pytest.approx(straight_1[1], rel=1e-12)  # the global loss
    # a restart with the resumed call's seed would have drawn other batches
    assert max(abs(a - b) for a, b in zip(fresh_0[1], straight_0[1], strict=True)) > 1e-3
    assert (tmp_path / "state.mc0" / "svi_checkpoint.pt").exists()
    assert not (tmp_path / "state.mc1").exists()


def test_rank_0s_folder_error_reaches_every_rank_at_once(tmp_path):
    """Another process holds rank 0's folder: fit_svi and Trainer.fit raise RunInUseError on
    both ranks within seconds (not rank 0 alone, leaving rank 1 at a barrier until the process
    group's timeout, here 20 s)."""
    with RunLock(tmp_path / "state.locked"):
        ranks = _spawn("locked", tmp_path, deadline=60.0, timeout=20.0)
    for outcomes in ranks:
        assert [name for name, _ in outcomes] == ["RunInUseError", "RunInUseError"], outcomes
        assert all(seconds < 10.0 for _, seconds in outcomes), outcomes


def test_out_dir_on_rank_0_alone(tmp_path):
    """Rank 0 alone is given an out_dir (rank 1: None): rank 0's decides on every rank, so
    Trainer.fit and fit_svi neither hang (rank 1 joins the checkpoints' collectives) nor
    differ between the ranks, and rank 0 writes the checkpoints."""
    ranks = _spawn("rank0_only", tmp_path, deadline=90.0, timeout=20.0)
    (trainer_0, svi_0), (trainer_1, svi_1) = ranks
    assert _max_difference(trainer_0[0], trainer_1[0]) == 0.0
    assert svi_0[1] == svi_1[1] and len(svi_0[1]) == 12
    folder = tmp_path / "state.only"
    assert load_torch(folder / "trainer" / "checkpoint.pt")["result"]["epochs"] == 2
    assert (folder / "trainer" / "best_model.pt").exists()
    assert load_torch(folder / "svi" / "svi_checkpoint.pt")["step"] == 12


def test_on_main_rank_alone_calls_the_function():
    def busy() -> None:
        raise RunInUseError("runs/x", 1)

    assert on_main_rank(lambda: 3, DistContext()) == 3
    with pytest.raises(RunInUseError):
        on_main_rank(busy, DistContext())


def test_random_state_of_the_run_device_alone(monkeypatch):
    """rng_state records, and set_rng_state restores, the CUDA generator of the given device
    only (under torchrun each rank's own GPU), never every visible device's."""
    calls = []

    def every_device(*args):
        raise AssertionError("every visible device's state")

    def get_state(device="cuda"):
        calls.append(("get", device))
        return torch.tensor([7], dtype=torch.uint8)

    def set_state(state, device="cuda"):
        calls.append(("set", int(state[0]), device))

    monkeypatch.setattr(torch.cuda, "get_rng_state_all", every_device)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", every_device)
    monkeypatch.setattr(torch.cuda, "get_rng_state", get_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    device = torch.device("cuda", 1)
    state = rng_state(None, device)
    assert calls == [("get", device)]
    set_rng_state(state, None, device)
    assert calls[-1] == ("set", 7, device)
    calls.clear()
    assert "cuda" not in rng_state(None, torch.device("cpu"))
    set_rng_state(state, None, torch.device("cpu"))  # a CPU run leaves CUDA alone
    assert calls == []


def test_every_rank_restores_its_own_random_state(monkeypatch, caplog):
    """gather_rng_state keeps every rank's state; own_rng_state gives each rank its own (rank
    0's when the number of processes changed, a single process's record to every rank)."""
    rank_0 = {"torch": torch.tensor([0], dtype=torch.uint8)}

    def all_gather_object(out, obj):
        out[:] = [rank_0, obj]

    monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)
    ctx = DistContext(rank=1, world_size=2, backend="gloo")
    generator = torch.Generator().manual_seed(5)
    saved = gather_rng_state(generator, ctx)
    mine = rng_state(generator, ctx.device)
    assert saved["ranks"][0] is rank_0
    assert torch.equal(own_rng_state(saved, ctx)["torch"], mine["torch"])
    assert torch.equal(own_rng_state(saved, ctx)["shuffle"], mine["shuffle"])
    assert own_rng_state(saved, DistContext(rank=0, world_size=2, backend="gloo")) is rank_0
    assert own_rng_state(saved, DistContext(rank=2, world_size=3, backend="gloo")) is rank_0
    assert "3" in caplog.text and "rank 0" in caplog.text
    assert own_rng_state(mine, ctx) is mine
    assert gather_rng_state(generator, DistContext()).keys() == mine.keys()


def test_single_process_plumbing_is_the_identity():
    ctx = current_context("cpu")
    assert not ctx.distributed and ctx.is_main and ctx.world_size == 1
    index = torch.arange(5)
    assert torch.equal(shard(index, ctx), index)
    assert reduce_metrics({"rmse": 2.0, "loss": 1.0}, 5, ctx) == {"rmse": 2.0, "loss": 1.0}


def test_shards_partition_a_batch_and_weights_sum_to_one():
    index = torch.randperm(9)
    pieces = [shard(index, DistContext(rank=r, world_size=4, backend="gloo")) for r in range(4)]
    assert sorted(torch.cat(pieces).tolist()) == sorted(index.tolist())
    assert [p.numel() for p in pieces] == [3, 2, 2, 2]
    assert math.isclose(sum(shard_weight(p.numel(), 9) for p in pieces), 1.0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="device"):
        init_distributed("tpu")
    with pytest.raises(ValueError, match="backend"):
        init_distributed("cpu", backend="mpi")


def _nccl_worker(rank: int, out: str) -> None:
    """One NCCL rank: the plumbing's collectives on CUDA tensors (a group of one process: NCCL
    refuses two ranks on one GPU, and the lent machines have one)."""
    from pyro_gpn.inference.distributed import all_reduce_gradients, broadcast_parameters

    torch.distributed.init_process_group(
        "nccl", init_method=f"file://{out}.rendezvous", rank=0, world_size=1
    )
    ctx = DistContext(0, 1, 0, torch.device("cuda", 0), torch.distributed.get_backend())
    weight = torch.tensor([1.0, -2.0], device="cuda", requires_grad=True)
    loss = (weight**2).sum()
    loss.backward()
    total = all_reduce_gradients([weight], 0.25, loss.detach(), ctx)
    broadcast_parameters([weight], ctx)
    metrics = reduce_metrics({"rmse": 2.0, "loss": 1.0}, 5, ctx)
    torch.save((ctx.backend, total.cpu(), weight.grad.cpu(), metrics), out)
    torch.distributed.destroy_process_group()
    os._exit(0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nccl_collectives_on_cuda(tmp_path):
    out = str(tmp_path / "nccl.pt")
    mp.spawn(_nccl_worker, args=(out,), nprocs=1, join=True)
    backend, total, grad, metrics = torch.load(out, weights_only=False)
    assert backend == "nccl"
    assert float(total) == pytest.approx(0.25 * 5.0)
    assert torch.equal(grad, torch.tensor([0.5, -1.0]))
    assert metrics == pytest.approx({"rmse": 2.0, "loss": 1.0})


def test_batch_seed_is_derived_and_deterministic():
    """The global batches' seed under torchrun: a 32-bit value of its own, the same for the
    same seed (every rank), for any seed broadcast_seed may give (None becomes a drawn one)."""
    for seed in (0, 3, 2**31 - 2, 2**40):
        value = batch_seed(seed)
        assert value == batch_seed(seed) != seed and 0 <= value < 2**32
    assert batch_seed(3) != batch_seed(4)


def test_resuming_a_single_process_record_under_torchrun_warns(caplog):
    """A record without per-rank states or the batch generator's state (a single process's
    fit_svi checkpoint, or one of the first version) resumed under torchrun: every rank
    restores it, the batch order restarts from the seed, and both are logged."""
    ctx = DistContext(rank=1, world_size=2, backend="gloo")
    single = rng_state(None, torch.device("cpu"))
    with caplog.at_level("WARNING", logger="pyro_gpn.inference.checkpoint"):
        assert own_rng_state(single, DistContext()) is single
        assert caplog.text == ""  # alone: nothing to say
        assert own_rng_state(single, ctx) is single
        assert "single process" in caplog.text
        caplog.clear()
        batches = torch.Generator().manual_seed(7)
        set_rng_state(single, batches, torch.device("cpu"))
        assert "batch order restarts" in caplog.text
        assert torch.equal(batches.get_state(), torch.Generator().manual_seed(7).get_state())
