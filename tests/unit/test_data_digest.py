"""The DataLoader fingerprints of capture/data_digest.py on datasets of large or slow items: a dataset's content
is read one item at a time (16 items of 100 MB held at once, twice, raised a job's peak memory by 2.8 GB), a read
slower than the budget is undecided rather than a stall, and the digests are those of the items as a list."""

from __future__ import annotations

import time

import torch

from ddpdoctor.capture import data_digest


class Item:
    alive = 0
    most = 0

    def __init__(self, i: int) -> None:
        Item.alive += 1
        Item.most = max(Item.most, Item.alive)
        self.tensor = torch.full((1024,), float(i))
        self.label = i % 10

    def __del__(self) -> None:
        Item.alive -= 1

    def __repr__(self) -> str:
        return f"Item({self.label})"


class Volumes:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        item = Item(i)  # stands for a large item: what the dataset holds while it is handed out
        return (item.tensor, item.label, item)  # type: ignore[return-value]


def test_content_is_read_one_item_at_a_time():
    Item.alive = Item.most = 0
    integers, whole = data_digest.content_digests(Volumes(64), 64)
    assert integers is not None and whole is not None
    assert Item.most <= 2, Item.most  # was 32: both reads' 16 items held at once


def test_the_digests_are_those_of_the_items_as_one_list():
    data = [
        (torch.arange(i, i + 8), i % 3, torch.rand(4, generator=torch.Generator().manual_seed(i))) for i in range(40)
    ]
    indices = sorted({k * 39 // 15 for k in range(16)})
    integers, whole = data_digest.content_digests(data, 40)
    items = [data[i] for i in indices]
    assert integers == data_digest.digest(items, integers_only=True, python_ints=True)
    assert whole == data_digest.digest(items, python_ints=True)


class Slow:
    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.05)
        return torch.zeros(2), i


def test_a_dataset_too_slow_to_read_is_undecided(monkeypatch):
    monkeypatch.setattr(data_digest, "_CONTENT_BUDGET_S", 0.2)
    started = time.monotonic()
    assert data_digest.content_digests(Slow(), 100) == (None, None)
    assert time.monotonic() - started < 1.0  # stopped at the budget, not after 32 reads (1.6 s)
