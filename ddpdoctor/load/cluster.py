"""Decode and summarise the ranks of a run on a Dask cluster (``diagnose --scheduler ADDRESS`` / ``--workers N``).

The work of ``diagnose`` on raw traces is one task per rank: decode its files and summarise it
(``loader._decode_group``); the cross-rank analysis then reads only the small summaries. Here each such task runs on
a ``dask.distributed`` worker, which reads the rank's files where they lie (the task carries their absolute paths,
not their bytes: a folder on shared storage is read by the workers, never shipped through the client), and sends
back the rank's summary. The merge is the single-process path's own, in the same order, so the analysis is the
same, to the byte.

Failures stay per rank. When a worker dies, the scheduler runs the tasks it was running again on the workers left
(the scheduler's ``distributed.scheduler.allowed-failures``, 3 by default; then the task fails with ``KilledWorker``),
and computes again the summaries it held that the client had not fetched yet; a task that raises is run again
``RETRIES`` times. A file that cannot be decoded is skipped inside its rank's task, as in one process. A rank whose
task still fails is reported as a file that could not be read (``Run.skipped``, with the reason), and the other ranks
are analysed.

Dask is an optional dependency: ``pip install 'ddpdoctor[dask]'``.
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ddpdoctor.errors import UsageError

# How many times a rank's task that raised is run again (a failure that may not repeat: a read error on shared
# storage, memory). A task whose worker died is run again by the scheduler's own rule (allowed-failures).
RETRIES = 2


def _need_dask() -> Any:
    try:
        import distributed
    except ImportError:
        raise UsageError(
            "--scheduler/--workers need Dask's distributed scheduler: pip install 'ddpdoctor[dask]' "
            "(or: pip install 'dask[distributed]')"
        ) from None
    return distributed


class DaskCluster:
    """A Dask client for the loader: an existing scheduler (``address``) or a local cluster of ``workers``
    processes on 127.0.0.1, started on ``__enter__`` and closed on ``__exit__``."""

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        if (address is None) == (workers is None):
            raise ValueError("give a scheduler address or a number of local workers")
        self.address = address
        self.workers = workers
        self.client: Any = None
        self._local: Any = None
        self._config: Any = None

    def __enter__(self) -> DaskCluster:
        distributed = _need_dask()
        import dask

        # Dask's system monitor samples the GIL with gilknocker (installed here: it is ddpdoctor's own fallback
        # probe) every millisecond in the scheduler, nannies and workers. Its native thread takes the GIL from
        # outside Python; if it tries while the interpreter finalises, CPython 3.11 ends that thread with
        # pthread_exit, whose unwinding through the Rust thread aborts the process ("FATAL: exception not
        # rethrown", exit status 134), seen in 1 of ~60 local-cluster runs beside two busy CPUs. It also competes
        # for the GIL with the decoding. Off for this cluster's processes (the workers inherit the setting) and
        # this client.
        self._config = dask.config.set({"distributed.admin.system-monitor.gil.enabled": False})
        try:
            self._start(distributed)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self, distributed: Any) -> None:
        if self.address is not None:
            try:
                self.client = distributed.Client(self.address, timeout="10s", set_as_default=False)
            except (OSError, TimeoutError) as exc:
                raise UsageError(f"--scheduler {self.address}: cannot reach a Dask scheduler there ({exc})") from None
        else:
            self._local = distributed.LocalCluster(
                n_workers=self.workers,
                threads_per_worker=1,  # the decoder holds the GIL: one task per process
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
                # the scheduler's HTTP routes (health, metrics) on a free port of 127.0.0.1: not 8787 on every
                # interface, nor a warning on stderr when another cluster holds 8787
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                silence_logs=40,  # logging.ERROR: a worker restart is reported per rank, not as a log storm
            )
            self.client = distributed.Client(self._local, set_as_default=False)

    def __exit__(self, *exc: object) -> None:
        try:
            if self.client is not None:
                self.client.close()
            if self._local is not None:
                self._local.close()
        finally:
            self._config.__exit__(None, None, None)

    @property
    def label(self) -> str:
        return self.address or f"a local Dask cluster of {self.workers} worker(s)"

    def run_each(
        self,
        fn: Callable[..., Any],
        tasks: Iterable[tuple[str, tuple[Any, ...]]],
        failed: Callable[[str, BaseException], Any],
        progress: Callable[[int, int, str], None] | None = None,
    ) -> list[Any]:
        """``fn(*args)`` for each ``(key, args)`` on the cluster, results in the order of ``tasks``; a task that
        still fails after ``RETRIES`` gives ``failed(key, exception)`` in its place."""
        tasks = list(tasks)
        # Keys name tasks on the whole scheduler: a key another load (of this process, or of another client of a
        # shared scheduler) still holds would give back that load's result. One token per call keeps them apart.
        token = uuid.uuid4().hex
        futures = [
            self.client.submit(fn, *args, key=f"ddpdoctor-{token}-{i}-{key}", retries=RETRIES, pure=False)
            for i, (key, args) in enumerate(tasks)
        ]
        results: list[Any] = []
        for (key, _), fut in zip(tasks, futures, strict=True):  # all run at once; collected in order
            try:
                results.append(fut.result())
            except Exception as exc:  # noqa: BLE001 - any failure of one rank's task is that rank's, not the run's
                results.append(failed(key, exc))
            if progress:
                progress(len(results), len(futures), key)
        return results


_CURRENT: contextvars.ContextVar[DaskCluster | None] = contextvars.ContextVar("ddpdoctor_cluster", default=None)


def current() -> DaskCluster | None:
    """The cluster every ``load()`` in this context uses when it is not given one (``using``)."""
    return _CURRENT.get()


@contextlib.contextmanager
def using(cluster: DaskCluster) -> Iterator[DaskCluster]:
    """Within the block, ``load()`` (and so every command's ``analyze_run``) decodes ranks on ``cluster``."""
    token = _CURRENT.set(cluster)
    try:
        yield cluster
    finally:
        _CURRENT.reset(token)


def absolute(paths: list[Path]) -> list[Path]:
    """Paths a worker can open whatever its working directory."""
    return [Path(p).resolve() for p in paths]
