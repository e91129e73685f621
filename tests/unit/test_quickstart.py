"""quickstart.py: the two commands of the README (set up, then the demo or the tests) decide right and fail clearly.

The whole path (a fresh clone, no venv, no torch) is what CI runs: `.ci/run` runs the README's test command, which is
`python3 quickstart.py test`. These tests check the decisions it makes on the way, without installing anything.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


@pytest.fixture(scope="module")
def qs():
    spec = importlib.util.spec_from_file_location("quickstart", REPO / "quickstart.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_leads_with_the_two_commands_and_ci_runs_the_second():
    first_block = re.search(r"```\n(.*?)```", README[README.index("## ") :], re.S).group(1)
    assert "python3 quickstart.py demo" in first_block and "python3 quickstart.py test" in first_block
    test_cmd = README.split("<!-- test-command -->", 1)[1].split("```")[1].strip()
    assert test_cmd == "python3 quickstart.py test"
    ci = (REPO / ".ci" / "run").read_text()
    assert "test-command" in ci and "pip install -q torch==2.13.0" in ci, (
        "CI pins the CPU torch before the README command"
    )


@pytest.mark.parametrize(
    ("version", "ok"),
    [("2.13.0+cpu", True), ("2.4.0", True), ("2.10.1+cu128", True), ("2.3.1", False), ("1.13.0", False),
     (None, False), ("", False), ("garbage", False)],
)  # fmt: skip
def test_a_torch_older_than_2_4_is_not_kept(qs, version, ok):
    assert qs.torch_ok(version) is ok


def test_a_cpu_wheel_for_this_python_in_find_links_is_chosen(qs, tmp_path, monkeypatch):
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    other = "cp39" if tag != "cp39" else "cp310"
    (tmp_path / f"torch-2.13.0+cpu-{other}-{other}-manylinux_2_28_x86_64.whl").touch()  # another Python's
    (tmp_path / f"torch-2.12.0-{tag}-{tag}-manylinux_2_28_x86_64.whl").touch()  # not a CPU build
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # only the folder below, not this machine's pip.conf
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    assert qs.local_cpu_torch(sys.executable) is None
    (tmp_path / f"torch-2.11.0+cpu-{tag}-{tag}-manylinux_2_28_x86_64.whl").touch()
    assert qs.local_cpu_torch(sys.executable) == "torch==2.11.0"


def test_without_a_local_wheel_or_gpu_the_cpu_index_is_used_never_pypis_cuda_build(qs, monkeypatch):
    calls = []
    versions = iter([None, "2.13.0+cpu"])
    monkeypatch.setattr(qs, "probe", lambda python, code: next(versions) if "__version__" in code else None)
    monkeypatch.setattr(qs, "local_cpu_torch", lambda python: None)
    monkeypatch.setattr(qs, "has_nvidia_gpu", lambda: False)
    monkeypatch.setattr(qs, "run", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.delenv("DDPDOCTOR_TORCH", raising=False)
    assert qs.install_torch("python") == "2.13.0+cpu"
    assert calls == [["python", "-m", "pip", "install", "-q", "torch", "--index-url", qs.CPU_INDEX]]


def test_an_installed_torch_is_kept_whatever_its_build(qs, monkeypatch):
    calls = []
    monkeypatch.setattr(qs, "probe", lambda python, code: "12.8" if "cuda" in code else "2.6.0+cu128")
    monkeypatch.setattr(qs, "run", lambda cmd, **kw: calls.append(cmd))
    assert qs.install_torch("python") == "2.6.0+cu128" and calls == []


def test_the_project_install_pins_the_installed_torch_and_is_skipped_when_done(qs, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(qs, "run", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.setattr(qs, "probe", lambda python, code: str(tmp_path) if "prefix" in code else "ok")
    qs.install_project("py", "2.13.0+cpu", "test")
    assert calls == [["py", "-m", "pip", "install", "-q", "-e", ".[test]", "torch==2.13.0+cpu"]]
    qs.install_project("py", "2.13.0+cpu", "test")  # done: nothing more
    qs.install_project("py", "2.13.0+cpu", "")  # the demo needs less than the tests installed
    assert len(calls) == 1
    qs.install_project("py", "2.14.0", "test")  # another torch: install again, pinned to it
    assert calls[-1][-1] == "torch==2.14.0"


def test_a_wrong_verb_is_one_usage_line_and_exit_2():
    done = subprocess.run([sys.executable, str(REPO / "quickstart.py"), "demos"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip().startswith("usage: python3 quickstart.py")
    assert "Traceback" not in done.stderr


def test_the_suite_time_is_the_same_in_the_readme_and_in_what_the_test_command_says(qs):
    assert qs.SUITE_TIME == "25 to 45 minutes on a 2-core machine"
    flat = " ".join(README.split())
    assert f"The whole suite (about 2,170 tests) takes {qs.SUITE_TIME}" in flat
    assert f"# all tests: {qs.SUITE_TIME}" in flat
    assert not re.search(r"\b(?!45\b)\d+ minutes on (?:a|2)[ \w-]*(?:2-core|CPU cores)", flat), "another suite time"
    source = (REPO / "quickstart.py").read_text()
    assert 'say(f"the whole suite takes {SUITE_TIME}' in source
