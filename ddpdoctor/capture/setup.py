"""Observations of the DDP set-up (no code change in the script): data loaders and samplers, ``set_epoch``,
gradient all-reduce rounds per optimizer step, ``torch.cuda.set_device``, BatchNorm in DDP models.

Everything here is bookkeeping on calls the script makes anyway; nothing iterates a sampler itself (that would change
the script's data order). The one extra call: once per DataLoader, the content of a map-style dataset at fixed
indices (``ddpdoctor.capture.data_digest``), with every random generator's state restored afterwards, so that ranks
reading the same data can be told from ranks reading their own shards of equal length.
"""

from __future__ import annotations

import hashlib
import os
import types
import weakref
from typing import Any

from ddpdoctor.capture import compiled
from ddpdoctor.capture import ddp as ddp_capture
from ddpdoctor.capture.data_digest import content_digests, digest
from ddpdoctor.capture.invisible import invisible

_FIRST_BATCHES = 4  # index batches per epoch hashed to compare what ranks read
_BN_FORWARDS = 8  # training forwards of a DDP model whose BatchNorm layers' modes are looked at


class SetupObserver:
    def __init__(self) -> None:
        self.loaders: list[dict[str, Any]] = []  # one entry per DataLoader iteration (≈ epoch)
        self.set_epoch_calls: list[int] = []
        self.set_device_calls: list[str] = []
        self.ddp_models: list[dict[str, Any]] = []
        self.sync_rounds: list[int] = []  # gradient all-reduce rounds (DDP forwards with sync) per optimizer step
        self.forwards: list[int] = []  # DDP forwards per optimizer step
        self._sync_since_step = 0
        self._forwards_since_step = 0
        # the DDP module of the last round and its first trainable parameter's gradient at that round's forward
        # (a weak reference; None: no gradient then): whether later rounds summed into it (_rounds_kept)
        self._round_module: Any = None
        self._round_grad: Any = None
        self._patches: list[tuple[Any, str, Any]] = []
        self._iters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # DDP module (weakly) -> [its ddp_models entry, weak refs to its BatchNorm layers, training forwards seen]
        self._batchnorms: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._fed: dict[str, Any] | None = None  # the pass whose batch came last: the next step's (steps_fed)
        # id(loader) -> (the loader, weakly; its integer and whole content digests), computed once per loader
        self._content: dict[int, tuple[Any, tuple[str | None, str | None]]] = {}
        self.join_contexts = 0  # `with Join([...])` / `with model.join()` entered (uneven inputs shadowed)
        # DDP modules compiled whole (torch.compile(DDP(model))): their forward is DDP's own, unwrapped, and their
        # forwards are counted from the compiled module's eager pre-forward instead (_compiled_forward)
        self._compiled_ddp: weakref.WeakSet = weakref.WeakSet()

    # ---- patching --------------------------------------------------------------------------------------------
    def _patch(self, owner: Any, name: str, wrapper: Any) -> None:
        original = owner.__dict__[name]
        self._patches.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def install(self) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DistributedSampler
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        obs = self

        def wrap_iter_init(original: Any) -> Any:
            def __init__(it: Any, loader: Any) -> None:
                original(it, loader)
                obs._new_epoch(it, loader)

            return invisible(__init__)

        def wrap_next_index(original: Any) -> Any:
            def _next_index(it: Any) -> Any:
                index = original(it)
                obs._saw_index(it, index)
                return index

            return invisible(_next_index)

        def wrap_next(original: Any) -> Any:
            def __next__(it: Any) -> Any:
                try:
                    batch = original(it)
                except StopIteration:
                    obs._exhausted(it)
                    raise
                obs._saw_batch(it, batch)
                return batch

            return invisible(__next__)

        def wrap_set_epoch(original: Any) -> Any:
            def set_epoch(sampler: Any, epoch: int) -> None:
                obs.set_epoch_calls.append(int(epoch))
                return original(sampler, epoch)

            return invisible(set_epoch)

        def wrap_forward(original: Any) -> Any:
            def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
                obs._count_forward(module)
                return original(module, *args, **kwargs)

            return invisible(forward)

        ddp_forward = DDP.__dict__["forward"]

        def compile_target(target: Any) -> None:
            """torch.compile(DDP(model)): dynamo traces DDP's forward, and would stop at ddpdoctor's wrapper of it
            (a frame it never traces: a graph break the bare job does not have). The module gets DDP's own forward
            as an attribute of its own, and its forwards are counted before the compiled module's forward."""
            if isinstance(target, DDP) and "forward" not in vars(target):
                object.__setattr__(target, "forward", types.MethodType(ddp_forward, target))
                obs._compiled_ddp.add(target)

        compiled.on_compile_target(compile_target)
        compiled.on_compiled_forward(self._compiled_forward)

        def wrap_join_enter(original: Any) -> Any:
            def __enter__(join: Any) -> Any:
                obs.join_contexts += 1
                return original(join)

            return invisible(__enter__)

        def wrap_set_device(original: Any) -> Any:
            def set_device(device: Any) -> None:
                obs.set_device_calls.append(str(device))
                return original(device)

            return invisible(set_device)

        self._patch(_BaseDataLoaderIter, "__init__", wrap_iter_init)
        self._patch(_BaseDataLoaderIter, "_next_index", wrap_next_index)
        self._patch(_BaseDataLoaderIter, "__next__", wrap_next)
        self._patch(DistributedSampler, "set_epoch", wrap_set_epoch)
        self._patch(DDP, "forward", wrap_forward)
        try:  # DDP.join() returns a Join too
            from torch.distributed.algorithms.join import Join
        except ImportError:  # pragma: no cover - a torch without it
            Join = None
        if Join is not None and "__enter__" in Join.__dict__:
            self._patch(Join, "__enter__", wrap_join_enter)
        ddp_capture.add_listener(self._saw_ddp)  # DDP's constructor is wrapped once, in capture/ddp.py
        self._patch(torch.cuda, "set_device", wrap_set_device)
        accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6: the device-generic spelling
        for name in ("set_device_index", "set_device_idx"):
            if accelerator is not None and name in accelerator.__dict__:
                self._patch(accelerator, name, wrap_set_device)

    def _count_forward(self, module: Any) -> None:
        import torch

        self._forwards_since_step += 1
        if torch.is_grad_enabled() and self._batchnorms:
            self._batch_stats_layers(module)
        if torch.is_grad_enabled() and getattr(module, "require_backward_grad_sync", True):
            grad = _first_grad(module)
            if self._round_module is not None and self._round_module() is module:
                self._sync_since_step = self._rounds_kept(grad)
            self._sync_since_step += 1
            self._round_module = weakref.ref(module)
            self._round_grad = weakref.ref(grad) if grad is not None else None

    def _rounds_kept(self, grad: Any, at_step: bool = False) -> int:
        """How many of this step's rounds so far still add to the gradients, seeing the round module's first
        trainable gradient now (``grad``) against what it was at the last round's forward:
        - the same tensor, or none then (that round's backward made it): all, accumulated into;
        - none now, at a forward: none, cleared since (``zero_grad()``'s default); at the step: all (that parameter
          got no gradient in this step);
        - another tensor: only the last round's, cleared between its forward and its backward (``loss = model(x);
          opt.zero_grad(); loss.backward()``): earlier rounds were used and thrown away (a SAM-style second pass),
          not summed.
        Gradients zeroed in place (``set_to_none=False``) look accumulated."""
        rounds = self._sync_since_step
        if grad is None:  # (or that parameter gets none: fewer rounds counted, never more)
            return 0 if not at_step else rounds  # at the step: a parameter this step's rounds gave no gradient
        if self._round_grad is None:  # no gradient at the last round's forward: its backward made this one
            return rounds
        return rounds if self._round_grad() is grad else min(rounds, 1)

    def _compiled_forward(self, module: Any) -> None:
        """Before each forward of a compiled module (eagerly): a DDP module compiled whole is counted here."""
        inner = getattr(module, "_orig_mod", None)
        if inner is not None and inner in self._compiled_ddp:
            self._count_forward(inner)

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches.clear()
        ddp_capture.remove_listener(self._saw_ddp)

    # ---- observations ----------------------------------------------------------------------------------------
    def _new_epoch(self, it: Any, loader: Any) -> None:
        from torch.utils.data import IterableDataset, Subset

        dataset = loader.dataset
        iterable = isinstance(dataset, IterableDataset)
        try:
            dataset_len = len(dataset)
        except TypeError:
            dataset_len = None
        root = dataset
        while isinstance(root, Subset):  # a per-rank Subset is a shard of the dataset below it
            root = root.dataset
        try:
            root_len = len(root) if root is not dataset else dataset_len
        except TypeError:
            root_len = None
        try:
            batches = len(loader)
        except TypeError:
            batches = None
        entry = {
            "loader": id(loader),
            "dataset": type(dataset).__name__,
            "dataset_len": dataset_len,
            "root_dataset_len": root_len,
            "iterable": iterable,
            **_sampling(loader, iterable),
            "batches_per_epoch": batches,
            "num_workers": loader.num_workers,
            "pin_memory": loader.pin_memory,
            "persistent_workers": getattr(loader, "persistent_workers", None),
            "batches_yielded": 0,
            # optimizer steps whose last batch before them came from this pass: the training loader's passes feed
            # steps, a validation loader's (rank 0 evaluating alone between epochs) none
            "steps_fed": 0,
            "exhausted": False,  # ran to its end (StopIteration): batches_yielded is the epoch's length
            "first_indices_digest": None,
            "first_batch_digest": None,
            "first_labels_digest": None,
            "content_digest": None,
            "content_full_digest": None,
        }
        if not iterable and dataset_len:
            entry["content_digest"], entry["content_full_digest"] = self._content_of(loader, dataset, dataset_len)
        self.loaders.append(entry)
        self._iters[it] = {"entry": entry, "hash": hashlib.sha1(), "indices_seen": 0}

    def _content_of(self, loader: Any, dataset: Any, length: int) -> tuple[str | None, str | None]:
        """``content_digests`` of ``loader``'s dataset, once per loader: a loader made after another was freed
        can have its id, so the entry holds the loader weakly and is used only while it is that loader."""
        kept = self._content.get(id(loader))
        if kept is not None and kept[0]() is loader:
            return kept[1]
        digests = content_digests(dataset, length)
        try:
            self._content[id(loader)] = (weakref.ref(loader), digests)
        except TypeError:  # a loader class without weak references: computed every pass
            pass
        return digests

    def _saw_index(self, it: Any, index: Any) -> None:
        state = self._iters.get(it)
        if state is None or state["indices_seen"] >= _FIRST_BATCHES or state["entry"]["iterable"]:
            return  # an iterable dataset's "indices" are placeholders (None): nothing to compare
        state["indices_seen"] += 1
        state["hash"].update(repr(index).encode())
        state["entry"]["first_indices_digest"] = state["hash"].hexdigest()[:16]

    def _saw_batch(self, it: Any, batch: Any) -> None:
        state = self._iters.get(it)
        if state is None:
            return
        entry = state["entry"]
        entry["batches_yielded"] += 1
        self._fed = entry
        if entry["batches_yielded"] == 1:
            # Integer tensors (labels, token ids) survive random augmentation: equal across ranks = same
            # samples; different = different data behind the same indices (a dataset sharding by rank itself).
            entry["first_labels_digest"] = digest(batch, integers_only=True)
            if entry["iterable"]:
                # An iterable dataset has no indices: compare what ranks actually got in their first batch.
                entry["first_batch_digest"] = digest(batch)

    def _exhausted(self, it: Any) -> None:
        state = self._iters.get(it)
        if state is not None:
            state["entry"]["exhausted"] = True

    def _saw_ddp(self, module: Any) -> None:
        import torch.nn as nn

        inner = getattr(module, "module", module)
        bn: list[Any] = []
        sync_bn = 0
        for m in inner.modules():
            if isinstance(m, nn.SyncBatchNorm):
                sync_bn += 1
            elif isinstance(m, nn.modules.batchnorm._BatchNorm):
                bn.append(weakref.ref(m))
        params = list(inner.parameters())
        entry = {
            "module": type(inner).__name__,
            "batchnorm_layers": len(bn),
            # of them, those that normalised with the batch's statistics in a training forward (in training mode,
            # or without running statistics): most seen in the first _BN_FORWARDS; a layer put in eval mode for
            # training (frozen BatchNorm: detection and segmentation fine-tuning, mmdet's norm_eval) uses its
            # running statistics and needs no synchronising. None: no training forward seen.
            "batchnorm_batch_stats_layers": None,
            "sync_batchnorm_layers": sync_bn,
            "parameters": sum(p.numel() for p in params),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
            "device": str(params[0].device) if params else None,
        }
        self.ddp_models.append(entry)
        if bn:
            try:
                self._batchnorms[module] = [entry, bn, 0]
            except TypeError:  # a module without weak references: the layers as built, not as used
                pass

    def _batch_stats_layers(self, module: Any) -> None:
        """At a training forward of DDP ``module``: how many of its BatchNorm layers use the batch's statistics."""
        kept = self._batchnorms.get(module)
        if kept is None or kept[2] >= _BN_FORWARDS:
            return
        entry, layers, _ = kept
        kept[2] += 1
        used = sum(1 for ref in layers if (m := ref()) is not None and (m.training or not m.track_running_stats))
        entry["batchnorm_batch_stats_layers"] = max(used, entry["batchnorm_batch_stats_layers"] or 0)

    def on_optimizer_step(self) -> None:
        """Close the counts of one optimizer step (called by the session at each step)."""
        if self._fed is not None:
            self._fed["steps_fed"] += 1
            self._fed = None
        module = self._round_module() if self._round_module is not None else None
        rounds = self._rounds_kept(_first_grad(module), True) if module is not None else self._sync_since_step
        self.sync_rounds.append(rounds)
        self.forwards.append(self._forwards_since_step)
        self._sync_since_step = self._forwards_since_step = 0
        self._round_module = self._round_grad = None

    def to_json(self) -> dict[str, Any]:
        return {
            "data_loaders": self.loaders[-64:],
            "data_loader_epochs": len(self.loaders),
            "set_epoch_calls": self.set_epoch_calls[-1000:],
            "set_device_calls": self.set_device_calls[:16],
            # with a per-rank CUDA_VISIBLE_DEVICES, cuda:0 of two ranks are two different GPUs
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ddp_models": self.ddp_models,
            # histograms {count: number of optimizer steps}: a long run stays small
            "ddp_sync_rounds_per_step": _histogram(self.sync_rounds),
            "ddp_forwards_per_step": _histogram(self.forwards),
            "join_contexts": self.join_contexts,
        }


def _sampler_chain(loader: Any) -> list[Any]:
    """The loader's batch sampler and the samplers inside it, outermost first: ``BatchSampler(sampler)``,
    accelerate's ``BatchSamplerShard(BatchSampler(...))`` and other wrappers that keep theirs in ``batch_sampler``
    or ``sampler``. With a batch_sampler of the user's, ``loader.sampler`` is only a placeholder."""
    chain: list[Any] = []
    node = getattr(loader, "batch_sampler", None) or getattr(loader, "sampler", None)
    while node is not None and len(chain) < 8 and all(node is not seen for seen in chain):
        chain.append(node)
        node = getattr(node, "batch_sampler", None) or getattr(node, "sampler", None)
    return chain


def _sampling(loader: Any, iterable: bool) -> dict[str, Any]:
    """How the loader samples: the sampler that chooses the indices (inside any batch sampler), whether it shards
    by rank (a ``DistributedSampler`` anywhere in the chain, or accelerate's ``BatchSamplerShard`` over several
    processes, as the HF Trainer builds), whether it shuffles, and the batch size (the loader's, else its batch
    sampler's)."""
    from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler

    chain = [] if iterable else _sampler_chain(loader)
    samplers = [n for n in chain if not isinstance(n, BatchSampler) and not hasattr(n, "batch_sampler")]
    leaf = samplers[-1] if samplers else (chain[-1] if chain else None)
    distributed = next((n for n in chain if isinstance(n, DistributedSampler)), None)
    shard = next(
        (n for n in chain if type(n).__name__ == "BatchSamplerShard" and _int_attr(n, "num_processes", 1) > 1), None
    )
    if distributed is not None:
        shuffle = getattr(distributed, "shuffle", None)
    elif isinstance(leaf, RandomSampler):
        shuffle = True
    elif isinstance(leaf, SequentialSampler):
        shuffle = False
    else:
        shuffle = getattr(leaf, "shuffle", None)
    batch_size = loader.batch_size
    if batch_size is None:
        batch_size = next((b for n in chain if isinstance(b := getattr(n, "batch_size", None), int)), None)
    replicas = getattr(distributed, "num_replicas", None) if distributed is not None else None
    if replicas is None and shard is not None:
        replicas = _int_attr(shard, "num_processes", None)
    return {
        "sampler": type(leaf).__name__ if leaf is not None else None,
        "distributed_sampler": distributed is not None or shard is not None,
        "shuffle": shuffle if isinstance(shuffle, bool) else None,
        "sampler_epoch": _int_attr(distributed if distributed is not None else leaf, "epoch", None),
        "sampler_num_replicas": replicas,
        "batch_size": batch_size,
    }


def _int_attr(obj: Any, name: str, default: Any) -> Any:
    value = getattr(obj, name, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _first_grad(module: Any) -> Any:
    """The gradient of the module's first trainable parameter (None: none, or no such parameter)."""
    for param in module.parameters():
        if param.requires_grad:
            return param.grad
    return None


def _histogram(values: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[str(v)] = counts.get(str(v), 0) + 1
    return counts
