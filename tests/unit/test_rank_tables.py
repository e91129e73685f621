"""The per-rank analysis runs on numpy tables (``RankTrace.tables``) without pandas; ``rt.ops`` and the other
frames of the public API are the same tables as pandas DataFrames; the helpers that replaced pandas operations
give what those operations gave."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ddpdoctor.load import load
from ddpdoctor.load.model import TABLES
from ddpdoctor.metrics.memory import _mode
from ddpdoctor.metrics.steps import first_index
from ddpdoctor.metrics.summary import _inner_join, _median, _percentile
from ddpdoctor.table import Codes, Table

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "ddp_gloo_2rank"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_load_and_summarize_rank_never_import_pandas() -> None:
    proc = _python(
        "import sys\n"
        "from ddpdoctor.load import load\n"
        "from ddpdoctor.metrics.summary import summarize_rank\n"
        f"run = load({str(FIXTURE)!r}, workers=1)\n"
        "for rt in run.ranks:\n"
        "    summarize_rank(rt, run.capture.get(rt.rank))\n"
        "    summarize_rank(rt, None, (2, 3))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas' or m == 'numpy.ma')[:3])\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout  # numpy.ma: ~10 ms that np.unique/median/percentile cost


def test_diagnose_of_a_trace_folder_never_imports_pandas() -> None:
    proc = _python(
        "import sys\n"
        "from ddpdoctor.cli import main\n"
        "try:\n"
        f"    main(['diagnose', {str(FIXTURE)!r}, '--format', 'json'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, 1, None), exc.code\n"
        "print('pandas' in sys.modules, file=sys.stderr)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "False", proc.stderr


def test_frames_are_the_tables_as_pandas() -> None:
    run = load(FIXTURE, workers=1)
    for rt in run.ranks:
        assert rt.has_trace and rt.tables is not None
        for name in TABLES:
            table, frame = getattr(rt.tables, name), getattr(rt, name)
            assert isinstance(frame, pd.DataFrame) and getattr(rt, name) is frame  # built once
            assert list(frame.columns) == table.columns and len(frame) == len(table)
            assert isinstance(frame["name"].dtype, pd.CategoricalDtype)
            assert list(frame["name"].astype(object)) == table["name"].tolist()
            np.testing.assert_array_equal(frame["ts_us"].to_numpy(), table["ts_us"])
            assert isinstance(table["name"], Codes) and isinstance(table["cat"], Codes)
        # the tables of a rank share one list of names
        assert rt.tables.ops["name"].categories is rt.tables.kernels["name"].categories
        assert list(rt.tables.steps["step"]) == sorted(rt.tables.steps["step"].tolist())
        assert rt.tables.comm_ops["input_dims"].dtype == object and rt.tables.comm_ops["input_dims"].ndim == 1
        # the frames' dtypes as the loader always gave them: argument strings stay object columns (None kept)
        for col in ("dtype", "collective_name", "pg_name", "input_dims", "input_type"):
            assert rt.comm_ops[col].dtype == object
        assert rt.ops["name"].cat.categories.dtype == object


def test_editing_a_frame_leaves_the_tables_alone() -> None:
    rt = load(FIXTURE, workers=1).ranks[0]
    first = rt.tables.ops["ts_us"][0]
    rt.ops.loc[0, "ts_us"] = -1.0
    assert rt.tables.ops["ts_us"][0] == first and rt.ops.loc[0, "ts_us"] == -1.0


def test_summary_ranks_have_no_tables() -> None:
    run = load(FIXTURE, workers=1)
    rt = run.ranks[0]
    rt.set_tables(None)
    assert not rt.has_trace and rt.ops is None and rt.steps is None


@pytest.mark.parametrize("seed", range(5))
def test_inner_join_is_pandas_inner_merge(seed: int) -> None:
    rng = np.random.default_rng(seed)
    left = pd.DataFrame(
        {"step": rng.integers(0, 4, 12), "span": rng.integers(0, 2, 12), "host_start_us": rng.random(12)}
    )
    right = pd.DataFrame(
        {"step": rng.integers(0, 5, 9), "span": rng.integers(0, 2, 9), "analyzed": rng.random(9) < 0.5}
    )
    want = left.merge(right, on=["step", "span"], how="inner")
    got = _inner_join(
        Table({c: left[c].to_numpy() for c in left}), Table({c: right[c].to_numpy() for c in right})
    )
    assert got.columns == list(want.columns)
    for c in want.columns:
        np.testing.assert_array_equal(got[c], want[c].to_numpy())


@pytest.mark.parametrize("seed", range(5))
def test_first_index_is_a_deduplicated_reindex(seed: int) -> None:
    rng = np.random.default_rng(seed)
    keys = rng.integers(-2, 8, 30)
    values = rng.random(30)
    wanted = rng.integers(-3, 10, 20)
    series = pd.Series(values, index=keys)
    want = series[~series.index.duplicated()].reindex(wanted).to_numpy()
    at = first_index(keys, wanted)
    got = np.where(at >= 0, values[np.maximum(at, 0)], np.nan)
    np.testing.assert_array_equal(got, want)
    assert (first_index(keys[:0], wanted) == -1).all() and len(first_index(keys, wanted[:0])) == 0


def test_mode_is_pandas_mode() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        values = rng.integers(0, 4, rng.integers(1, 12))
        assert _mode(values) == int(pd.Series(values).mode().iloc[0])


def test_median_and_percentile_are_numpys() -> None:
    rng = np.random.default_rng(11)
    for n in list(range(1, 40)) * 5:
        values = rng.random(n) * 10.0 ** rng.integers(-3, 6)
        if rng.random() < 0.3:
            values = np.round(values, 1)  # ties
        assert _median(values) == float(np.median(values))
        for q in (0, 10, 50, 90, 99, 100):
            assert _percentile(values, q) == float(np.percentile(values, q)), (n, q)
    assert np.isnan(_median(np.array([1.0, np.nan]))) and np.isnan(_percentile(np.array([np.nan, 1.0]), 90))
