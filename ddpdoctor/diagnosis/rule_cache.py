"""The built-in rules, checked once and kept as one pickle beside the package's ``.pyc`` files.

Parsing the ~30 built-in rule files (TOML) and checking their expressions and templates took a cold
``diagnose`` more than the rules' whole evaluation; the checked ``Rule`` objects are the same every run, so they
are kept in ``ddpdoctor/diagnosis/__pycache__/builtin_rules.<cache tag>.pickle`` (written like a ``.pyc``: when
the folder is writable, atomically). The cache is used only while its key still matches: the rules folder, every
rule file's name and bytes, the interpreter, and the size and modification time of the modules that check and
build rules. Anything else (no cache, a stale or unreadable one, a read-only install) loads the files as before.
A rule file that fails to load is never cached, so its error is raised on every run.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the modules whose code decides what a loaded rule is (and the catalog the rules' metric names are checked against)
_CODE = (
    "diagnosis/rules.py",
    "diagnosis/rule_schema.py",
    "diagnosis/expr.py",
    "diagnosis/template.py",
    "diagnosis/rule_cache.py",
    "metrics/catalog.py",
    "metrics/catalog.toml",
    "knobs.py",
    "values.py",
    "ranklist.py",
)
_PACKAGE = Path(__file__).resolve().parents[1]
_CACHE = Path(__file__).resolve().parent / "__pycache__" / f"builtin_rules.{sys.implementation.cache_tag}.pickle"


def _key(folder: Any, entries: list[Any]) -> tuple[Any, ...]:
    code = []
    for rel in _CODE:
        st = os.stat(_PACKAGE / rel)
        code.append((rel, st.st_size, st.st_mtime_ns))
    files = tuple((e.name, e.read_bytes()) for e in entries)
    return (str(folder), sys.version, tuple(code), files)


def cached_rules(folder: Any, entries: list[Any], build: Callable[[list[Any]], list[Any]]) -> list[Any]:
    """``build(entries)`` (the rule files of ``folder``, in order), from the cache when its key matches."""
    try:
        key = _key(folder, entries)
    except OSError:
        return build(entries)
    try:
        stored_key, rules = pickle.loads(_CACHE.read_bytes())
        if stored_key == key:
            return list(rules)
    except Exception:  # noqa: BLE001 - a missing, partial or foreign cache file is rebuilt, never fatal
        pass
    rules = build(entries)
    tmp = _CACHE.with_name(f"{_CACHE.name}.{os.getpid()}.tmp")
    try:
        blob = pickle.dumps((key, tuple(rules)), protocol=pickle.HIGHEST_PROTOCOL)
        _CACHE.parent.mkdir(exist_ok=True)
        tmp.write_bytes(blob)
        os.replace(tmp, _CACHE)
    except Exception:  # noqa: BLE001 - a read-only install or an unpicklable rule: no cache, same rules
        with contextlib.suppress(OSError):
            tmp.unlink()
    return rules
