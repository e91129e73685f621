"""``--set dp.as_ddp=true`` (what ``ddpdoctor try --as-ddp`` runs): a DataParallel script run as DDP, one process per
device (torchrun starts them), with no code change.

- The process group is created before the script runs (gloo on CPU, nccl on GPUs; torchrun's variables), and on a
  GPU machine each rank's current device is its ``LOCAL_RANK``.
- ``nn.DataParallel(module, ...)`` builds :class:`DataParallelAsDDP` instead: a ``DistributedDataParallel`` of the
  module on the rank's device. Its forward does what DataParallel's scatter and gather do, across processes: each
  rank runs the module on its slice of the global batch (``tensor_split`` along ``dim``, as DataParallel splits it
  over its replicas: per-rank batch = global batch / ranks), and the outputs of all ranks are gathered with
  autograd (``torch.distributed.nn.all_gather``) into the global batch's output, so the script's loss over the whole
  batch works unchanged. Its gradient: every rank computes the same loss, so each rank's slice gets N times its
  gradient through the gather, and DDP's averaging over N ranks gives exactly DataParallel's gradient.
- The script must feed the same global batch on every rank (seeded data, as DataParallel scripts usually are); the
  process group is destroyed at exit.
"""

from __future__ import annotations

import atexit
import importlib
import os
import warnings
from typing import Any

_patches: list[tuple[Any, str, Any]] = []
built = 0  # DataParallel constructions turned into DDP in this process


def install() -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.parallel as parallel

    data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")  # the module, not the function

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
        atexit.register(_teardown)
    cls = _as_ddp_class()
    for owner in (nn, parallel, data_parallel):
        _patches.append((owner, "DataParallel", owner.DataParallel))
        owner.DataParallel = cls


def uninstall() -> None:
    for owner, name, original in reversed(_patches):
        setattr(owner, name, original)
    _patches.clear()


def _teardown() -> None:
    import time

    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.barrier()  # every rank reaches teardown together (gloo can hang otherwise)
            dist.destroy_process_group()
        except Exception:
            pass
        time.sleep(0.05)


def _split(value: Any, rank: int, world: int, dim: int) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.dim() > dim:
        return torch.tensor_split(value, world, dim=dim)[rank]
    if isinstance(value, (list, tuple)):
        return type(value)(_split(v, rank, world, dim) for v in value)
    if isinstance(value, dict):
        return {k: _split(v, rank, world, dim) for k, v in value.items()}
    return value


def _gather(value: Any, dim: int) -> Any:
    import torch
    import torch.distributed.nn as dist_nn

    if isinstance(value, torch.Tensor):
        with warnings.catch_warnings():  # torch 2.13 deprecates it for a functional form without this autograd
            warnings.simplefilter("ignore", FutureWarning)
            parts = dist_nn.all_gather(value.contiguous())
        return torch.cat(parts, dim=dim)
    if isinstance(value, (list, tuple)):
        return type(value)(_gather(v, dim) for v in value)
    if isinstance(value, dict):
        return {k: _gather(v, dim) for k, v in value.items()}
    return value


def _as_ddp_class() -> type:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    class DataParallelAsDDP(DistributedDataParallel):
        """``nn.DataParallel(module, device_ids, output_device, dim)`` as DDP on this rank's device."""

        def __init__(self, module: Any, device_ids: Any = None, output_device: Any = None, dim: int = 0) -> None:
            global built
            if torch.cuda.is_available():
                device = torch.device("cuda", torch.cuda.current_device())
                module = module.to(device)
                super().__init__(module, device_ids=[device.index])
            else:
                super().__init__(module)
                self.device_ids = []  # DataParallel on a CPU has none either
            self.dim = dim
            built += 1

        def forward(self, *inputs: Any, **kwargs: Any) -> Any:
            rank, world = dist.get_rank(), dist.get_world_size()
            inputs, kwargs = _split(inputs, rank, world, self.dim), _split(kwargs, rank, world, self.dim)
            return _gather(super().forward(*inputs, **kwargs), self.dim)

    DataParallelAsDDP.__name__ = DataParallelAsDDP.__qualname__ = "DataParallelAsDDP"
    return DataParallelAsDDP
