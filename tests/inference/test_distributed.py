"""Data-parallel training: two CPU processes (gloo) take the same steps as one process with the
same global batch; checkpoints resume; arguments are checked."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from pyro_gpn import GPNNet, GPNSequential
from pyro_gpn.inference.distributed import (
    DistConfig,
    DistContext,
    fit_distributed,
    init_distributed,
)
from pyro_gpn.layers import GPNConv2d, MomentAvgPool2d, MomentFlatten

STEPS = 50


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 16, generator=g)
    y = (x[:, :8].sum(1) > x[:, 8:].sum(1)).long() + (x[:, 0] > 0.8).long()
    return x, y


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "dense":
        return GPNNet([16, 5, 3], mode="meanvar", head="softmax")
    blocks = [GPNConv2d(1, 3, 3, (4, 4), padding=1), MomentAvgPool2d(2), MomentFlatten()]
    return GPNSequential(blocks, (1, 4, 4), num_outputs=3)


def _config(**kwargs):
    return DistConfig(batch_size=16, epochs=13, lr=1e-2, seed=3, max_steps=STEPS, **kwargs)


def _worker(rank: int, world: int, port: int, kind: str, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    ctx = init_distributed("cpu")
    model = _model(kind)
    x, y = _data()
    result = fit_distributed(model, (x, y), (x, y), _config(), ctx)
    torch.save({"state": model.state_dict(), "history": result.history}, f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("kind", ["dense", pytest.param("conv", marks=pytest.mark.slow)])
def test_two_processes_equal_one(tmp_path, kind):
    out = str(tmp_path / "state")
    mp.spawn(_worker, args=(2, _free_port(), kind, out), nprocs=2, join=True)
    model = _model(kind)
    x, y = _data()
    single = fit_distributed(model, (x, y), (x, y), _config(), DistContext())
    assert single.steps == STEPS
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for rank in ranks:
        diffs = [
            float((rank["state"][name] - value).abs().max())
            for name, value in model.state_dict().items()
        ]
        assert max(diffs) <= 1e-5, max(diffs)
        for a, b in zip(rank["history"], single.history, strict=True):
            assert a["step"] == b["step"]
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    # the run moved the parameters (the comparison is not of two untrained models)
    start = _model(kind).state_dict()
    moved = max(
        float((value - start[name]).abs().max()) for name, value in model.state_dict().items()
    )
    assert moved > 1e-2


def test_resume_continues_the_run(tmp_path):
    x, y = _data()
    straight = _model("dense")
    fit_distributed(
        straight, (x, y), None, DistConfig(batch_size=16, epochs=4, lr=1e-2), DistContext()
    )
    resumed = _model("dense")
    first = DistConfig(batch_size=16, epochs=2, lr=1e-2, out_dir=str(tmp_path))
    fit_distributed(resumed, (x, y), None, first, DistContext())
    again = _model("dense")  # a fresh process: a new model, the checkpoint on disk
    second = DistConfig(batch_size=16, epochs=4, lr=1e-2, out_dir=str(tmp_path))
    result = fit_distributed(again, (x, y), None, second, DistContext(), resume=True)
    assert [row["epoch"] for row in result.history] == [1, 2, 3, 4]
    for name, value in straight.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], value, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"batch_size": 0}, "batch_size"), ({"lr": -1.0}, "lr"), ({"max_steps": 0}, "max_steps")],
)
def test_bad_config(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DistConfig(**kwargs)


def test_bad_arguments():
    x, y = _data()
    with pytest.raises(ValueError, match="batch_size"):
        fit_distributed(
            _model("dense"),
            (x, y),
            config=DistConfig(batch_size=3),
            context=DistContext(world_size=2),
        )
    with pytest.raises(ValueError, match="batch_size"):
        fit_distributed(
            _model("dense"), (x, y), config=DistConfig(batch_size=128), context=DistContext()
        )
    with pytest.raises(ValueError, match="device"):
        init_distributed("tpu")
    with pytest.raises(TypeError, match="loss"):
        fit_distributed(torch.nn.Linear(2, 2), (x, y), context=DistContext())
