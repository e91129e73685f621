#!/usr/bin/env python3
"""Set up ddpdoctor from a checkout and run it: two commands on a fresh machine with Python >= 3.10.

    python3 quickstart.py demo          # set up, then trace and diagnose the bundled 2-rank sample (CPU, gloo)
    python3 quickstart.py test [ARGS]   # set up (with the test extras), then the test suite (ARGS go to pytest)

Set-up, each step skipped when it is already done:

1. The environment: the active virtual environment if there is one, else ``.venv`` in the checkout (created; when
   the Python that runs this script already has torch, the new venv sees it through ``--system-site-packages``).
2. torch: an installed torch >= 2.4 is kept, whatever its build. Otherwise: a CPU wheel that pip's ``find-links``
   folders hold is used; on a machine without an NVIDIA GPU, PyTorch's CPU index; with a GPU, PyPI's (CUDA) build.
   ``DDPDOCTOR_TORCH="torch==2.5.1 --index-url ..."`` overrides the choice (the words are given to pip).
3. ddpdoctor itself, editable, with ``torch==<the installed version>`` pinned in the same pip command so that no
   dependency replaces it.

Nothing here needs root; nothing outside the checkout (or the active environment) is changed.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent
VENV = REPO / ".venv"
STAMP_NAME = ".ddpdoctor-quickstart"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_MIN = (2, 4)
# the whole suite, as the README states it (the last full run in CI: 1,624 s)
SUITE_TIME = "25 to 45 minutes on a 2-core machine"

# The demo: the straggler sample (rank 1 does 60 ms of extra work before every step), 8 profiled steps: the fewest in
# which "rank 1 is last in every step" cannot be chance. About half a minute on 2 CPU cores.
DEMO_TRACE = [
    "trace", "--wait", "2", "--warmup", "1", "--active", "8", "--standalone", "--nproc-per-node", "2",
    "samples/ddp_straggler.py", "--steps", "14", "--slow-ms", "60",
]  # fmt: skip


class SetupError(Exception):
    """One line for the user; the script exits 2."""


def say(msg: str) -> None:
    print(f"quickstart: {msg}", flush=True)


def run(cmd: list[str], **kw) -> None:
    say("$ " + shlex.join(cmd))
    done = subprocess.run(cmd, **kw)
    if done.returncode != 0:
        raise SetupError(f"this command failed (exit {done.returncode}): {shlex.join(cmd)}")


def probe(python: str, code: str) -> str | None:
    """What ``python -c code`` prints, or None when it fails (e.g. the module is not installed)."""
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


TORCH_PROBE = "import torch; print(torch.__version__)"


def torch_ok(version: str | None) -> bool:
    if not version:
        return False
    try:
        major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= TORCH_MIN


def active_venv() -> Path | None:
    """The virtual environment this script runs in, if any (an activated venv, or its python called directly)."""
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        return Path(sys.prefix)
    return None


def env_python(env: Path) -> str:
    scripts = "Scripts" if os.name == "nt" else "bin"
    return str(env / scripts / ("python.exe" if os.name == "nt" else "python"))


def make_env() -> str:
    """The environment's python: the active venv's, else ``.venv``'s (created when missing)."""
    env = active_venv()
    if env is not None:
        say(f"using the active virtual environment {env}")
        return sys.executable
    python = env_python(VENV)
    if Path(python).exists() and probe(python, "print(1)") == "1":
        return python
    if VENV.exists():
        raise SetupError(f"{VENV} exists but its python does not run: remove it and run this again")
    here_torch = probe(sys.executable, TORCH_PROBE)
    cmd = [sys.executable, "-m", "venv"]
    if torch_ok(here_torch):
        say(f"{sys.executable} has torch {here_torch}: the new .venv keeps it (--system-site-packages)")
        cmd.append("--system-site-packages")
    try:
        run([*cmd, str(VENV)])
    except SetupError as exc:
        raise SetupError(
            f"{exc} (on Debian/Ubuntu the venv module is the package python3-venv: apt-get install python3-venv)"
        ) from None
    return python


def has_nvidia_gpu() -> bool:
    return Path("/proc/driver/nvidia/gpus").is_dir() or shutil.which("nvidia-smi") is not None


def find_links_dirs(python: str) -> list[Path]:
    """The folders pip's ``find-links`` names (environment, then pip's configuration)."""
    words = os.environ.get("PIP_FIND_LINKS", "").split()
    conf = probe(python, "import subprocess,sys; print(subprocess.run([sys.executable,'-m','pip','config','list'],"
                 "capture_output=True,text=True).stdout)")  # fmt: skip
    for line in (conf or "").splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            words += value.strip().strip("'\"").split()
    return [Path(w.removeprefix("file://")) for w in words if not w.startswith(("http:", "https:"))]


def local_cpu_torch(python: str) -> str | None:
    """``torch==X`` for a CPU torch wheel in a find-links folder that fits ``python``, else None."""
    tag = probe(python, "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
    for folder in find_links_dirs(python):
        for wheel in sorted(folder.glob("torch-*+cpu-*.whl")) if folder.is_dir() else []:
            parts = wheel.name.split("-")
            if len(parts) >= 3 and parts[2] == tag:
                return "torch==" + parts[1].split("+")[0]
    return None


def install_torch(python: str) -> str:
    version = probe(python, TORCH_PROBE)
    if torch_ok(version):
        cuda = probe(python, "import torch; print(torch.version.cuda or 'cpu')")
        say(f"keeping torch {version} ({'CUDA ' + cuda if cuda and cuda != 'cpu' else 'CPU build'})")
        return version  # type: ignore[return-value]
    if version:
        say(f"torch {version} is older than ddpdoctor needs (>= {'.'.join(map(str, TORCH_MIN))}): upgrading it")
    override = os.environ.get("DDPDOCTOR_TORCH")
    if override:
        words = shlex.split(override)
        say(f"installing {override} (DDPDOCTOR_TORCH)")
    elif (spec := local_cpu_torch(python)) and not has_nvidia_gpu():
        words = [spec]
        say(f"no NVIDIA GPU here: installing {spec}, the CPU wheel on this machine's disk")
    elif not has_nvidia_gpu():
        words = ["torch", "--index-url", CPU_INDEX]
        say("no NVIDIA GPU here: installing PyTorch's CPU build (a plain `pip install torch` is the CUDA build)")
    else:
        words = ["torch"]
        say("an NVIDIA GPU is here: installing PyPI's torch (the CUDA build, several GB)")
    run([python, "-m", "pip", "install", "-q", *words])
    version = probe(python, TORCH_PROBE)
    if not torch_ok(version):
        raise SetupError(f"torch still does not import after installing it (got {version!r})")
    return version  # type: ignore[return-value]


def stamp_value(torch_version: str, extras: str) -> str:
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]
    return f"{digest} torch={torch_version} extras={extras}"


def install_project(python: str, torch_version: str, extras: str) -> None:
    """``pip install -e .[extras]`` with torch pinned to the installed version; skipped when already done."""
    prefix = Path(probe(python, "import sys; print(sys.prefix)") or VENV)
    stamp = prefix / STAMP_NAME
    want = stamp_value(torch_version, extras)
    have = stamp.read_text().splitlines() if stamp.exists() else []
    if (want in have or (extras == "" and any(h.startswith(want.split(" extras=")[0]) for h in have))) and probe(
        python, "import ddpdoctor; print(ddpdoctor.__file__)"
    ):
        say(f"ddpdoctor is installed in {prefix} (pyproject.toml unchanged since)")
        return
    target = f".[{extras}]" if extras else "."
    run([python, "-m", "pip", "install", "-q", "-e", target, f"torch=={torch_version}"], cwd=REPO)
    with stamp.open("a") as out:
        out.write(want + "\n")


def setup(extras: str) -> str:
    if sys.version_info < (3, 10):  # noqa: UP036 (this script is run by whatever python3 the machine has)
        raise SetupError(f"ddpdoctor needs Python >= 3.10; this is {sys.version.split()[0]} ({sys.executable})")
    python = make_env()
    torch_version = install_torch(python)
    install_project(python, torch_version, extras)
    return python


def ddpdoctor_cmd(python: str) -> list[str]:
    return [python, "-m", "ddpdoctor"]


def activated(python: str) -> dict[str, str]:
    """This process's environment as ``activate`` would leave it: the env's scripts first on PATH (torchrun, ...)."""
    env = dict(os.environ)
    bin_dir = str(Path(python).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = str(Path(bin_dir).parent)
    env.pop("PYTHONHOME", None)
    return env


def demo() -> int:
    python = setup("")
    out = REPO / "ddpdoctor-runs" / time.strftime("demo-%Y%m%d-%H%M%S")
    say(f"tracing samples/ddp_straggler.py on 2 CPU ranks into {out.relative_to(REPO)} (about half a minute)")
    env = activated(python)
    trace = subprocess.run(
        [*ddpdoctor_cmd(python), DEMO_TRACE[0], "--out", str(out), *DEMO_TRACE[1:]], cwd=REPO, env=env
    )
    if trace.returncode != 0:
        say(f"the traced sample exited {trace.returncode}; diagnosing what it wrote")
    diagnose = subprocess.run([*ddpdoctor_cmd(python), "diagnose", str(out)], cwd=REPO, env=env)
    tool = shlex.quote(str(Path(python).parent / "ddpdoctor"))
    say(f"next: {tool} diagnose --format html -o report.html {out.relative_to(REPO)}")
    return diagnose.returncode


def test(args: list[str]) -> int:
    python = setup("test")
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        say("no Chromium on PATH: the browser tests (HTML report, dashboard) will be skipped "
            "(Debian/Ubuntu: apt-get install chromium)")  # fmt: skip
    if not (REPO.parent / "shared" / "traces").is_dir():
        say("no ../shared/traces beside the checkout: the tests on recorded GPU traces will be skipped")
    say(f"the whole suite takes {SUITE_TIME}")
    return subprocess.run([python, "-m", "pytest", *args], cwd=REPO, env=activated(python)).returncode


USAGE = "usage: python3 quickstart.py (demo | test [PYTEST ARGS...])"


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        return demo() if argv[0] == "demo" else test(argv[1:])
    except SetupError as exc:
        print(f"quickstart: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
