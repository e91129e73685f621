"""Fingerprints of what a DataLoader hands the ranks, compared across ranks by ``ddpdoctor.metrics.setup``: a batch's
tensors and values (``digest``), and a map-style dataset's content at fixed indices (``content_digests``), read with
the random generators seeded alike on every rank and their states restored afterwards."""

from __future__ import annotations

import hashlib
import time
from typing import Any

_MAX_DIGEST_BYTES = 1 << 20
_CONTENT_SAMPLES = 16  # fixed indices whose integer content fingerprints a dataset (10 classes: 1e-16 to collide)
_CONTENT_SEED = 0  # the random generators' seed while those items are read (content_digests)
_CONTENT_BUDGET_S = 10.0  # at most this long a read of them: a dataset slower than that is undecided


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

    def read(*hashers: _Hasher) -> None:
        """The items at ``indices``, one at a time (an item may be a 500 MB volume: holding the 16 of a read, and
        those of the other read, raised a job's peak memory by 2.8 GB with 100 MB items), into ``hashers``."""
        torch.default_generator.manual_seed(_CONTENT_SEED)  # the CPU's alone: torch.manual_seed reseeds CUDA too
        random.seed(_CONTENT_SEED)
        if np is not None:
            np.random.seed(_CONTENT_SEED)
        started = time.monotonic()
        for i in indices:
            item = dataset[i]
            for hasher in hashers:
                hasher.feed(item)
            del item
            if time.monotonic() - started > _CONTENT_BUDGET_S:
                raise TimeoutError("the dataset's items are too slow to read twice here")

    try:
        with torch.random.fork_rng(devices=[]):
            integers, first = _Hasher(integers_only=True, python_ints=True), _Hasher(python_ints=True)
            read(integers, first)
            whole = first.result()
            if whole is not None:
                second = _Hasher(python_ints=True)
                read(second)
                if second.result() != whole:
                    whole = None
        return integers.result(), whole
    except Exception:  # noqa: BLE001 - a dataset that cannot be indexed here (or in time) is undecided, not an error
        return None, None
    finally:
        random.setstate(py_state)
        if np is not None and np_state is not None:
            np.random.set_state(np_state)


def digest(batch: Any, integers_only: bool = False, python_ints: bool = False) -> str | None:
    """sha1 (16 hex digits) of the batch's CPU tensors (at most 1 MiB) and other values; ``integers_only``:
    only its integer tensors, None when it has none."""
    hasher = _Hasher(integers_only=integers_only, python_ints=python_ints)
    hasher.feed(batch)
    return hasher.result()


class _Hasher:
    """``digest``'s sha1, fed a value at a time: feeding a list's items one by one gives the list's digest."""

    def __init__(self, integers_only: bool = False, python_ints: bool = False) -> None:
        self.integers_only, self.python_ints = integers_only, python_ints
        self._h = hashlib.sha1()
        self._budget = _MAX_DIGEST_BYTES
        self._fed = 0
        self._failed = False

    def feed(self, obj: Any) -> None:
        if self._failed:
            return
        try:
            self._feed(obj)
        except Exception:
            self._failed = True

    def _feed(self, obj: Any) -> None:
        import torch

        if self._budget <= 0:
            return
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "cpu" or (self.integers_only and (obj.is_floating_point() or obj.is_complex())):
                return
            self._fed += 1
            data = obj.detach().contiguous().view(-1)[: self._budget // max(obj.element_size(), 1)]
            raw = data.numpy().tobytes() if data.dtype != torch.bfloat16 else data.float().numpy().tobytes()
            self._budget -= len(raw)
            self._h.update(raw)
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                self._feed(x)
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                self._feed(obj[k])
        elif self.python_ints and isinstance(obj, int) and not isinstance(obj, bool):
            self._fed += 1
            self._h.update(repr(obj).encode() + b",")
        elif not self.integers_only:
            self._h.update(repr(obj).encode()[:1024])

    def result(self) -> str | None:
        if self._failed or (self.integers_only and not self._fed):
            return None
        return self._h.hexdigest()[:16]
