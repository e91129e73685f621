"""A process forked from a traced rank gets the signal handling of a bare run (capture/runner.py's
``_untraced_child``): SIGTERM and SIGINT as they were before ddpdoctor's handlers, no wakeup fd into the rank's
signal watcher, and a handler the script set since left alone. A real fork of this process."""

from __future__ import annotations

import json
import os
import signal

import pytest

from ddpdoctor.capture import runner

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_child() -> dict:
    """Fork; the child reports its SIGTERM/SIGINT handlers and wakeup fd, then ends."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            term, sigint = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
            wakeup = signal.set_wakeup_fd(-1)
            report = {
                "term": getattr(term, "__name__", str(term)),
                "int": getattr(sigint, "__name__", str(sigint)),
                "wakeup": wakeup,
            }
            os.write(w, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture
def traced_handlers():
    """The handlers ``runner.run`` puts in, and its wakeup fd; restored after."""
    before_term, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    r, w = os.pipe()
    os.set_blocking(w, False)
    old_fd = signal.set_wakeup_fd(w)
    signal.signal(signal.SIGTERM, runner._on_sigterm)
    signal.signal(signal.SIGINT, runner._on_sigint)
    runner._in_children.update({signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler})
    try:
        yield
    finally:
        runner._in_children.clear()
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGTERM, before_term)
        signal.signal(signal.SIGINT, before_int)
        os.close(r)
        os.close(w)


def test_a_forked_child_gets_the_handlers_of_a_bare_run(traced_handlers):
    child = _in_child()
    assert child == {"term": str(signal.SIG_DFL), "int": "default_int_handler", "wakeup": -1}, child
    # the rank itself keeps its own
    assert signal.getsignal(signal.SIGTERM) is runner._on_sigterm


def test_a_handler_the_script_set_is_left_to_the_child(traced_handlers):
    def checkpoint_on_preemption(signum, frame):
        pass

    signal.signal(signal.SIGTERM, checkpoint_on_preemption)
    child = _in_child()
    assert child["term"] == "checkpoint_on_preemption" and child["int"] == "default_int_handler", child


def test_outside_a_traced_run_a_child_is_left_as_it_is():
    runner._in_children.clear()
    before = signal.getsignal(signal.SIGINT)
    assert _in_child()["int"] == getattr(before, "__name__", str(before))
