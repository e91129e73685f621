"""``--format json``: the report document (``ddpdoctor.report.document``), strict JSON (no NaN)."""

from __future__ import annotations

import json
from typing import TextIO

from ddpdoctor.diagnosis.findings import Diagnosis
from ddpdoctor.report.document import build


def render(result: Diagnosis, stream: TextIO) -> None:
    """Write the JSON document of ``result`` to ``stream``."""
    json.dump(build(result), stream, indent=2, allow_nan=False)
    stream.write("\n")
