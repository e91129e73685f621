"""Fuzzing the trace loader with hypothesis: whatever bytes a trace file holds, ``load`` returns a ``Run`` or
raises ``TraceError`` naming the file, and ``diagnose`` (load -> analyze -> rules -> every report format)
never lets any other exception out.

Seeds are real traces: the recorded 2-rank gloo run in tests/fixtures/ddp_gloo_2rank and, when present, the
first events of a few public GPU traces in ../shared/traces (NCCL all-reduce kernels, torch 1.9's category
names). They are mutated byte by byte, value by value, as gzip streams and as folders of ranks. Each test is
bounded (``max_examples``, no deadline) so the whole file runs in a few seconds.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.errors import DDPDoctorError, TraceError
from ddpdoctor.load import load
from ddpdoctor.load.model import TABLES, Run
from ddpdoctor.metrics import analyze
from ddpdoctor.report import OutputFormat, render
from ddpdoctor.table import Codes

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
# small real GPU traces: Megatron (NCCL kernels, no memory events), HTA's NCCL DDP rank, torch 1.9
SHARED_SEEDS = (
    "astra-sim/megatron_tp8_a100_8ranks/megatron_kineto_0.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "tb-profiler/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
)
SHARED_EVENTS = 600  # events kept from each shared trace (metadata events are always kept)

# DDPDOCTOR_FUZZ_SCALE=20 runs twenty times as many examples (a deeper search, for a change to the loader)
SCALE = float(os.environ.get("DDPDOCTOR_FUZZ_SCALE", "1"))
FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)

EVENT_KEYS = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "args", "id", "s")
ARG_KEYS = (
    "External id",
    "external id",
    "correlation",
    "device",
    "stream",
    "Bytes",
    "Total Allocated",
    "Total Reserved",
    "Device Type",
    "Device Id",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "dtype",
    "Collective name",
    "Process Group Name",
    "Seq",
    "Input Dims",
    "Input type",
    "name",
    "labels",
)
HEADER_KEYS = ("distributedInfo", "deviceProperties", "baseTimeNanoseconds", "schemaVersion", "traceEvents")

# Any JSON value, with the awkward ones over-represented: integers past int64, huge and tiny floats, control
# characters and markup in strings, nested containers.
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**63, -(2**63) - 1, 2**64 + 5, 10**30, -1, 0])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e308, -1e308, 5e-324, 1.7976931348623157e308])
    | st.text(max_size=12)
    | st.sampled_from(
        ["ProfilerStep#3", "gloo:all_reduce", "nccl:all_reduce", "stream 7", "", "\x1b[31m", "12"]
    )
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


# --------------------------------------------------------------------------------------------------- seeds
@lru_cache(maxsize=1)
def seeds() -> tuple[tuple[str, dict[str, Any]], ...]:
    """(name, trace document) of every seed; shared traces cut to their first events."""
    out = [
        (p.name, json.loads(gzip.decompress(p.read_bytes())))
        for p in sorted(FIXTURE.glob("*.pt.trace.json.gz"))
    ]
    for rel in SHARED_SEEDS:
        path = SHARED / rel
        if not path.is_file():
            continue
        doc = json.loads(gzip.decompress(path.read_bytes()))
        events = doc["traceEvents"]
        meta = [e for e in events if isinstance(e, dict) and e.get("ph") == "M"]
        doc["traceEvents"] = (
            meta + [e for e in events if isinstance(e, dict) and e.get("ph") != "M"][:SHARED_EVENTS]
        )
        out.append((path.name, doc))
    return tuple(out)


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


SEED_DOCS = st.integers(0, 10**6).map(lambda i: seeds()[i % len(seeds())])


# ------------------------------------------------------------------------------------------------ properties
def load_clean(path: Path) -> Run | None:
    """``load(path)``: a Run whose frames keep the contract, or None after a TraceError naming the input."""
    try:
        run = load(path, workers=1)
    except TraceError as exc:
        message = str(exc)
        assert str(path) in message, message
        assert "\n" not in message and "\x1b" not in message, message  # one printable line
        return None
    check_run(run)
    return run


def check_run(run: Run) -> None:
    ranks = [r.rank for r in run.ranks]
    assert ranks == sorted(set(ranks)) and run.ranks
    assert run.rank_source in ("distributedInfo", "filename", "order")
    assert run.world_size >= 1 and run.mode in ("ddp", "dp", "single")
    assert all(isinstance(s, str) and "\x1b" not in s for s in run.skipped)
    for rt in run.ranks:
        assert rt.tables is not None
        for name in TABLES:  # the tables the metrics read, and the same as the pandas frames of the API
            table, frame = getattr(rt.tables, name), getattr(rt, name)
            assert table.columns == list(frame.columns) and len(table) == len(frame)
            assert isinstance(table["name"], Codes) and isinstance(table["cat"], Codes)
            assert table["pid"].dtype == np.int64 and table["tid"].dtype == np.int64
            assert (table["end_us"] == table["ts_us"] + table["dur_us"]).all()
        for frame in (rt.ops, rt.kernels, rt.memory, rt.steps, rt.comm_ops):
            assert {"name", "cat", "ts_us", "dur_us", "end_us", "pid", "tid", "span"} <= set(frame.columns)
            assert frame["pid"].dtype == np.int64 and frame["tid"].dtype == np.int64
            assert isinstance(frame["name"].dtype, pd.CategoricalDtype)
            assert (
                np.isfinite(frame["ts_us"].to_numpy()).all() and np.isfinite(frame["dur_us"].to_numpy()).all()
            )


def diagnose_clean(path: Path) -> None:
    """The whole ``ddpdoctor diagnose`` pipeline: only a DDPDoctorError may come out."""
    run = load_clean(path)
    if run is None:
        return
    try:
        result = evaluate(load_rules([]), analyze(run))
    except DDPDoctorError:
        return
    for fmt in OutputFormat:
        render(result, fmt, io.StringIO())


# ------------------------------------------------------------------------------------------------ mutations
class Mutant:
    """A mutated seed. Its repr, which hypothesis prints for a failing example, lists the edits (enough to
    redo them), not the megabyte document."""

    def __init__(self, seed: str, edits: list[str], value: Any) -> None:
        self.seed, self.edits, self.value = seed, edits, value

    def __repr__(self) -> str:
        return f"<{self.seed}: {'; '.join(self.edits)}>"


@st.composite
def byte_mutants(draw: st.DrawFn) -> Mutant:
    name, doc = draw(SEED_DOCS)
    data = bytearray(dumps(doc))
    edits = []
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(("flip", "truncate", "delete", "insert", "duplicate", "structural")))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[i] = draw(st.integers(0, 255))
            edits.append(f"byte {i} = {data[i]}")
        elif op == "truncate":
            del data[i:]
            edits.append(f"cut at {i}")
        elif op == "delete":
            n = draw(st.integers(1, 64))
            del data[i : i + n]
            edits.append(f"delete {n} at {i}")
        elif op == "insert" or op == "structural":
            if op == "insert":
                blob = draw(st.binary(min_size=1, max_size=16))
            else:  # a JSON structural token where it does not belong
                blob = draw(st.sampled_from([b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"null"]))
            data[i:i] = blob
            edits.append(f"insert {blob!r} at {i}")
        else:
            n = draw(st.integers(1, 256))
            data[i:i] = data[i : i + n]
            edits.append(f"repeat {n} at {i}")
    return Mutant(name, edits, bytes(data))


def _mutate_value(draw: st.DrawFn, container: dict[str, Any], keys: tuple[str, ...], where: str) -> str:
    key = draw(st.sampled_from(keys))
    if draw(st.integers(0, 4)) == 0:
        container.pop(key, None)
        return f"del {where}[{key!r}]"
    container[key] = draw(JSON_VALUES)
    return f"{where}[{key!r}] = {container[key]!r}"


@st.composite
def value_mutants(draw: st.DrawFn) -> Mutant:
    """A real trace with a few events, args or header fields replaced by arbitrary JSON values."""
    name, seed = draw(SEED_DOCS)
    doc = dict(seed)
    events = list(doc["traceEvents"])
    edits = []
    for _ in range(draw(st.integers(1, 6))):
        what = draw(st.sampled_from(("event", "event", "args", "args", "header", "drop", "clone", "replace")))
        i = draw(st.integers(0, len(events) - 1)) if events else 0
        if what in ("event", "args") and events and isinstance(events[i], dict):
            event = copy.deepcopy(events[i])
            if what == "event" or not isinstance(event.get("args"), dict):
                edits.append(_mutate_value(draw, event, EVENT_KEYS, f"event[{i}]"))
            else:
                edits.append(_mutate_value(draw, event["args"], ARG_KEYS, f"event[{i}].args"))
            events[i] = event
        elif what == "header":
            if draw(st.booleans()) and isinstance(doc.get("distributedInfo"), dict):
                info = doc["distributedInfo"] = dict(doc["distributedInfo"])
                edits.append(
                    _mutate_value(draw, info, ("rank", "world_size", "backend", "pg_config"), "info")
                )
            else:
                edits.append(_mutate_value(draw, doc, HEADER_KEYS[:-1], "doc"))
        elif what == "drop" and events:
            n = draw(st.integers(1, 200))
            del events[i : i + n]
            edits.append(f"del event[{i}:{i + n}]")
        elif what == "clone" and events:
            j = draw(st.integers(0, len(events) - 1))
            events.insert(i, copy.deepcopy(events[j]))
            edits.append(f"event {j} again at {i}")
        elif what == "replace" and events:
            events[i] = draw(JSON_VALUES)
            edits.append(f"event[{i}] = {events[i]!r}")
    doc["traceEvents"] = events
    return Mutant(name, edits, doc)


EVENTS = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "i", "M", "B", "E", "f", "s", "C", "", "x"]),
        "name": st.sampled_from(
            ["ProfilerStep#1", "ProfilerStep#2", "aten::mm", "gloo:all_reduce", "[memory]"]
        )
        | st.text(max_size=10),
        "ts": st.floats(-1e6, 1e16, allow_nan=False) | st.integers(-(2**40), 2**62),
    },
    optional={
        "cat": st.sampled_from(
            ["cpu_op", "user_annotation", "kernel", "Operator", "Runtime", "Trace", "cuda_runtime"]
        )
        | st.text(max_size=8),
        "dur": st.floats(-1e3, 1e9, allow_nan=False) | st.integers(-5, 2**40),
        "pid": st.integers(-(2**31), 2**31) | st.sampled_from(["Spans", "Traces", "0", "stream 3"]),
        "tid": st.integers(-(2**31), 2**31) | st.sampled_from(["stream 7", "PyTorch Profiler", "1"]),
        "args": st.dictionaries(st.sampled_from(ARG_KEYS), JSON_VALUES, max_size=4),
    },
)


# --------------------------------------------------------------------------------------------------- tests
@settings(FUZZ, max_examples=round(30 * SCALE))
@given(mutant=byte_mutants(), gz=st.booleans())
def test_byte_mutated_real_traces_load_or_fail_cleanly(tmp_path_factory, mutant: Mutant, gz: bool) -> None:
    path = tmp_path_factory.mktemp("bytes") / ("rank0.1.pt.trace.json" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(mutant.value, compresslevel=1) if gz else mutant.value)
    load_clean(path)


@settings(FUZZ, max_examples=round(30 * SCALE))
@given(mutant=value_mutants())
def test_value_mutated_real_traces_diagnose_or_fail_cleanly(tmp_path_factory, mutant: Mutant) -> None:
    path = tmp_path_factory.mktemp("values") / "rank0.1.pt.trace.json"
    path.write_bytes(dumps(mutant.value))
    diagnose_clean(path)


@settings(FUZZ, max_examples=round(30 * SCALE))
@given(
    events=st.lists(EVENTS, max_size=30),
    header=st.dictionaries(st.sampled_from(HEADER_KEYS[:-1]), JSON_VALUES, max_size=3),
    array_format=st.booleans(),
)
def test_generated_traces_diagnose_or_fail_cleanly(tmp_path_factory, events, header, array_format) -> None:
    path = tmp_path_factory.mktemp("gen") / "trace.json"
    path.write_bytes(dumps(events if array_format else {**header, "traceEvents": events}))
    diagnose_clean(path)


@settings(FUZZ, max_examples=round(30 * SCALE))
@given(
    seed=st.integers(0, 10**6),
    edits=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.none() | st.integers(0, 10**9),
    tail=st.none() | st.binary(min_size=4, max_size=4),
)
def test_corrupt_gzip_streams_fail_cleanly(tmp_path_factory, seed, edits, cut, tail) -> None:
    """Flipped bytes, a cut stream and a lying size trailer (which the loader uses to size its buffer)."""
    data = bytearray(gzip.compress(dumps(seeds()[seed % len(seeds())][1]), compresslevel=1))
    for pos, value in edits:
        data[pos % len(data)] = value
    if tail is not None:
        data[-4:] = tail
    if cut is not None:
        del data[cut % len(data) :]
    path = tmp_path_factory.mktemp("gz") / "rank0.1.pt.trace.json.gz"
    path.write_bytes(bytes(data))
    load_clean(path)


@settings(FUZZ, max_examples=round(12 * SCALE))
@given(
    picks=st.lists(
        st.tuples(
            st.integers(0, 3),  # which fixture file
            st.sampled_from(
                ["rank{r}.{i}.pt.trace.json", "host_{i}.{i}.pt.trace.json", "rank-{r}.json", "w.json"]
            ),
            st.none() | st.integers(-1, 5),  # distributedInfo.rank (None: removed)
            st.none() | st.integers(0, 6),  # distributedInfo.world_size (None: unchanged)
            st.sampled_from([0, 0, 1, 3600 * 10**6]),  # shift in µs (0: the same run)
        ),
        min_size=1,
        max_size=4,
    )
)
def test_folders_of_mixed_ranks_load_or_fail_cleanly(tmp_path_factory, picks) -> None:
    """Ranks missing, duplicated, without rank information, from different runs: a Run or one clean error."""
    folder = tmp_path_factory.mktemp("folder")
    fixture = [doc for name, doc in seeds() if name.startswith("rank")]
    for i, (which, pattern, rank, world, shift) in enumerate(picks):
        doc = dict(fixture[which % len(fixture)])
        info = dict(doc["distributedInfo"])
        if rank is None:
            info.pop("rank", None)
        else:
            info["rank"] = rank
        if world is not None:
            info["world_size"] = world
        doc["distributedInfo"] = info
        if shift:
            doc["baseTimeNanoseconds"] = doc["baseTimeNanoseconds"] + shift * 1000
        (folder / pattern.format(r=rank if rank is not None else i, i=i)).write_bytes(dumps(doc))
    diagnose_clean(folder)


def test_unmutated_seeds_load_with_ops(tmp_path: Path) -> None:
    # the fuzzing above means something only if the seeds themselves are traces the loader reads
    names = [name for name, _ in seeds()]
    assert sum(n.startswith("rank") for n in names) == 4
    for name, doc in seeds():
        path = tmp_path / name.removesuffix(".gz")
        path.write_bytes(dumps(doc))
        run = load_clean(path)
        assert run is not None and len(run.ranks[0].ops) > 0, name
