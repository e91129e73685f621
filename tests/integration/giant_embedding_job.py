"""A DDP job for the giant-gradient tests (tests/integration/test_giant_gradient.py).

GIANT=1: a 20 MB embedding table (94% of the gradient bytes, used first in forward so its gradient is ready last)
and a small dense rest. GIANT=0: the same bytes spread over five equal 4 MB layers (a normal model whose gradients
fit in one 25 MB bucket). Every tensor stays under 32 MiB (larger ones are mmapped by glibc every step here, which
makes step times jumpy). STEPS steps of plain SGD (it takes sparse gradients: `--set embedding.sparse=true`).
CAP_MB: DDP's bucket_cap_mb (default DDP's 25; 5 makes the embedding a bucket of its own, larger than the cap).
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("STEPS", "8"))
GIANT = os.environ.get("GIANT", "1") == "1"


class Giant(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(80_000, 64)  # 20.48 MB
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))

    def forward(self, ids):
        return self.mlp(self.emb(ids).mean(dim=1))


class Spread(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(*[m for _ in range(5) for m in (nn.Linear(1024, 1024, bias=False), nn.ReLU())])
        self.head = nn.Linear(1024, 8)

    def forward(self, x):
        return self.head(self.net(x))


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    cap = float(os.environ["CAP_MB"]) if os.environ.get("CAP_MB") else None
    model = DDP(Giant() if GIANT else Spread(), **({"bucket_cap_mb": cap} if cap else {}))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(STEPS):
        if GIANT:
            x = torch.randint(0, 80_000, (32, 16), generator=gen)
        else:
            x = torch.randn(32, 1024, generator=gen)
        y = torch.randn(32, 8, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
