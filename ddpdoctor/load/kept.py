"""What ``load(path, use_summaries=True)`` keeps of each rank's summary file, as each is read
(``runfiles.read_summaries(keep=...)``): a run of 131,072 ranks must not hold every file's lists as Python objects
(about 80 kB a rank, 10 GB in all).

- ``exposed_comm`` (a few hundred intervals a rank, read in full by ``metrics.transfer.transfer_metrics``):
  float64 arrays, the values that function made of the lists.
- ``timeline`` (read by ``metrics.timeline`` only for the few ranks a report draws, and only to test that it is
  there for the others) and ``op_work`` (read by ``metrics.hostload`` only where every rank shares one host, then
  a few): left on disk (``OnDisk``), read again from the file when read. They reach ``keep`` undecoded (their JSON
  syntax checked, ``runfiles.read_summaries``) and are checked in full when read; a file that has changed or gone
  since, or whose table is not one ddpdoctor writes, is one clear error, never another rank's numbers.
- the strings every rank repeats, one object for all the ranks of a load (``Shared``), not one a rank: the words
  of ``collectives``' text columns (``kind``, ``issued_in``: 2 kB a rank, 300 MB at 131,072 ranks) and the names
  of ``metrics`` (those msgspec's key cache misses: 1.5 kB a rank); equal strings, so everything reads the same.

The other fields stay as read: the analysis reads most of them for every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
import numpy as np

from ddpdoctor import runfiles
from ddpdoctor.errors import TraceError
from ddpdoctor.load.discover import shown

ON_DISK = runfiles.LAZY_TABLES  # the tables read_summaries leaves undecoded


class OnDisk(Mapping[str, Any]):
    """A summary file's table (``{column: [...]}``) read from the file the first time it is read."""

    __slots__ = ("_path", "_field", "_value")

    def __init__(self, path: str, field: str) -> None:
        self._path = path
        self._field = field
        self._value: dict[str, Any] | None = None

    def _table(self) -> dict[str, Any]:
        if self._value is None:
            data, why = runfiles.read_summary_again(self._path)
            value = data.get(self._field) if data is not None else None
            if not isinstance(value, dict) or not value:
                why = why or f"it has no {self._field} now"
                raise TraceError(
                    f"{shown(self._path)}: its {self._field} cannot be read ({why}): the file changed while it was"
                    " analysed, or was not written by ddpdoctor; run the command again"
                )
            self._value = value
        return self._value

    def __getitem__(self, key: str) -> Any:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return f"OnDisk({self._path!r}, {self._field!r})"


TEXT_COLUMNS = ("kind", "issued_in")  # the collectives' columns that hold text


class Shared:
    """The strings kept so far by one load's ``keep`` calls: texts (a text replaced by an equal one kept), and the
    metric names of the last summary (a summary with the same names, in the same order, takes them)."""

    __slots__ = ("texts", "metric_names")

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.metric_names: list[str] = []


def keep(data: dict[str, Any], path: str, shared: Shared | None = None) -> dict[str, Any]:
    """What is kept of one checked summary file (module docstring); ``shared``: the strings of one load."""
    colls = data.get("collectives")
    if shared is not None and isinstance(colls, dict):
        texts = shared.texts
        for key in TEXT_COLUMNS:
            column = colls.get(key)
            if type(column) is list:  # (only strings are keys of texts: a number is never replaced by a word)
                colls[key] = [texts.setdefault(v, v) if type(v) is str else v for v in column]
    metrics = data.get("metrics")
    if shared is not None and type(metrics) is dict:
        names = list(metrics)
        if names == shared.metric_names:  # the same names in the same order: the same dict, its keys shared
            data["metrics"] = dict(zip(shared.metric_names, metrics.values(), strict=True))
        else:
            shared.metric_names = names
    for field in ON_DISK:
        table = data.get(field)
        if isinstance(table, msgspec.Raw) or (isinstance(table, dict) and table):
            data[field] = OnDisk(path, field)
    exposed = data.get("exposed_comm")
    if isinstance(exposed, dict) and all(isinstance(exposed.get(k), list) for k in ("start_us", "end_us")):
        data["exposed_comm"] = {
            **exposed,
            "start_us": np.asarray(exposed["start_us"], dtype=np.float64).reshape(-1),
            "end_us": np.asarray(exposed["end_us"], dtype=np.float64).reshape(-1),
        }
    return data


def keeper() -> Callable[[dict[str, Any], str], dict[str, Any]]:
    """``keep`` for the files of one load, their strings shared (``Shared``: none kept past the load)."""
    shared = Shared()
    return lambda data, path: keep(data, path, shared)
