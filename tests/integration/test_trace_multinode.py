"""Two `ddpdoctor trace` launchers acting as two nodes (one rank each) writing to the same --out, as on shared
storage: both ranks' files land, nobody clobbers anybody, and the manifest shows both nodes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import read_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCRIPT = str(Path(__file__).with_name("ddp_script.py"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_share_out(tmp_path):
    out = tmp_path / "run"
    port = _free_port()
    env = {**os.environ, "STEPS": "8", "PYTHONUNBUFFERED": "1"}
    common = [
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "3",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "test-job",
    ]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ddpdoctor",
                "trace",
                "--out",
                str(out),
                *common,
                "--node-rank",
                str(node),
                SCRIPT,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    results = [p.communicate(timeout=150) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1][-2000:] for r in results]
    manifest = read_json(out / "manifest.json")
    assert manifest["world_size"] == 2 and manifest["nnodes"] == 2
    assert sorted(n["node_rank"] for n in manifest["nodes"]) == [0, 1]
    assert [r["status"] for r in manifest["ranks"]] == ["ok", "ok"]
    files = sorted(f for r in manifest["ranks"] for f in r["trace_files"])
    assert len(files) == 2 and files[0].startswith("rank0.") and files[1].startswith("rank1.")
    for f in files:
        assert (out / f).stat().st_size > 0
