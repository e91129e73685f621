"""Fingerprints of what a DataLoader hands the ranks, compared across ranks by ``ddpdoctor.metrics.setup``: a batch's
tensors and values (``digest``), and a map-style dataset's content at fixed indices (``content_digests``), read with
the random generators seeded alike on every rank and their states restored afterwards."""

from __future__ import annotations

import hashlib
from typing import Any

_MAX_DIGEST_BYTES = 1 << 20
_CONTENT_SAMPLES = 16  # fixed indices whose integer content fingerprints a dataset (10 classes: 1e-16 to collide)
_CONTENT_SEED = 0  # the random generators' seed while those items are read (content_digests)


def content_digests(dataset: Any, length: int) -> tuple[str | None, str | None]:
    """Two digests of ``dataset`` at ``_CONTENT_SAMPLES`` fixed indices spread over it: of its integers (integer
    tensors and Python ints: labels, token ids; None when it holds none), and of everything in its items (float
    tensors too), read twice with the random generators (torch CPU, ``random``, numpy) seeded alike on every rank,
    so an augmentation draws the same on every rank: None where the two reads differ (randomness those seeds do
    not reach) or where neither can be read. Equal whole digests on two ranks: the same data; different: each rank
    its own (a dataset that shards by rank itself, whose integers may still agree: a local index, a mask of ones).
    The generators' states are restored, so the script's data order and augmentations do not change."""
    import random

    import torch

    indices = sorted({k * (length - 1) // (_CONTENT_SAMPLES - 1) for k in range(_CONTENT_SAMPLES)})
    py_state = random.getstate()
    try:
        import numpy as np

        np_state = np.random.get_state()
    except Exception:  # noqa: BLE001 - numpy is optional for a script
        np, np_state = None, None

    def read() -> list[Any]:
        torch.default_generator.manual_seed(_CONTENT_SEED)  # the CPU's alone: torch.manual_seed reseeds CUDA too
        random.seed(_CONTENT_SEED)
        if np is not None:
            np.random.seed(_CONTENT_SEED)
        return [dataset[i] for i in indices]

    try:
        with torch.random.fork_rng(devices=[]):
            items = read()
            whole = digest(items, python_ints=True)
            if whole is not None and digest(read(), python_ints=True) != whole:
                whole = None
        return digest(items, integers_only=True, python_ints=True), whole
    except Exception:  # noqa: BLE001 - a dataset that cannot be indexed here is undecided, not an error
        return None, None
    finally:
        random.setstate(py_state)
        if np is not None and np_state is not None:
            np.random.set_state(np_state)


def digest(batch: Any, integers_only: bool = False, python_ints: bool = False) -> str | None:
    """sha1 (16 hex digits) of the batch's CPU tensors (at most 1 MiB) and other values; ``integers_only``:
    only its integer tensors, None when it has none."""
    import torch

    h = hashlib.sha1()
    budget = [_MAX_DIGEST_BYTES]
    fed = [0]

    def feed(obj: Any) -> None:
        if budget[0] <= 0:
            return
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "cpu" or (integers_only and (obj.is_floating_point() or obj.is_complex())):
                return
            fed[0] += 1
            data = obj.detach().contiguous().view(-1)[: budget[0] // max(obj.element_size(), 1)]
            raw = data.numpy().tobytes() if data.dtype != torch.bfloat16 else data.float().numpy().tobytes()
            budget[0] -= len(raw)
            h.update(raw)
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                feed(x)
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                feed(obj[k])
        elif python_ints and isinstance(obj, int) and not isinstance(obj, bool):
            fed[0] += 1
            h.update(repr(obj).encode() + b",")
        elif not integers_only:
            h.update(repr(obj).encode()[:1024])

    try:
        feed(batch)
    except Exception:
        return None
    if integers_only and not fed[0]:
        return None
    return h.hexdigest()[:16]
