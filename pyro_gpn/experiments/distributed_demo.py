"""Data-parallel training demo: the unchanged :class:`~pyro_gpn.inference.Trainer` on ``K``
processes (``torchrun --standalone --nproc_per_node=K -m pyro_gpn.experiments.distributed_demo``);
see :mod:`pyro_gpn.inference.distributed`."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from ..inference import TrainConfig, Trainer
from ..inference.distributed import current_context
from ..network import GPNNet


def main(argv: list[str] | None = None) -> None:
    """``torchrun --standalone --nproc_per_node=K -m pyro_gpn.experiments.distributed_demo``:
    the :class:`~pyro_gpn.inference.Trainer` on a 64-H-10 GPN and scikit-learn's 8x8 digits,
    printing the time per epoch on rank 0."""
    parser = argparse.ArgumentParser(description="data-parallel GPN training demo")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # an optional dependency (the benchmarks extra)
        raise SystemExit(
            "the demo trains on scikit-learn's 8x8 digits: pip install 'pyro-gpn[benchmarks]'"
        ) from None
    features, labels = load_digits(return_X_y=True)
    x = torch.as_tensor(features, dtype=torch.float32) / 16
    y = torch.as_tensor(labels, dtype=torch.long)
    torch.manual_seed(0)
    model = GPNNet([64, args.hidden, 10], mode="meanvar", head="softmax")
    config = TrainConfig(
        batch_size=args.batch_size,
        max_epochs=args.epochs,
        out_dir=args.out_dir,
        device=args.device,
        progress=False,
    )
    trainer = Trainer(model, config)
    cpu = time.process_time()
    result = trainer.fit((x, y), (x, y), resume=args.resume)
    cpu = time.process_time() - cpu
    ctx = current_context(args.device)
    if ctx.is_main:
        times = [row["epoch_time"] for row in result.history]
        print(
            f"world_size={ctx.world_size} steps={result.history[-1]['step']} "
            f"epoch_times={[round(t, 3) for t in times]} "
            f"rank0_cpu_s={cpu:.2f} final_train_loss={result.history[-1]['train_loss']:.4f} "
            f"load={os.getloadavg()[0]:.1f}",
            flush=True,
        )
    if ctx.distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
