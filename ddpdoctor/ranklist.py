"""Rank lists written compactly: ``[[first, last], ...]`` (inclusive ranges) in place of every rank.

Every rank of a job states the process groups it is in with all their ranks (``distributed_info.pg_config``, from
torch's trace): the default group of a 131,072-rank job is 131,072 numbers in each of 131,072 files, O(ranks²).
``compact`` writes an ascending list of distinct ranks as ranges (``[[0, 131071]]``); any other list (unsorted,
repeated) is written as it is, so no order is lost. ``read`` takes either form back: a plain list of ints (as older
ddpdoctor wrote, and torch's traces hold) stays as it is; ranges become a ``RankRanges``, a read-only sequence of
the ranks that keeps only the ranges (``loader`` shares one object among the ranks that state the same ranges).
A value that is neither is ``BadRankList`` (one line naming the field).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any, overload

_MAX_RANK = 1 << 31


class BadRankList(ValueError):
    """A rank list that is neither a list of ranks nor a list of ``[first, last]`` ranges."""


def _is_rank(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_RANK


class RankRanges(Sequence[int]):
    """The ranks of ascending, disjoint, inclusive ranges, as a read-only sequence (``len``, indexing, ``in``,
    iteration, ``==`` with a list of the same ranks) that never holds the ranks themselves."""

    __slots__ = ("_firsts", "_ranges", "_starts", "_len")

    def __init__(self, ranges: Sequence[tuple[int, int]]) -> None:
        self._ranges = tuple((int(a), int(b)) for a, b in ranges)
        self._firsts = [a for a, _ in self._ranges]
        starts, total = [], 0
        for a, b in self._ranges:
            starts.append(total)
            total += b - a + 1
        self._starts, self._len = starts, total

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("rank index out of range")
        k = bisect.bisect_right(self._starts, index) - 1
        return self._ranges[k][0] + index - self._starts[k]

    def __iter__(self) -> Iterator[int]:
        for a, b in self._ranges:
            yield from range(a, b + 1)

    def __contains__(self, rank: object) -> bool:
        if not isinstance(rank, int):
            return False
        k = bisect.bisect_right(self._firsts, rank) - 1
        return k >= 0 and rank <= self._ranges[k][1]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankRanges):
            return self._ranges == other._ranges
        if isinstance(other, (list, tuple)):
            return len(other) == self._len and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._ranges)

    def __repr__(self) -> str:
        return f"RankRanges({self.to_json()})"

    def to_json(self) -> list[list[int]]:
        """The ranges as written: ``[[first, last], ...]``."""
        return [[a, b] for a, b in self._ranges]


def compact(ranks: Any) -> Any:
    """``ranks`` as it is written: ranges for an ascending list of distinct ranks (or a ``RankRanges``), anything
    else unchanged."""
    if isinstance(ranks, RankRanges):
        return ranks.to_json()
    if not isinstance(ranks, (list, tuple)) or not ranks or not all(map(_is_rank, ranks)):
        return ranks
    out: list[list[int]] = []
    prev = -1
    for r in ranks:
        if r <= prev:
            return list(ranks)  # unsorted or repeated: the list itself, its order kept
        if out and r == prev + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
        prev = r
    return out


def read(value: Any, where: str) -> list[int] | RankRanges:
    """A rank list as written (``compact``'s ranges, or a plain list of ranks); ``BadRankList`` naming ``where``
    for anything else (ranges out of order or overlapping, a first after its last, not ints)."""
    if not isinstance(value, list):
        raise BadRankList(f"{where}: a rank list is a list, not {type(value).__name__}")
    if not value or not isinstance(value[0], list):
        if not all(map(_is_rank, value)):
            bad = next(v for v in value if not _is_rank(v))
            raise BadRankList(f"{where}: {bad!r} is not a rank (a list of ranks, or of [first, last] ranges)")
        return value
    prev = -1
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and _is_rank(pair[0]) and _is_rank(pair[1])):
            raise BadRankList(f"{where}: {pair!r} is not a [first, last] range of ranks")
        if pair[0] > pair[1] or pair[0] <= prev:
            raise BadRankList(f"{where}: range {pair!r} is not ascending after rank {prev} (ranges ascend, disjoint)")
        prev = pair[1]
    return RankRanges([(a, b) for a, b in value])
