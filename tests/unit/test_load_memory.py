"""The loader's peak memory, measured with tracemalloc (numpy's buffers included), on the shapes of trace that
cost the most per byte of JSON (issue 23, item 15): many tiny events, names holding ``},{`` (where the text
would be cut between two events), and Chrome's JSON array format; and a real recorded trace.

The bounds, the README's: decoding holds the JSON text plus ~72 bytes of columns per complete event (at most
``DECODE_PER_EVENT`` here) and the chunk being decoded; reading a rank as ``diagnose`` does (decoded, then
summarised) peaks under the JSON size plus ``LOAD_PER_EVENT`` bytes per event (plus ``SLACK``): under twice the
JSON size for a large trace whose events average 200 bytes or more (real Kineto events are 250-460 bytes; the
tiniest an event can be is ~60). Before issue 23 the JSON array format and names holding ``},{`` took ~150
bytes per event more (a copy of the text, one object per event).
"""

from __future__ import annotations

import gzip
import json
import shutil
import tracemalloc
from pathlib import Path

import pytest

from ddpdoctor.load import load
from ddpdoctor.load.columns import RankTables
from ddpdoctor.load.decode import decode_file

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"
SIZES = (40_000, 160_000)  # events: the memory per event is the slope between the two, the rest is constant
DECODE_PER_EVENT = 100  # bytes beyond the JSON text: the columns (72)
LOAD_PER_EVENT = 200  # bytes beyond the JSON text: the tables, the step breakdown's intervals while summarised
SLACK = 12 << 20  # the ~1 MB chunk of text being decoded, as structs (~8 MB), interning tables, imports

_EVENT = '{"ph":"X","cat":"cpu_op","name":"%s","pid":1,"tid":1,"ts":%d,"dur":1}'


def _trace(tmp_path: Path, shape: str, n: int) -> Path:
    name = "x},{y" if shape == "names with },{" else "aten::add"
    events = ",".join(_EVENT % (name, 2 * i) for i in range(n))
    text = f"[{events}]" if shape == "JSON array" else f'{{"schemaVersion":1,"traceEvents":[{events}]}}'
    path = tmp_path / f"rank0.{n}.pt.trace.json"
    path.write_text(text)
    return path


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _beyond_the_text(tmp_path: Path, shape: str, read) -> tuple[float, int]:
    """(bytes per event, constant bytes) of the peak beyond the JSON text, over ``SIZES``."""
    over = []
    for n in SIZES:
        path = _trace(tmp_path, shape, n)
        read(path)  # the modules' first allocations are not the trace's
        over.append(_peak(lambda path=path: read(path)) - path.stat().st_size)
    per_event = (over[1] - over[0]) / (SIZES[1] - SIZES[0])
    return per_event, int(over[0] - per_event * SIZES[0])


SHAPES = ("tiny events", "names with },{", "JSON array")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", SHAPES)
def test_decoding_holds_the_text_and_the_columns_only(tmp_path, shape) -> None:
    per_event, constant = _beyond_the_text(tmp_path, shape, lambda path: decode_file(path, RankTables()))
    assert per_event < DECODE_PER_EVENT and constant < SLACK, (per_event, constant)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_rank_read_as_diagnose_reads_it_stays_within_the_bound(tmp_path, shape) -> None:
    per_event, constant = _beyond_the_text(tmp_path, shape, lambda path: load(path, workers=1, summarize=True))
    assert per_event < LOAD_PER_EVENT and constant < SLACK, (per_event, constant)


@pytest.mark.timeout(300)
def test_a_real_trace_stays_within_the_bound(tmp_path) -> None:
    src = sorted(FIXTURE.glob("rank0.*.pt.trace.json.gz"))[0]
    path = tmp_path / src.name
    shutil.copy(src, path)
    text = gzip.decompress(path.read_bytes())
    events = len(json.loads(text)["traceEvents"])
    load(path, workers=1, summarize=True)  # the modules' first allocations are not the trace's
    peak = _peak(lambda: load(path, workers=1, summarize=True))
    assert peak < len(text) + LOAD_PER_EVENT * events + SLACK, peak / len(text)
