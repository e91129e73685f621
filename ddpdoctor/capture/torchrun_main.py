"""torchrun as ``ddpdoctor trace`` runs it: ``python -m ddpdoctor.capture.torchrun_main TORCHRUN_ARGS``.

``torch.distributed.run``'s own ``main``, except for how it ends on SIGTERM or Ctrl-C: its agent stops the ranks (they
write what they captured) and then raises ``SignalException``, which torchrun lets through as a traceback and exit
status 1. Here the process ends quietly by that signal, so that ``ddpdoctor trace`` can end by it too (143 / 130),
as a one-process run does.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
    except SignalException as exc:  # the ranks are already stopped (the agent's shutdown ran before it raised)
        signum = int(exc.sigval)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        raise SystemExit(128 + signum) from None


if __name__ == "__main__":
    main()
