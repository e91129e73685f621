"""Entry point of each rank under torchrun: ``python -m ddpdoctor.capture.rank_main (SCRIPT | -m MODULE) [ARGS]``.

The launcher hands the capture settings over in the ``DDPDOCTOR_CAPTURE`` environment variable.
"""

from __future__ import annotations

import sys

from ddpdoctor.capture import runner
from ddpdoctor.capture.config import CaptureConfig


def main(argv: list[str]) -> int:
    config = CaptureConfig.from_env()
    if config is None:
        print("ddpdoctor: error: rank_main is started by `ddpdoctor trace`, not by hand", file=sys.stderr)
        return 2
    if argv and argv[0] == "-m":
        target = runner.Target("module", argv[1], tuple(argv[2:]))
    else:
        target = runner.Target("script", argv[0], tuple(argv[1:]))
    code = runner.run(target, config, quiet_interrupt=True)  # the launcher reports how each rank ended
    if code < 0:
        runner.die_by_signal(-code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
