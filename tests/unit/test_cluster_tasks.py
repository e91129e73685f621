"""Issue 29: what ``load()`` hands a Dask cluster per rank (``load.cluster``). The files are read by the workers, not
shipped through the client: each task carries the absolute paths of one rank's files (and that rank's capture, if
any), never their bytes; a task that fails is named per rank. A stand-in cluster runs the tasks in this process and
keeps what it was given, so no Dask is needed here."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import SAMPLES

from ddpdoctor.load import load

STRAGGLER = SAMPLES / "recorded" / "ddp_straggler"


class Recording:
    """The interface ``load()`` uses (``run_each``, ``label``), running each task here, or failing the ones in
    ``fail`` as a cluster would report them."""

    label = "a stand-in cluster"

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        self.tasks: list[tuple[str, tuple[Any, ...]]] = []
        self.fail = fail

    def run_each(self, fn, tasks, failed, progress=None):  # noqa: ANN001 - the DaskCluster.run_each signature
        self.tasks = list(tasks)
        out = []
        for key, args in self.tasks:
            out.append(failed(key, RuntimeError("worker gone")) if key in self.fail else fn(*args))
        return out


def _folder(tmp_path: Path) -> Path:
    dest = tmp_path / "ranks"
    dest.mkdir()
    for p in STRAGGLER.glob("rank*.pt.trace.json.gz"):
        shutil.copy(p, dest / p.name)
    return dest


def test_a_task_carries_the_paths_of_its_rank_not_their_bytes(tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    cluster = Recording()
    clustered = load(Path("ranks"), summarize=True, cluster=cluster)  # a relative path: the workers get it absolute
    alone = load(Path("ranks"), summarize=True)
    assert [key for key, _ in cluster.tasks] == ["rank0", "rank1"]
    for key, args in cluster.tasks:
        paths = args[1]
        assert all(isinstance(p, Path) and p.is_absolute() and p.parent == folder.resolve() for p in paths), args
        biggest = max(p.stat().st_size for p in paths)
        assert len(pickle.dumps(args)) < min(4096, biggest // 20), (key, len(pickle.dumps(args)), biggest)
    # the run reads as in one process: the files as they were given (relative), the same summaries
    assert [rt.files for rt in clustered.ranks] == [rt.files for rt in alone.ranks]
    assert [rt.summary for rt in clustered.ranks] == [rt.summary for rt in alone.ranks]


@pytest.mark.parametrize("lost", ["rank0", "rank1"])
def test_a_rank_whose_task_failed_is_named_and_the_other_analysed(tmp_path, lost):
    folder = _folder(tmp_path)
    run = load(folder, summarize=True, cluster=Recording(fail=frozenset({lost})))
    assert [rt.rank for rt in run.ranks] == [1 - int(lost[-1])]
    (why,) = run.skipped
    assert why.startswith(f"{lost}.") and ".pt.trace.json.gz: its task failed on a stand-in cluster" in why, why
    assert "(RuntimeError: worker gone); the other ranks are analysed" in why


def test_every_task_failing_is_one_error_naming_the_first(tmp_path):
    from ddpdoctor.errors import TraceError

    folder = _folder(tmp_path)
    with pytest.raises(TraceError, match=r"none of its 2 trace files could be read; first: rank0\..*task failed"):
        load(folder, summarize=True, cluster=Recording(fail=frozenset({"rank0", "rank1"})))
