"""The mark ``ddpdoctor trace`` puts on the command line it records in ``manifest.json``, so that ``ddpdoctor try``
can tell a run directory this user's own ``trace`` wrote from one that was handed over or edited: a run directory
is data, and anyone can write a command into a file.

The mark is an HMAC-SHA256 of the recorded command and the directory it ran in, keyed by a secret of this user's:
``$XDG_CONFIG_HOME/ddpdoctor/trace-key`` (default ``~/.config/ddpdoctor/trace-key``), 32 random bytes made by the
first ``trace``, readable by this user only (0600 in a 0700 folder). A key that others can read, or that is not
this user's regular file, is not used: ``trace`` then writes no mark and ``try`` asks before it runs the command.
Pure standard library, no I/O but the key file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

FIELD = "command_mark"  # the manifest's field
_SCHEME = "hmac-sha256:"
_KEY_HEX = 64  # 32 bytes, as hex text


def key_path() -> Path | None:
    """Where this user's key is (None when there is no home to keep it in)."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    if not os.path.isabs(base):  # the XDG rule: a relative value is ignored
        try:
            base = str(Path.home() / ".config")
        except (RuntimeError, KeyError):
            return None
    return Path(base) / "ddpdoctor" / "trace-key"


def _read_key(path: Path) -> bytes | None:
    """The key, when ``path`` is this user's regular file that no one else can read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_uid != os.getuid():
            return None
        text = os.read(fd, _KEY_HEX + 1)
    finally:
        os.close(fd)
    try:
        return bytes.fromhex(text.decode("ascii")) if len(text) == _KEY_HEX else None
    except (UnicodeDecodeError, ValueError):
        return None


def _create_key(path: Path) -> None:
    """Write a new key, unless one is there already (two traces starting at once keep the first one's)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(_KEY_HEX // 2).encode("ascii"))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # complete or absent: a reader never sees half a key
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def _key(*, create: bool) -> bytes | None:
    path = key_path()
    if path is None:
        return None
    key = _read_key(path)
    if key is None and create and not os.path.lexists(path):
        try:
            _create_key(path)
        except OSError:  # a read-only home: no mark, and try asks first
            return None
        key = _read_key(path)
    return key


def _digest(key: bytes, command: list[str], cwd: str) -> str:
    message = json.dumps(["ddpdoctor trace command", 1, command, cwd], ensure_ascii=True, separators=(",", ":"))
    return _SCHEME + hmac.new(key, message.encode("ascii"), hashlib.sha256).hexdigest()


def mark(command: list[str], cwd: Any) -> str | None:
    """The mark of ``command`` run in ``cwd``, for the manifest ``trace`` writes (None: no key, or no directory).
    Never raises: a trace does not fail for its mark."""
    if not isinstance(cwd, str) or not all(isinstance(a, str) for a in command):
        return None
    try:
        key = _key(create=True)
        return _digest(key, list(command), cwd) if key is not None else None
    except (OSError, ValueError, UnicodeError):
        return None


def check(manifest: dict[str, Any]) -> str | None:
    """None when ``manifest``'s command and directory carry this user's mark; otherwise why not, in words."""
    given = manifest.get(FIELD)
    if not isinstance(given, str) or not given:
        return (
            "it carries no mark of your own `ddpdoctor trace` (traced by someone else, on another machine, by an "
            "older ddpdoctor, or the mark was removed)"
        )
    key = _key(create=False)
    if key is None:
        return f"you have no trace key ({key_path()}) to check its mark with"
    command, cwd = manifest.get("command"), manifest.get("cwd")
    if not (isinstance(command, list) and all(isinstance(a, str) for a in command) and isinstance(cwd, str)):
        return "its mark does not match its command and directory"
    try:
        expected = _digest(key, command, cwd)
    except (ValueError, UnicodeError):
        return "its mark does not match its command and directory"
    if not given.isascii() or not hmac.compare_digest(expected, given):
        return (
            "its mark does not match its command and directory (edited after `ddpdoctor trace` wrote it, or marked "
            "with another user's key)"
        )
    return None
