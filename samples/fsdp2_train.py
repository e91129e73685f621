"""An FSDP2 (``torch.distributed.fsdp.fully_shard``) job: a stack of MLP blocks, sharded one of two ways.

    ddpdoctor trace --nproc-per-node 2 samples/fsdp2_train.py --wrap root            # one FSDP unit for the model
    ddpdoctor trace --nproc-per-node 2 samples/fsdp2_train.py --wrap blocks --prefetch  # one unit per block
    ddpdoctor diagnose RUN

``--wrap root`` calls ``fully_shard`` on the model alone: every parameter is in one unit, so forward starts with one
all-gather of the whole model and backward ends with one reduce of every gradient, neither of which can overlap
anything. ``--wrap blocks`` shards each block first (the usual FSDP2 recipe), so each block's all-gather and
reduce-scatter can run beside the neighbouring block's compute; ``--prefetch`` also sets explicit forward and
backward prefetching. CPU + gloo here (gloo has no reduce_scatter: FSDP2 all-reduces the gradients and keeps its
shard), GPUs + NCCL unchanged.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--wrap", choices=["root", "blocks"], default="blocks")
    parser.add_argument("--prefetch", action="store_true", help="explicit forward/backward prefetch of the next block")
    parser.add_argument("--no-reshard-after-forward", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Net(args.dim, args.depth)
    reshard = not args.no_reshard_after_forward
    if args.wrap == "blocks":
        for block in model.blocks:
            fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    if args.wrap == "blocks" and args.prefetch:
        blocks = list(model.blocks)
        for i, block in enumerate(blocks):
            if i + 1 < len(blocks):
                block.set_modules_to_forward_prefetch([blocks[i + 1]])
            if i > 0:
                block.set_modules_to_backward_prefetch([blocks[i - 1]])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        batch = torch.randn(args.batch, args.dim)
        loss = model(batch).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
