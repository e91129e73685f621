"""Test data and recorded samples carry no paths of the machine they were made on (they must read the same on a
user's clone, and a reader must not mistake them for this machine's)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MACHINE_PATH = re.compile(r"(?<![\w.])/(work|home|root|Users|tmp/pytest-of-\w+)/")
FOLDERS = ("tests/golden", "tests/fixtures", "samples/recorded")


def test_no_machine_paths_in_test_data_or_recorded_samples():
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in (".json", ".md", ".txt", ".toml"):
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
                    if MACHINE_PATH.search(line):
                        found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert found == []


def test_the_check_sees_a_machine_path(tmp_path):
    # a path of the machine the test runs on (pytest's own temporary folder), as a summary would hold it
    assert MACHINE_PATH.search(f'"files": ["{tmp_path / "x.pt.trace.json.gz"}"]')
    assert not MACHINE_PATH.search('"files": ["rank0.1795981954725.pt.trace.json.gz"]')
