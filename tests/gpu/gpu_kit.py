"""What the GPU checks carry to the device machine: ddpdoctor's runtime dependencies that its image lacks, as
wheels (``wheels.txt``, downloaded by ``prepare_wheels.sh`` into ``.whl/``), against the image's packages
(``image_packages.txt``, from the device tool's KINDS.md). ``tests/gpu/test_kit.py`` keeps the three in step
with ``pyproject.toml``; on the device, ``installed_versions()`` records what was really there.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEVICE_PYTHON = "3.12"  # the device image's Python (KINDS.md: 3.12.3)


def normalize(name: str) -> str:
    """PEP 503 name: ``Torch_TB.Profiler`` -> ``torch-tb-profiler``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _lines(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def wheels() -> dict[str, str]:
    """name -> pinned version, from ``wheels.txt`` (``name==version`` per line)."""
    out = {}
    for line in _lines(HERE / "wheels.txt"):
        name, sep, version = line.partition("==")
        if not sep or not version:
            raise ValueError(f"wheels.txt: {line!r} is not name==version")
        out[normalize(name)] = version.strip()
    return out


def image_packages() -> set[str]:
    return {normalize(n) for n in _lines(HERE / "image_packages.txt")}


def project_requirements() -> list[Requirement]:
    """ddpdoctor's runtime requirements that apply on the device (Linux, CPython 3.12)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    env = {
        "python_version": DEVICE_PYTHON,
        "python_full_version": DEVICE_PYTHON + ".3",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "platform_machine": "x86_64",
    }
    reqs = [Requirement(r) for r in project["dependencies"]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


def needed_on_device() -> list[str]:
    """Requirements the image does not have: these must travel as wheels."""
    image = image_packages()
    return sorted(normalize(r.name) for r in project_requirements() if normalize(r.name) not in image)


def kit_problems() -> list[str]:
    """What is wrong with the kit: a needed package without a wheel, a pinned wheel outside its requirement,
    or a wheel of a package the image already has (pip would shadow the image's copy, torch above all)."""
    pinned, image = wheels(), image_packages()
    problems = [
        f"{name}: needed on the device but not in wheels.txt" for name in needed_on_device() if name not in pinned
    ]
    for req in project_requirements():
        version = pinned.get(normalize(req.name))
        if version is not None and not req.specifier.contains(Version(version), prereleases=True):
            problems.append(f"{req.name}: wheels.txt pins {version}, pyproject.toml wants {req.specifier}")
    problems += [
        f"{name}: the image has it already; carrying it would shadow the image's copy"
        for name in sorted(pinned)
        if name in image
    ]
    return problems


def installed_versions() -> dict[str, dict[str, Any]]:
    """On the machine at hand: each requirement's installed version, where it comes from, and whether it
    satisfies pyproject.toml."""
    out = {}
    for req in project_requirements():
        try:
            dist = metadata.distribution(req.name)
            version = dist.version
            location = str(dist.locate_file(""))
        except metadata.PackageNotFoundError:
            version, location = None, None
        ok = version is not None and req.specifier.contains(Version(version), prereleases=True)
        out[normalize(req.name)] = {
            "version": version,
            "wanted": str(req.specifier) or "any",
            "ok": ok,
            "from": location,
        }
    return out


def missing_requirements() -> list[str]:
    return [
        f"{name}: {v['version'] or 'not installed'} (wants {v['wanted']})"
        for name, v in installed_versions().items()
        if not v["ok"]
    ]


if __name__ == "__main__":  # python3 tests/gpu/gpu_kit.py: the wheels to fetch, one name==version a line
    problems = kit_problems()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)
    print("\n".join(f"{n}=={v}" for n, v in wheels().items()))
