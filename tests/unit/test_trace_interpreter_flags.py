"""``ddpdoctor trace -- python -I job.py`` (issue 23, item 13): ddpdoctor reaches the job's processes through a
``sitecustomize`` on PYTHONPATH, which ``-I``, ``-E`` and ``-S`` keep out. Such a command is refused before
anything runs, in one line that says why and what to do; the interpreter's other options (``-X``, ``-W``, ``-c``,
``-m`` and their arguments) are not mistaken for them, and torchrun (whose workers start without the flags) is
not refused."""

from __future__ import annotations

import sys

import pytest

from ddpdoctor.cli import main


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (["python", "-I", "job.py"], "-I"),
        (["python3", "-E", "job.py", "--lr", "0.1"], "-E"),
        (["python3.11", "-S", "job.py"], "-S"),
        ([sys.executable, "-IE", "job.py"], "-I"),
        (["/usr/bin/python3", "-uI", "job.py"], "-I"),
        (["python", "-X", "importtime", "-E", "job.py"], "-E"),
        (["python", "-Xdev", "-W", "ignore", "-bS", "-m", "train"], "-S"),
        (["python", "-I", "-c", "import train"], "-I"),
    ],
)
def test_an_interpreter_that_ignores_pythonpath_is_refused(tmp_path, capsys, command, flag) -> None:
    out = tmp_path / "run"
    code = main(["trace", "--out", str(out), "--", *command])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("ddpdoctor: error: ") and "Traceback" not in err
    assert f"{flag} " in lines[0] and ("PYTHONPATH" in lines[0] or "sitecustomize" in lines[0]), lines[0]
    assert f"without {flag}" in lines[0], lines[0]  # what to do
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize(
    "command",
    [
        ["python", "-X", "I", "job.py"],  # an -X option's value, not -I
        ["python", "-XE", "job.py"],
        ["python", "-W", "S", "job.py"],
        ["python", "-Wi", "-u", "job.py"],
        ["python", "job.py", "-I", "-E"],  # the script's own arguments
        ["python", "-c", "print(1)", "-I"],
        ["python", "-m", "train", "-S"],
        ["python", "-s", "-P", "job.py"],  # -s and -P leave PYTHONPATH alone
        ["python", "-I", "-m", "torch.distributed.run", "--nproc-per-node", "2", "job.py"],  # its workers start bare
        ["bash", "-E", "job.sh"],  # not Python
        ["pythonista", "-I"],
    ],
)
def test_other_options_are_not_mistaken_for_them(command) -> None:
    from ddpdoctor.capture.interpreter import untraceable

    assert untraceable(command) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the job's processes are read from /proc")
@pytest.mark.timeout(60)
def test_the_watch_finds_a_process_that_lives_but_not_a_quick_look() -> None:
    """A job's process running ``python -I`` for a while is found (the likely cause of a rank with no data); a
    tool's ``python -I -c ...`` that ends at once is not."""
    import shlex
    import subprocess

    from ddpdoctor.capture.interpreter import Watch

    quick = [sys.executable, "-I", "-c", "pass"]
    rank = [sys.executable, "-I", "-c", "import time; time.sleep(3)"]
    job = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess; subprocess.run({quick!r}); subprocess.run({rank!r})"]
    )
    watch = Watch(job.pid).start()
    job.wait(30)
    found = watch.stop()
    assert [shlex.split(f.command)[1:] for f in found] == [rank[1:]], found
    assert "-I (isolated mode) makes Python ignore PYTHONPATH" in found[0].why


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag", ["-I", "-E"])
def test_ddpdoctor_itself_under_such_a_python_says_its_spawned_ranks_go_untraced(tmp_path, flag) -> None:
    """``python -I -m ddpdoctor trace job.py``: the script runs traced in this process, but the ranks it starts
    with multiprocessing get the same option and cannot be: said up front, and the run goes on."""
    import subprocess

    script = tmp_path / "job.py"
    script.write_text("print('ran', flush=True)\n")
    cmd = [sys.executable, flag, "-m", "ddpdoctor", "trace", "--out", str(tmp_path / "run"), str(script)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert result.returncode == 0 and "ran" in result.stdout, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("ddpdoctor: warning: ")]
    assert warnings and f"{flag} " in warnings[0] and "multiprocessing" in warnings[0], result.stderr
    assert f"without {flag}" in warnings[0]
