"""``--scheduler ADDRESS`` / ``--workers N`` of the commands that read runs: decode the ranks' raw traces on a Dask
cluster (``ddpdoctor.load.cluster``). Runs written by ``ddpdoctor trace`` are read from their per-rank summaries
and need no cluster; these options matter for folders of foreign traces and for ``--steps``."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from ddpdoctor.cli.argtypes import count


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="decode each rank's traces on this Dask scheduler's workers (tcp://host:8786); they read the files "
        "where they lie, so the paths must be valid on the workers (needs ddpdoctor[dask])",
    )
    g.add_argument(
        "--workers",
        dest="dask_workers",
        type=count(1, 1024),
        metavar="N",
        help="decode the ranks on a local Dask cluster of N worker processes (needs ddpdoctor[dask])",
    )


@contextlib.contextmanager
def cluster_from_args(args: Any) -> Iterator[None]:
    """The block's ``load()`` calls run on the cluster the options name (none: as usual, in this process)."""
    address, workers = getattr(args, "scheduler", None), getattr(args, "dask_workers", None)
    if address is None and workers is None:
        yield
        return
    from ddpdoctor.load.cluster import DaskCluster, using

    with DaskCluster(address=address, workers=workers) as cluster, using(cluster):
        yield
