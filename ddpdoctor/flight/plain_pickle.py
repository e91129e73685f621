"""The one place ddpdoctor reads pickle: torch's Flight Recorder dumps, which torch writes as pickle.

A pickle can name any global (a class, a function such as ``os.system``) and have it called while it loads. A Flight
Recorder dump holds only plain data (dicts, lists, tuples, strings, numbers, None, booleans), which pickle encodes
with its own opcodes; this unpickler refuses every global and every persistent id, so nothing named in a file runs.
The capture reads the bytes torch's ``_dump_fr_trace`` returns the same way, though they come from its own process.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

UnpicklingError = pickle.UnpicklingError


class _PlainDataUnpickler(pickle.Unpickler):
    """Builtin containers and scalars only: any global (class, function) or persistent id is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses to load {module}.{name} (a dump holds only plain data)")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refuses a persistent id (a dump holds only plain data)")


def loads_plain(data: bytes) -> Any:
    """``data`` unpickled with no global allowed (``UnpicklingError`` for one that names any)."""
    return _PlainDataUnpickler(io.BytesIO(data)).load()
