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
    config = attempt_config(config)
    if argv and argv[0] == "-m":
        target = runner.Target("module", argv[1], tuple(argv[2:]))
    else:
        target = runner.Target("script", argv[0], tuple(argv[1:]))
    code = runner.run(target, config, quiet_interrupt=True)  # the launcher reports how each rank ended
    if code < 0:
        runner.die_by_signal(-code)
    return code


def attempt_config(config: CaptureConfig, environ: dict[str, str] | None = None) -> CaptureConfig:
    """torchrun may restart the ranks (``--max-restarts N`` > 0): each attempt's ranks write their files into
    ``attempts/attempt<k>/`` of the run directory (k: ``TORCHELASTIC_RESTART_COUNT``), a run directory's layout of
    its own, so no attempt overwrites another's files and none is merged with another's. Without restarts the run
    directory is laid out as before."""
    import dataclasses
    import os

    from ddpdoctor import rundir

    env = os.environ if environ is None else environ
    try:
        restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS") or 0)
        attempt = int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)
    except ValueError:
        return config
    if restarts <= 0 or attempt < 0:
        return config
    out = rundir.attempt_dir(config.out, attempt)
    out.mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(config, out=str(out))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
