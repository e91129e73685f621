#!/usr/bin/env bash
# The GPU checks' one entry point, for a GPU machine (the device tool's, or any with CUDA):
#
#     bash tests/gpu/run.sh [--only 1,3] [--budget SECONDS]
#
# Installs the carried wheels (.whl/, made by tests/gpu/prepare_wheels.sh) into /tmp/site without touching the
# machine's own packages (torch above all), runs every check with ddpdoctor from this working tree, and writes
# gpu-summary.json, one archive per check and run.log under $OUT (/tmp/ddpdoctor-gpu-out when OUT is unset).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ddpdoctor-gpu-out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || { echo "gpu checks: installing .whl/*.whl failed" | tee "$OUT/run.log"; exit 3; }
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 | tee "$OUT/run.log"
python3 tests/gpu/gpu_run.py --out "$OUT" "$@" 2>&1 | tee -a "$OUT/run.log"
exit "${PIPESTATUS[0]}"
