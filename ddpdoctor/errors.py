"""One root error type for everything that is the user's input, not a bug in ddpdoctor.

The CLI prints ``str(error)`` as one line and exits with ``error.exit_code`` (2 unless said otherwise).
"""

from __future__ import annotations


class DDPDoctorError(Exception):
    """A problem with the user's input or environment, reported as one line, never a traceback."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(DDPDoctorError):
    """Bad command-line usage."""


class TraceError(DDPDoctorError):
    """A trace file or run directory that cannot be read; the message names the file."""
