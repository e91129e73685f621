#!/usr/bin/env bash
# Download the wheels the GPU checks carry to the device machine (no network there) into .whl/ at the repo
# root (ignored by git; the device call names it in `carry`). Run here, once, before the device call:
#
#     bash tests/gpu/prepare_wheels.sh
#
# The list is tests/gpu/wheels.txt (every ddpdoctor dependency the device image lacks, pinned); the recipe is
# the device tool's: CPython 3.12 wheels for manylinux x86-64, no dependencies pulled in. Afterwards each
# wheel's own requirements are checked against the image's packages and the other wheels.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
specs=$("$PY" tests/gpu/gpu_kit.py)          # fails, naming the problem, when the kit is out of step
rm -rf .whl && mkdir -p .whl                  # one version of each: two stop the whole install there
# shellcheck disable=SC2086
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $specs
"$PY" - <<'PY'
import sys, zipfile
from pathlib import Path
sys.path.insert(0, "tests/gpu")
import gpu_kit
from packaging.requirements import Requirement

have = gpu_kit.image_packages() | set(gpu_kit.wheels())
env = {"python_version": gpu_kit.DEVICE_PYTHON, "sys_platform": "linux", "extra": ""}
problems, found = [], set()
for whl in sorted(Path(".whl").glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    found.add(gpu_kit.normalize(next(l.split(":", 1)[1].strip() for l in lines if l.startswith("Name:"))))
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if (req.marker is None or req.marker.evaluate(env)) and gpu_kit.normalize(req.name) not in have:
                problems.append(f"{whl.name} needs {req}, which neither the image nor wheels.txt has")
problems += [f"{n}: listed in wheels.txt, no wheel downloaded" for n in sorted(set(gpu_kit.wheels()) - found)]
if problems:
    sys.exit("\n".join(problems))
total = sum(p.stat().st_size for p in Path(".whl").glob("*.whl"))
print(f".whl/: {len(found)} wheels, {total / 2**20:.1f} MiB (the device call carries at most 64 MiB)")
PY
