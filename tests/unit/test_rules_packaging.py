"""The built-in rules ship in the wheel: build a real wheel from a copy of the source tree, inspect it,
install it into an empty folder and load the rules from there (not from the source checkout)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "ddpdoctor", src / "ddpdoctor", symlinks=True, ignore=ignore)
    shutil.copytree(REPO / "rules", src / "rules", ignore=ignore)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 and "No module named pip" in proc.stderr:
        pytest.skip("pip is not available")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("ddpdoctor-*.whl")
    return whl


def test_wheel_contains_every_rule_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for rule in (REPO / "rules").glob("*.toml"):
        assert f"ddpdoctor/_builtin_rules/{rule.name}" in names
    assert not any(n.startswith("rules/") for n in names), "rules must not become a top-level package"
    assert "ddpdoctor/metrics/catalog.toml" in names  # the metric catalog's table is package data too


def test_installed_wheel_loads_its_rules_without_the_source_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    code = (
        "import ddpdoctor, sys; from ddpdoctor.diagnosis import load_rules;"
        "from ddpdoctor.diagnosis.rules import builtin_rules_dir;"
        "print(ddpdoctor.__file__); print(builtin_rules_dir()); print(len(load_rules()))"
    )
    # -S: no site-packages .pth files, so the editable install of the checkout cannot be picked up.
    env = {"PYTHONPATH": f"{target}:{sysconfig.get_paths()['purelib']}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    module_file, rules_dir, count = proc.stdout.split("\n")[:3]
    assert module_file.startswith(str(target)) and rules_dir.startswith(str(target))
    assert int(count) == len(list((REPO / "rules").glob("*.toml")))
