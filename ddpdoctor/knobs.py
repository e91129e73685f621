"""The knobs ddpdoctor can turn in a training job without a code change (``trace --set``, ``try --set``).

One table, :data:`KNOBS`: each knob's name, what it changes in the user's program, whether it changes numerics,
when it does not apply, the values it takes, and the line of code that makes the setting permanent. The capture
applies them through its own hooks (``ddpdoctor.capture.knobs``); rules prescribe them as data (a rule file's
``[[prescriptions]]``); ``ddpdoctor try`` measures them. Pure: no torch import here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ddpdoctor.errors import UsageError

# A value a sweep may name instead of a number: the job's CPU cores per rank (cores // ranks on this node).
CPUS_PER_RANK = "cpus_per_rank"


class KnobError(UsageError):
    """An unknown knob or a value it does not take (one line, exit 2)."""


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ValueError("must be true or false")


# Bounds far above any real setting that keep the value something the job's own code can take (torch's C++
# takes threads as a 64-bit int; DataLoader starts num_workers processes; DDP turns MB into a byte count).
MAX_COUNT = 1024
MAX_BUCKET_MB = 1024 * 1024  # 1 TiB


def _positive_float(maximum: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= maximum):
            raise ValueError(f"must be a number above 0, at most {maximum:.0f}")
        return value

    return parse


def _count(minimum: int, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    def parse(text: str) -> int:
        digits = text.strip()
        # ASCII digits only: the env.* knobs put the text itself in the job's environment ('+4', '٣' are not read)
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 19):
            raise ValueError(f"must be a whole number from {minimum} to {maximum}")
        value = int(digits)
        if not minimum <= value <= maximum:
            raise ValueError(f"must be from {minimum} to {maximum}")
        return value

    return parse


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip().lower() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text.strip().lower()

    return parse


@dataclass(frozen=True)
class Knob:
    """``target``: what must exist in the job for the knob to apply ("ddp": a DistributedDataParallel is built;
    "loader": a DataLoader is built; "fsdp": fully_shard is called (FSDP2); "batchnorm": a DDP model with BatchNorm
    layers; "process": always)."""

    name: str
    changes: str  # what it changes in the user's program
    numerics: str  # "no", or how it changes the numbers the job computes
    not_applicable: str  # when it does not apply
    values: str  # the values it takes, in words
    code: str  # the line that makes it permanent; {value} is the setting
    target: str
    parse: Callable[[str], Any]
    sweep_cpus: bool = False  # "cpus_per_rank" is a value it takes

    def code_line(self, value: Any) -> str:
        return self.code.format(value=_py(value))


def _py(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_NO_DDP = "the job builds no DistributedDataParallel"
_NO_LOADER = "the job builds no torch.utils.data.DataLoader"
_NO_FSDP = "the job calls no torch.distributed.fsdp.fully_shard (FSDP2)"

KNOBS: tuple[Knob, ...] = (
    Knob(
        "ddp.bucket_cap_mb",
        "bucket_cap_mb= of every DistributedDataParallel the script builds: the size of its gradient buckets",
        "no",
        _NO_DDP,
        "a number of MB above 0 (at most 1048576)",
        "DDP(model, ..., bucket_cap_mb={value})",
        "ddp",
        _positive_float(MAX_BUCKET_MB),
    ),
    Knob(
        "ddp.gradient_as_bucket_view",
        "gradient_as_bucket_view= of every DDP: gradients are views into the buckets (no copy)",
        "no",
        _NO_DDP,
        "true | false",
        "DDP(model, ..., gradient_as_bucket_view={value})",
        "ddp",
        _bool,
    ),
    Knob(
        "ddp.static_graph",
        "static_graph= of every DDP: the set of used parameters is declared fixed",
        "no (a job whose used parameters change between steps fails)",
        _NO_DDP,
        "true | false",
        "DDP(model, ..., static_graph={value})",
        "ddp",
        _bool,
    ),
    Knob(
        "ddp.broadcast_buffers",
        "broadcast_buffers= of every DDP (forward_sync_buffers= where torch has it): rank 0's buffers (BatchNorm "
        "statistics) sent to all at each forward",
        "yes when false and the model has buffers: each rank keeps its own running statistics",
        _NO_DDP,
        "true | false",
        "DDP(model, ..., broadcast_buffers={value})",
        "ddp",
        _bool,
    ),
    Knob(
        "ddp.find_unused_parameters",
        "find_unused_parameters= of every DDP: search the autograd graph for unused parameters every step",
        "no (false on a model with unused parameters makes DDP fail)",
        _NO_DDP,
        "true | false",
        "DDP(model, ..., find_unused_parameters={value})",
        "ddp",
        _bool,
    ),
    Knob(
        "ddp.comm_hook",
        "registers torch's built-in compression comm hook on every DDP: gradients all-reduced in fp16 or bf16",
        "yes: gradients are rounded to 16 bits before they are averaged",
        _NO_DDP + " (or the script registers its own comm hook: DDP allows one)",
        "fp16 | bf16",
        "model.register_comm_hook(None, default_hooks.{value}_compress_hook)",
        "ddp",
        _choice("fp16", "bf16"),
    ),
    Knob(
        "embedding.sparse",
        "sparse=True on every nn.Embedding / nn.EmbeddingBag of the model handed to DDP: their gradients hold only "
        "the rows a batch used, and DDP all-reduces those instead of the whole table",
        "no with an optimizer that takes sparse gradients (SGD without weight decay, SparseAdam, Adagrad); one that "
        "does not (Adam, AdamW, weight decay) fails the job's step",
        _NO_DDP + ", or its model has no nn.Embedding / nn.EmbeddingBag",
        "true",
        "nn.Embedding(num_embeddings, dim, sparse={value})  # and an optimizer that takes sparse gradients",
        "ddp",
        _choice("true"),
    ),
    Knob(
        "loader.num_workers",
        "num_workers= of every DataLoader the script builds: worker processes that load batches",
        "no (random augmentations draw from the workers' seeds instead)",
        _NO_LOADER,
        "a whole number from 0 to 1024, or cpus_per_rank",
        "DataLoader(dataset, ..., num_workers={value})",
        "loader",
        _count(0),
        sweep_cpus=True,
    ),
    Knob(
        "loader.pin_memory",
        "pin_memory= of every DataLoader: batches in page-locked memory for faster, asynchronous copies to a GPU",
        "no",
        _NO_LOADER,
        "true | false",
        "DataLoader(dataset, ..., pin_memory={value})",
        "loader",
        _bool,
    ),
    Knob(
        "loader.persistent_workers",
        "persistent_workers= of every DataLoader: workers kept alive between epochs (needs num_workers > 0)",
        "no",
        _NO_LOADER,
        "true | false",
        "DataLoader(dataset, ..., persistent_workers={value})",
        "loader",
        _bool,
    ),
    Knob(
        "loader.prefetch_factor",
        "prefetch_factor= of every DataLoader: batches each worker loads ahead (needs num_workers > 0)",
        "no",
        _NO_LOADER,
        "a whole number from 1 to 1024",
        "DataLoader(dataset, ..., prefetch_factor={value})",
        "loader",
        _count(1),
    ),
    Knob(
        "torch.intra_op_threads",
        "torch.set_num_threads() in every rank before the script runs (the script's own calls are then ignored)",
        "no (sums may be added in another order: last-bit differences)",
        "never (every job has intra-op threads)",
        "a whole number from 1 to 1024, or cpus_per_rank",
        "torch.set_num_threads({value})",
        "process",
        _count(1),
        sweep_cpus=True,
    ),
    Knob(
        "env.OMP_NUM_THREADS",
        "OMP_NUM_THREADS in the environment of every process of the job (torchrun sets 1 when it is unset)",
        "no (sums may be added in another order: last-bit differences)",
        "never",
        "a whole number from 1 to 1024, or cpus_per_rank",
        "OMP_NUM_THREADS={value} torchrun ...",
        "process",
        _count(1),
        sweep_cpus=True,
    ),
    Knob(
        "dp.as_ddp",
        "every nn.DataParallel(...) becomes DistributedDataParallel on the rank's device, each rank running its slice "
        "of the global batch (outputs gathered back); the process group is created for the script. Needs one "
        "process per device: what `ddpdoctor try --as-ddp` runs",
        "no: the same gradient as DataParallel (BatchNorm statistics come from each rank's slice, as from each "
        "replica's)",
        "the job builds no nn.DataParallel, or was not started by torchrun",
        "true",
        "model = DDP(model.to(local_rank), device_ids=[local_rank])  # torchrun, a DistributedSampler, batch / ranks",
        "dp",
        _choice("true"),
    ),
    Knob(
        "batchnorm.sync",
        "nn.SyncBatchNorm.convert_sync_batchnorm() on the model handed to DDP: BatchNorm statistics over all ranks",
        "yes: batch statistics are computed over the global batch, not each rank's",
        "the job builds no DDP, or its model has no BatchNorm layer; SyncBatchNorm needs GPUs",
        "true",
        "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # before DDP(model)",
        "batchnorm",
        _choice("true"),
    ),
    Knob(
        "fsdp.reshard_after_forward",
        "reshard_after_forward= of every fully_shard(...) call (FSDP2): whether a unit's parameters are freed after "
        "its forward and all-gathered again in backward",
        "no",
        _NO_FSDP,
        "true | false",
        "fully_shard(module, ..., reshard_after_forward={value})",
        "fsdp",
        _bool,
    ),
    Knob(
        "fsdp.param_dtype",
        "param_dtype= of the MixedPrecisionPolicy of every fully_shard(...) call (FSDP2): the dtype parameters are "
        "all-gathered and computed in (the policy's other settings kept)",
        "yes: forward and backward compute in that dtype",
        _NO_FSDP,
        "bfloat16 | float16 | float32",
        "fully_shard(module, ..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.{value}))",
        "fsdp",
        _choice("bfloat16", "float16", "float32"),
    ),
)
BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}


def knob(name: str) -> Knob:
    """The knob called ``name``; ``KnobError`` naming the known ones otherwise."""
    found = BY_NAME.get(name.strip())
    if found is None:
        import difflib

        close = difflib.get_close_matches(name, list(BY_NAME), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise KnobError(f"unknown knob {name!r}{hint} (knobs: {', '.join(BY_NAME)})")
    return found


def parse_value(name: str, text: str, *, cpus_per_rank: int | None = None) -> Any:
    """``text`` as a value of knob ``name`` (``cpus_per_rank`` resolved when given); ``KnobError`` if it is not."""
    k = knob(name)
    text = str(text).strip()
    if text == CPUS_PER_RANK and k.sweep_cpus:
        if cpus_per_rank is None:
            return CPUS_PER_RANK
        text = str(cpus_per_rank)
    try:
        return k.parse(text)
    except ValueError as exc:
        raise KnobError(f"{name}={text}: {exc} ({k.values})") from None


def parse_setting(text: str) -> tuple[str, Any]:
    """``"KNOB=VALUE"`` -> (knob name, value as text, checked)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise KnobError(f"--set {text!r}: expected KNOB=VALUE, e.g. ddp.bucket_cap_mb=25")
    parse_value(name.strip(), value)
    return name.strip(), value.strip()


def parse_settings(texts: Iterable[str]) -> dict[str, str]:
    """Several ``KNOB=VALUE`` (a knob given twice is an error): knob name -> value text."""
    out: dict[str, str] = {}
    for text in texts:
        name, value = parse_setting(text)
        if name in out:
            raise KnobError(f"--set {name} is given twice")
        out[name] = value
    return out


def cpus_per_rank(nproc_per_node: int) -> int:
    """CPU cores this node gives each of its ``nproc_per_node`` ranks."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(max(cores // max(nproc_per_node, 1), 1), MAX_COUNT)


def environment(settings: dict[str, str]) -> dict[str, str]:
    """The environment variables the ``env.*`` knobs set for the whole job."""
    return {name.split(".", 1)[1]: value for name, value in settings.items() if name.startswith("env.")}


def table_markdown() -> str:
    """The README's knob table (generated, tested equal)."""
    lines = [
        "| knob | what it changes in your program | changes numerics | does not apply when | values |",
        "|---|---|---|---|---|",
    ]
    for k in KNOBS:
        lines.append(f"| `{k.name}` | {k.changes} | {k.numerics} | {k.not_applicable} | {k.values} |")
    return "\n".join(lines)
