"""Set-up metrics: the DDP checklist (sharded data, ``set_epoch``, even batches, ``no_sync`` accumulation, own
GPU per rank, BatchNorm, DataParallel gathers) from what the capture observed (``ranks/rank<R>.json``, key
``"setup"``, written by ``ddpdoctor/capture/setup.py``). Pure functions of the capture dicts; no trace needed.

The *training loader* of a rank is the DataLoader that yielded the most batches (a validation loader or a
``next(iter(loader))`` peek does not count); its passes are the epochs. Epoch *k* of one rank is compared with
epoch *k* of the others: equal first index batches (and equal integer tensors -- labels, token ids -- in the
first batch, when it has any) mean the ranks read the same samples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from ddpdoctor.metrics import catalog

SETUP_RANK_METRICS = catalog.names("rank", "setup")
SETUP_RUN_METRICS = catalog.names("run", "setup")

# Below this many reads of each sample per epoch, coverage alone (without identical batches) is not called
# duplication: a DistributedSampler's padding or drop_last keeps a sharded run near 1.
_MIN_COVERAGE = 1.5


def setup_metrics(
    captures: Mapping[int, Mapping[str, Any]],
) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Per-rank set-up metrics (rank -> {name: value or None}) and run-level ones, from every rank's capture.

    Units: counts, flags, ``epoch_dataset_share`` ratio (0-1, more when a sampler oversamples),
    ``dp_gathered_bytes`` bytes per step, ``data_duplication_factor`` x (reads of each sample per epoch).
    """
    epochs = {int(rank): _training_epochs(_setup(c or {})) for rank, c in captures.items()}  # once a rank
    per_rank = {int(rank): rank_setup_metrics(capture, epochs[int(rank)]) for rank, capture in captures.items()}
    shared = _gpu_sharing(captures)
    for rank, metrics in per_rank.items():
        metrics["gpu_shared_ranks"] = shared.get(rank)
    factor, why = _duplication(epochs, per_rank)
    detected = steps_detected(captures)
    run: dict[str, Any] = {
        "data_duplication_factor": factor,
        "steps_detected": detected,
        "uneven_idle_summary": _idle_summary(per_rank),
    }
    not_measured: dict[str, str] = {"data_duplication_factor": why} if why else {}
    if detected is False:
        run["notes"] = [NO_STEP_NOTE]
    for name, reason in _why_unmeasured(captures, per_rank, detected, epochs).items():
        not_measured.setdefault(name, reason)
    if not_measured:
        run["not_measured"] = not_measured
    return per_rank, run


def _idle_summary(per_rank: Mapping[int, Mapping[str, Any]]) -> str | None:
    """With uneven batches per epoch: which ranks run out first and the share of each epoch they wait (shadowing
    the others' collectives under Join), e.g. "rank 0, for about 11% of each epoch (1 of 9 steps)"."""
    batches = {r: b for r, m in per_rank.items() if isinstance(b := m.get("batches_per_epoch"), int) and b > 0}
    if len(batches) < 2 or max(batches.values()) == min(batches.values()):
        return None
    most, least = max(batches.values()), min(batches.values())
    idle = sorted(r for r, b in batches.items() if b == least)
    who = f"rank {idle[0]}" if len(idle) == 1 else "ranks " + ", ".join(map(str, idle))
    return f"{who}, for about {100 * (most - least) / most:.0f}% of each epoch ({most - least} of {most} steps)"


# A run where no rank saw a training step: the profiler recorded the start of the run as one window.
NO_STEP_NOTE = (
    "no training step was detected (no torch.optim optimizer stepped and ddpdoctor.step() was never called): the "
    "trace is the start of the run recorded as one window, not chosen steps, so the 'per step' times are that "
    "whole window's and no timing rule is evaluated; call ddpdoctor.step() once at the end of every training "
    "step (import ddpdoctor; it does nothing outside `ddpdoctor trace`) and trace again"
)
NO_STEP_REASON = (
    "no training step was detected, so its per-step times are of one recorded window (start-up included), not of "
    "steps; call ddpdoctor.step() at the end of every training step and trace again"
)


def steps_detected(captures: Mapping[int, Mapping[str, Any]]) -> bool | None:
    """Whether any rank saw a training step (an optimizer step or ``ddpdoctor.step()``); None when no capture
    says (a plain torch.profiler trace)."""
    seen = [
        (_int(steps.get("count")) or 0) > 0 or steps.get("source") not in (None, "none")
        for c in captures.values()
        if isinstance(c, Mapping) and isinstance(steps := c.get("steps"), Mapping)
    ]
    return any(seen) if seen else None


def _why_unmeasured(
    captures: Mapping[int, Mapping[str, Any]],
    per_rank: Mapping[int, Mapping[str, Any]],
    detected: bool | None,
    epochs: Mapping[int, list[dict[str, Any]]],
) -> dict[str, str]:
    """The true reason for set-up metrics that are None although their source was observed (the catalog's
    generic reason would be false): a DDP model without optimizer steps, a loader without a batch size."""
    out: dict[str, str] = {}
    has_ddp = any(_setup(c).get("ddp_models") for c in captures.values() if isinstance(c, Mapping))
    if has_ddp and detected is False:
        out["ddp_sync_rounds_per_step"] = out["ddp_forwards_per_step"] = (
            "the job uses DDP, but no training step was detected, so DDP's all-reduce rounds per step cannot be "
            "counted; call ddpdoctor.step() at the end of every training step and trace again"
        )
    models = [len(_setup(c).get("ddp_models") or []) for c in captures.values() if isinstance(c, Mapping)]
    several = max(models, default=0)
    if several > 1:
        out["ddp_sync_rounds_per_step"] = out["ddp_forwards_per_step"] = (
            f"the job built {several} DDP models (a GAN's generator and discriminator, a teacher and a student):"
            " the forwards counted over all of them say nothing of how often each one all-reduced per step, and a"
            " second model's round is no micro-batch of the first"
        )
    if any(epochs.values()) and all(m.get("batch_size") is None for m in per_rank.values()):
        out["batch_size"] = (
            "the training DataLoader was observed, but its batch size is unknown (a batch_sampler without a "
            "batch_size attribute)"
        )
    return out


def rank_setup_metrics(capture: Mapping[str, Any] | None, epochs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One rank's set-up metrics (``gpu_shared_ranks`` needs the other ranks: None here). ``epochs``: its
    ``_training_epochs``, when the caller has them."""
    capture = capture or {}
    setup = _setup(capture)
    out: dict[str, Any] = dict.fromkeys(SETUP_RANK_METRICS)
    out.update(_loader_metrics(setup, epochs))
    if "join_contexts" in setup:
        out["join_used"] = bool(_int(setup.get("join_contexts")))
    steps = capture.get("steps")
    if isinstance(steps, dict) and _int(steps.get("count")) is not None:
        out["steps_run"] = _int(steps.get("count"))
    out["run_collectives"] = _int(capture.get("run_collectives"))
    out["training_collectives"] = _int(capture.get("training_collectives"))
    out["training_collective_bytes"] = _int(capture.get("training_collective_bytes"))
    models = [m for m in setup.get("ddp_models") or [] if isinstance(m, dict)]
    if len(models) == 1:  # several DDP models (a GAN's two): the forwards counted over all of them are no rounds
        out["ddp_sync_rounds_per_step"] = _histogram_median(setup.get("ddp_sync_rounds_per_step"))
        out["ddp_forwards_per_step"] = _histogram_median(setup.get("ddp_forwards_per_step"))
    if models:
        # the layers that normalised with the batch's statistics in training forwards, where seen (frozen layers,
        # in eval mode, use their running statistics); else every BatchNorm layer (a capture before 2026-12-07)
        out["ddp_batchnorm_layers"] = sum(
            next(
                (n for k in ("batchnorm_batch_stats_layers", "batchnorm_layers") if (n := _int(m.get(k))) is not None),
                0,
            )
            for m in models
        )
        out["ddp_sync_batchnorm_layers"] = sum(_int(m.get("sync_batchnorm_layers")) or 0 for m in models)
    device = compute_device(capture)
    current = capture.get("device")
    if (device or "").startswith("cuda") or (isinstance(current, str) and current.startswith("cuda")):
        calls = setup.get("set_device_calls")
        out["set_device_calls"] = len(calls) if isinstance(calls, list) else None
        if device and isinstance(current, str) and current.startswith("cuda"):
            out["current_device_mismatch"] = _index(device) != _index(current)
    gathered = [
        s["gathered_bytes"]
        for s in capture.get("dp_steps") or []
        if isinstance(s, dict) and isinstance(s.get("gathered_bytes"), (int, float))
    ]
    out["dp_gathered_bytes"] = sum(gathered) / len(gathered) if gathered else None
    return out


def compute_device(capture: Mapping[str, Any] | None) -> str | None:
    """``"cuda:N"`` the rank's DDP model lives on (None without a CUDA DDP model).

    ``torch.cuda.current_device()`` (the capture's ``device``) stays cuda:0 in a rank that never calls
    ``torch.cuda.set_device`` even when it computes on another GPU; the model's device is where it computes.
    """
    for model in _setup(capture or {}).get("ddp_models") or []:
        device = model.get("device") if isinstance(model, dict) else None
        if isinstance(device, str) and device.startswith("cuda"):
            return device if ":" in device else f"{device}:0"
    return None


# ---------------------------------------------------------------------------------------------- data loaders
def _setup(capture: Mapping[str, Any]) -> Mapping[str, Any]:
    setup = capture.get("setup")
    return setup if isinstance(setup, dict) else {}


def _training_epochs(setup: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The passes over the training loader, in order: the loader whose batches fed the most optimizer steps
    (``steps_fed``: a validation loader that rank 0 alone iterates between epochs feeds none, however many
    batches it yields), then the one that yielded the most batches (captures before 2026-12-07 have no
    ``steps_fed``)."""
    passes = [e for e in setup.get("data_loaders") or [] if isinstance(e, dict)]
    if not passes:
        return []
    fed: Counter[Any] = Counter()
    yielded: Counter[Any] = Counter()
    for e in passes:
        fed[e.get("loader")] += _int(e.get("steps_fed")) or 0
        yielded[e.get("loader")] += _int(e.get("batches_yielded")) or 0
    loader = max(yielded, key=lambda k: (fed[k], yielded[k], -_first_seen(passes, k)))
    return [e for e in passes if e.get("loader") == loader]


def _first_seen(passes: list[dict[str, Any]], loader: Any) -> int:
    return next(i for i, e in enumerate(passes) if e.get("loader") == loader)


def _loader_metrics(setup: Mapping[str, Any], epochs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    epochs = _training_epochs(setup) if epochs is None else epochs
    if not epochs:
        return {}
    first = epochs[0]
    shuffle = first.get("shuffle")
    orders = [None if e.get("iterable") else e.get("first_indices_digest") for e in epochs]
    repeats = sum(1 for a, b in zip(orders, orders[1:], strict=False) if a is not None and a == b)
    batches = _epoch_batches(epochs)
    batch_size = _int(first.get("batch_size"))
    dataset_len = _int(first.get("dataset_len"))
    root_len = _int(first.get("root_dataset_len", dataset_len))
    samples = batches * batch_size if batches and batch_size else None
    if samples is not None and dataset_len:
        samples = min(samples, dataset_len)  # the last batch of a pass may be partial
    calls = setup.get("set_epoch_calls")
    persistent = first.get("persistent_workers")
    return {
        "distributed_sampler": bool(first.get("distributed_sampler")),
        "sampler_shuffle": shuffle if isinstance(shuffle, bool) else None,
        "dataloader_epochs": len(epochs),
        "epochs_repeating_order": repeats,
        "set_epoch_calls": len(calls) if isinstance(calls, list) else None,
        "batches_per_epoch": batches,
        "batch_size": batch_size,
        "dataloader_workers": _int(first.get("num_workers")),
        "dataloader_persistent_workers": persistent if isinstance(persistent, bool) else None,
        "epoch_dataset_share": samples / root_len if samples and root_len else None,
    }


def _epoch_batches(epochs: list[dict[str, Any]]) -> int | None:
    """Batches in one epoch: what a pass that ran to its end yielded (iterable datasets may not know their
    length), else ``len(loader)``."""
    for e in epochs:
        if e.get("exhausted") and _int(e.get("batches_yielded")) is not None:
            return _int(e.get("batches_yielded"))
    return next((_int(e.get("batches_per_epoch")) for e in epochs if _int(e.get("batches_per_epoch"))), None)


def _sample_key(entry: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What identifies the samples a pass starts with, on evidence of content: an iterable dataset's first batch;
    a map-style one's first index batches with the integers of its first batch (labels, token ids) or, without
    them, of the dataset at fixed indices, and the dataset's whole content there (``content_full_digest``: equal
    integers over different data, a dataset sharding by rank whose items hold a local index, are not the same
    samples). None when there is no content to compare (equal indices over per-rank datasets of the same length
    are not the same samples)."""
    if entry.get("iterable"):
        digest = entry.get("first_batch_digest")
        return None if digest is None else (digest, None, None)
    order = entry.get("first_indices_digest")
    content = entry.get("first_labels_digest") or entry.get("content_digest")
    whole = entry.get("content_full_digest")
    return None if order is None or (content is None and whole is None) else (order, content, whole)


_UNDECIDED_ORDER = (
    "ranks start their epochs with the same indices, but neither their batches nor their datasets hold integers "
    "(labels, token ids) to compare, and their datasets' items read differently twice at the same seeds (randomness "
    "the seeds do not reach) or could not be read: the same data cannot be told from per-rank data of the same length"
)
_UNDECIDED_COVERAGE = (
    "every rank iterates a whole dataset of the same length without a DistributedSampler, in its own order, but "
    "the datasets' content could not be compared (no integers at fixed indices of a map-style dataset, and items "
    "that read differently twice at the same seeds or could not be read): the same data cannot be told from "
    "per-rank shards of the same length"
)


def _duplication(
    epochs: dict[int, list[dict[str, Any]]], per_rank: dict[int, dict[str, Any]]
) -> tuple[float | None, str | None]:
    """How many times each sample is read per epoch across the job (1 = every rank reads its own shard), and why
    it is None when the data cannot decide.

    Only positive evidence counts: the largest group of ranks whose epoch starts with the same samples (same
    indices and same content); or, when no rank uses a DistributedSampler and every rank iterates (nearly) its
    whole dataset, the number of dataset passes the ranks make together per epoch -- if their datasets hold the
    same content at fixed indices.
    """
    with_data = {r: e for r, e in epochs.items() if e}
    if not with_data:
        return None, None
    identical = 1
    undecided_order = False
    for k in range(min(len(e) for e in with_data.values())):
        keys = Counter(key for e in with_data.values() if (key := _sample_key(e[k])) is not None)
        identical = max([identical, *keys.values()])
        orders = Counter(e[k].get("first_indices_digest") for e in with_data.values() if _sample_key(e[k]) is None)
        undecided_order |= any(n > 1 for o, n in orders.items() if o is not None)
    coverage = _coverage(with_data, per_rank)
    if coverage == "undecided":
        return (float(identical), None) if identical > 1 else (None, _UNDECIDED_COVERAGE)
    if identical == 1 and undecided_order:
        return None, _UNDECIDED_ORDER
    return float(max(identical, coverage if coverage is not None and coverage >= _MIN_COVERAGE else 1)), None


def _coverage(epochs: dict[int, list[dict[str, Any]]], per_rank: dict[int, dict[str, Any]]) -> float | str | None:
    """The ranks' dataset passes per epoch summed, when they hold the same data; None when they do not (or use a
    DistributedSampler); "undecided" when they might."""
    shares = [per_rank.get(r, {}).get("epoch_dataset_share") for r in epochs]
    firsts = [e[0] for e in epochs.values()]
    if len(firsts) < 2 or any(s is None for s in shares) or any(f.get("distributed_sampler") for f in firsts):
        return None
    if len({f.get("root_dataset_len", f.get("dataset_len")) for f in firsts}) != 1:
        return None  # different datasets per rank: not copies of one
    # Same first indices but different labels: each rank has its own data behind the same indices.
    by_order: dict[Any, set[Any]] = {}
    for f in firsts:
        if f.get("first_indices_digest") and f.get("first_labels_digest"):
            by_order.setdefault(f["first_indices_digest"], set()).add(f["first_labels_digest"])
    if any(len(labels) > 1 for labels in by_order.values()):
        return None
    # The datasets' whole content at fixed indices differs: each rank its own data, whatever their integers say.
    whole = {f.get("content_full_digest") for f in firsts}
    if None not in whole and len(whole) > 1:
        return None
    total = round(sum(shares), 2)
    if total < _MIN_COVERAGE:
        return total
    content = {f.get("content_digest") for f in firsts}
    if None in content:
        return total if None not in whole else "undecided"  # (one whole content on every rank: the same data)
    return total if len(content) == 1 else None  # different content at the same indices: each rank its own data


# ------------------------------------------------------------------------------------------------------- GPUs
def _gpu_sharing(captures: Mapping[int, Mapping[str, Any]]) -> dict[int, int]:
    """rank -> number of ranks (itself included) computing on the same physical GPU of the same host."""
    keys: dict[int, tuple[Any, str]] = {}
    for rank, capture in captures.items():
        device = compute_device(capture)
        if device is None:
            continue
        index = _index(device)
        visible = _setup(capture).get("cuda_visible_devices")
        physical = str(index)
        if isinstance(visible, str) and visible.strip():
            ids = [v.strip() for v in visible.split(",") if v.strip()]
            physical = ids[index] if index is not None and index < len(ids) else physical
        keys[int(rank)] = (capture.get("hostname"), physical)
    counts = Counter(keys.values())
    return {rank: counts[key] for rank, key in keys.items()}


def _index(device: str) -> int | None:
    tail = device.partition(":")[2]
    return int(tail) if tail.isdigit() else 0 if device == "cuda" else None


# ------------------------------------------------------------------------------------------------------ small
def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _histogram_median(histogram: Any) -> float | None:
    """Median of a ``{value: number of steps}`` histogram (the typical step; start-up does not skew it)."""
    if not isinstance(histogram, dict):
        return None
    pairs = sorted(
        (int(k), int(n)) for k, n in histogram.items() if str(k).lstrip("-").isdigit() and isinstance(n, int)
    )
    total = sum(n for _, n in pairs)
    if total <= 0:
        return None
    seen = 0
    for value, n in pairs:
        seen += n
        if seen * 2 >= total:
            return float(value)
    return None
