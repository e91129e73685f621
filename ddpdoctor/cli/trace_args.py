"""The command line of ``ddpdoctor trace``: its own options, torchrun's options (taken from torchrun's own parser),
and where the script and its arguments begin. ``trace`` parses its argv itself: everything after the script
belongs to the script."""

from __future__ import annotations

import argparse
import os

from ddpdoctor.cli.argtypes import count, seconds
from ddpdoctor.errors import UsageError

_TORCHRUN_SKIP = {"-h", "--help", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path"}


class _Parser(argparse.ArgumentParser):
    """Errors as one line (``UsageError``), not argparse's usage text and exit: ``trace`` prints it, and
    ``ddpdoctor try`` checks a recorded command with this parser without printing anything."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `ddpdoctor trace --help`)")


HANG_OFF = 0.0  # --hang-timeout off (or 0): no watchdog


def _hang_timeout(text: str) -> float:
    """``--hang-timeout``: seconds (above 0, in range), or ``off``/``0`` for no watchdog (:data:`HANG_OFF`)."""
    if text.strip().lower() in ("off", "0", "none"):
        return HANG_OFF
    try:
        return seconds()(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace(", not ", ", or off, not ", 1)) from None


def _every(text: str) -> tuple[str, float]:
    from ddpdoctor.capture.every import parse_every

    return parse_every(text)


def _metrics_address(text: str) -> tuple[str, int]:
    from ddpdoctor.export.prometheus import parse_address

    try:
        return parse_address(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--metrics-port {text}: ")) from None


def _own_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="ddpdoctor trace",
        usage="ddpdoctor trace [OPTIONS] [TORCHRUN OPTIONS] (SCRIPT | -m MODULE) [ARGS...]\n"
        "       ddpdoctor trace [OPTIONS] -- COMMAND [ARGS...]",
        description="Run an unmodified training script under torch.profiler and write a run directory. "
        "With any torchrun option (e.g. --nproc-per-node 4) the script is launched by torchrun, one traced "
        "process per rank. Ranks the script starts itself (mp.spawn, Lightning) are traced too. Started by a "
        "scheduler as one rank (RANK/WORLD_SIZE or SLURM variables set), it traces that rank into the shared --out. "
        "After --, any launcher command (accelerate launch, python -m torch.distributed.launch, bash run.sh, ...) runs "
        "with every rank it starts traced.",
        add_help=False,
    )
    g = p.add_argument_group("ddpdoctor options")
    g.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    g.add_argument("--out", "-o", metavar="DIR", help="run directory (default: ddpdoctor-runs/<script>-<time>)")
    g.add_argument("--force", action="store_true", help="replace ddpdoctor's files in an existing run directory")
    g.add_argument(
        "--wait",
        type=count(0),
        default=5,
        metavar="N",
        help="steps run before the profiler starts (default 5); the window is steps WAIT+WARMUP+1 to "
        "WAIT+WARMUP+ACTIVE, counting from 1: 8-12 with the defaults",
    )
    g.add_argument("--warmup", type=count(0), default=2, metavar="N", help="profiler warm-up steps (default 2)")
    g.add_argument("--active", type=count(1), default=5, metavar="N", help="steps recorded per window (default 5)")
    g.add_argument(
        "--repeat",
        type=count(0),
        default=None,
        metavar="N",
        help="number of windows, 0 = until the end (default 1; with --every, 0)",
    )
    g.add_argument(
        "--every",
        type=_every,
        default=None,
        metavar="STEPS|DURATION",
        help="take a window regularly through the whole run: every STEPS steps (e.g. 200) or every DURATION "
        "(e.g. 30s, 10m, 1h); the first starts after --wait",
    )
    g.add_argument(
        "--keep",
        type=count(1),
        default=None,
        metavar="N",
        help="keep the traces of the newest N windows per rank, removing older ones once summarised for Over time "
        "(disk bounded; default: all)",
    )
    g.add_argument("--with-stack", action="store_true", help="record Python stacks (larger traces)")
    g.add_argument("--no-record-shapes", action="store_true", help="do not record operator input shapes")
    g.add_argument("--no-profile-memory", action="store_true", help="do not record allocator events")
    g.add_argument(
        "--all-threads",
        choices=("auto", "on", "off"),
        default="auto",
        help="record every thread (auto: in one-process runs, for DataParallel's replica threads; torch 2.13 then "
        "leaves allocator events out of the trace)",
    )
    g.add_argument("--no-gil", action="store_true", help="do not measure GIL contention")
    g.add_argument(
        "--no-step-limit",
        type=seconds(),
        default=60.0,
        metavar="SECONDS",
        help="when no step is ever seen, record the run's first SECONDS (default 60)",
    )
    g.add_argument(
        "--hang-timeout",
        type=_hang_timeout,
        default=None,
        metavar="SECONDS",
        help="no step for SECONDS (after the first): every rank dumps, the cause is named and the job stopped "
        "(default: 300 s or 10x the slowest step, reported, and stopped only on a desync or a dead peer in the "
        "dumps; off: never)",
    )
    g.add_argument(
        "--max-steps",
        type=count(1),
        default=None,
        metavar="N",
        help="end the job cleanly after N training steps, every rank at the same step (exit 0)",
    )
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="apply a knob through ddpdoctor's hooks, no code change (e.g. ddp.bucket_cap_mb=25; "
        "the table: README 'Try the prescription')",
    )
    g.add_argument(
        "--metrics-port",
        type=_metrics_address,
        default=None,
        metavar="[HOST:]PORT",
        help="serve each rank's step metrics for Prometheus on PORT + local rank (HOST default 127.0.0.1; "
        "needs prometheus_client)",
    )
    g.add_argument(
        "--metrics-textfile",
        default=None,
        metavar="DIR",
        help="write each rank's step metrics every second to DIR/ddpdoctor_rank<R>.prom (node_exporter's "
        "textfile collector; needs prometheus_client)",
    )
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="ddpdoctor prints nothing but errors, and torch's launch noise is kept out of the terminal: torchrun's "
        "warnings go to the run directory's nodes/node<K>.log, torch's C++ warnings are off (TORCH_CPP_LOG_LEVEL=ERROR "
        "unless set); what the job itself prints is shown as always",
    )
    return p


# torchrun's options as torch 2.13's own parser defines them (option string -> takes a value), so that splitting the
# command line does not import torch: in the launcher that import alone took 1-2 s of every traced run, before
# any rank started. An option not in this table is looked up in the installed torch's parser (a newer torchrun's
# options still pass through); tests/unit/test_trace_args.py checks the table against that parser.
_TORCHRUN_FLAGS = ("--standalone", "--virtual-local-rank", "--virtual_local_rank")
_TORCHRUN_VALUED = (
    "--nnodes --nproc-per-node --nproc_per_node --rdzv-backend --rdzv_backend --rdzv-endpoint --rdzv_endpoint "
    "--rdzv-id --rdzv_id --rdzv-conf --rdzv_conf --max-restarts --max_restarts --monitor-interval "
    "--monitor_interval --start-method --start_method --event-log-handler --event_log_handler --role --log-dir "
    "--log_dir -r --redirects -t --tee --local-ranks-filter --local_ranks_filter --duplicate-stdout-filters "
    "--duplicate_stdout_filters --duplicate-stderr-filters --duplicate_stderr_filters --node-rank --node_rank "
    "--master-addr --master_addr --master-port --master_port --local-addr --local_addr --logs-specs --logs_specs "
    "--numa-binding --numa_binding --signals-to-handle --signals_to_handle --shutdown-timeout --shutdown_timeout"
).split()
TORCHRUN_KNOWN: dict[str, bool] = {**dict.fromkeys(_TORCHRUN_FLAGS, False), **dict.fromkeys(_TORCHRUN_VALUED, True)}


def _torchrun_options() -> dict[str, bool]:
    """Option string -> takes a value, from torchrun's own parser (so every torchrun flag passes through)."""
    from torch.distributed.run import get_args_parser

    options: dict[str, bool] = {}
    for action in get_args_parser()._actions:
        for opt in action.option_strings:
            if opt not in _TORCHRUN_SKIP:
                options[opt] = action.nargs != 0
    return options


def split_argv(argv: list[str]) -> tuple[list[str], list[str], list[str], list[str] | None]:
    """Split into (ddpdoctor options, torchrun options, target, command): target is [SCRIPT, args] or
    [-m, MOD, args]; command is what follows ``--`` (None without one). ``-- train.py`` (a Python file) and
    ``-- -m MOD`` still name the target."""
    own_takes_value = {}
    for action in _own_parser()._actions:
        for opt in action.option_strings:
            own_takes_value[opt] = action.nargs != 0
    torchrun: dict[str, bool] = TORCHRUN_KNOWN
    own: list[str] = []
    tr: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            rest = argv[i + 1 :]
            if not rest:
                raise UsageError("no command after --: ddpdoctor trace [OPTIONS] -- COMMAND [ARGS...]")
            if rest[0] in ("-m", "--module") or (rest[0].endswith(".py") and os.path.isfile(rest[0])):
                return own, tr, ["-m", *rest[1:]] if rest[0] == "--module" else rest, None
            return own, tr, [], rest
        if tok in ("-m", "--module"):
            if i + 1 >= len(argv):
                raise UsageError("-m needs a module name")
            return own, tr, ["-m", *argv[i + 1 :]], None
        if not tok.startswith("-") or tok == "-":
            return own, tr, argv[i:], None
        name = tok.split("=", 1)[0]
        if name not in own_takes_value and name not in torchrun and torchrun is TORCHRUN_KNOWN:
            torchrun = _torchrun_options()  # not in the table: the installed torchrun may know it
        if name in own_takes_value:
            bucket, takes_value = own, own_takes_value[name]
        elif name in torchrun:
            bucket, takes_value = tr, torchrun[name]
        else:
            raise UsageError(
                f"unknown option {name!r} (ddpdoctor and torchrun options go before the script; "
                "see `ddpdoctor trace --help`)"
            )
        bucket.append(tok)
        if takes_value and "=" not in tok:
            if i + 1 >= len(argv):
                raise UsageError(f"option {name} needs a value")
            bucket.append(argv[i + 1])
            i += 1
        i += 1
    return own, tr, [], None


def _parse_own(own: list[str]) -> argparse.Namespace:
    """trace's own options, checked (numbers in range, knobs known); ``UsageError`` in one line otherwise."""
    args = _own_parser().parse_args(own)
    from ddpdoctor import knobs

    args.knobs = knobs.parse_settings(args.set)
    if args.metrics_port is not None or args.metrics_textfile is not None:
        from ddpdoctor.export.prometheus import require_client

        require_client()
        if args.metrics_textfile is not None and not os.path.isdir(args.metrics_textfile):
            raise UsageError(f"--metrics-textfile {args.metrics_textfile}: not a directory")
    args.every_steps = args.every_s = None
    if args.every is not None:
        kind, value = args.every
        if kind == "steps":
            args.every_steps = int(value)
            if args.every_steps < args.warmup + args.active:
                raise UsageError(
                    f"--every {args.every_steps}: a window takes {args.warmup + args.active} steps (--warmup "
                    f"{args.warmup} + --active {args.active}); give at least that many steps"
                )
        else:
            args.every_s = value
    if args.repeat is None:
        args.repeat = 0 if args.every is not None else 1
    return args


parse_own = _parse_own


def _print_help() -> None:
    _own_parser().print_help()
    import textwrap

    names = " ".join(sorted(o for o in _torchrun_options() if o.startswith("--") and "_" not in o))
    print("\ntorchrun options (passed to torch.distributed.run unchanged):")
    print(textwrap.fill(names, width=100, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False))
