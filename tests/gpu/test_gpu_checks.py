"""Each GPU check as a test (skipped without CUDA). ``bash tests/gpu/run.sh`` runs the same checks in one go and
writes the summary a device call brings back; these are for a developer's own GPU machine:

    python -m pytest tests/gpu -m gpu
"""

from __future__ import annotations

import json
import time

import gpu_checks
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(400)]


@pytest.mark.parametrize("check", gpu_checks.CHECKS, ids=lambda c: c.key)
def test_gpu_check(check, tmp_path):
    result, _ = gpu_checks.run_check(check, tmp_path, deadline=time.monotonic() + 360)
    failed = [i for i in result["items"] if i["status"] == "fail"]
    assert result["status"] == "pass", result.get("error") or json.dumps(failed, indent=1)
