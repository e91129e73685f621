"""Apply the knobs of ``trace --set`` (``ddpdoctor.knobs``) inside a rank, through ddpdoctor's own hooks.

- ``ddp.*`` and ``batchnorm.sync``: the keyword arguments of every ``DistributedDataParallel(...)`` the script
  builds are overridden (the model handed to it is converted to SyncBatchNorm first), and the compression comm
  hook registered right after it is built. Installed after ``capture/ddp.py``'s own constructor wrapper, so this
  wrapper is the outer one and DDP's logging data shows the settings that were in force.
- ``loader.*``: the keyword arguments of every ``DataLoader(...)``.
- ``fsdp.*``: the keyword arguments of every ``fully_shard(...)`` call (FSDP2), wherever the script imports it from.
- ``torch.intra_op_threads``: ``torch.set_num_threads`` before the script runs; the script's own calls are ignored.
- ``env.*``: set by ``ddpdoctor trace`` for the whole job; here only checked.

What was applied, and why a knob was not, is reported in the rank file (``knobs``): a knob that applied nowhere
makes ``ddpdoctor try`` call the trial failed with that reason.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from ddpdoctor import knobs as table
from ddpdoctor.capture.invisible import invisible

_active: Applier | None = None
_KNOB_OF = {"forward_sync_buffers": "broadcast_buffers"}  # DDP argument -> the knob that sets it


class Applier:
    def __init__(self, settings: dict[str, str], *, local_world_size: int = 1) -> None:
        cpus = table.cpus_per_rank(local_world_size)
        self.settings = dict(settings)
        self.values = {name: table.parse_value(name, text, cpus_per_rank=cpus) for name, text in settings.items()}
        self.applied: dict[str, int] = {name: 0 for name in settings}
        self.reasons: dict[str, str] = {}
        self._patches: list[tuple[Any, str, Any]] = []

    # ---- install -------------------------------------------------------------------------------------------
    def install(self) -> None:
        import torch

        targets = {table.BY_NAME[name].target for name in self.values}
        if targets & {"ddp", "batchnorm"}:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self._patch(DDP, "__init__", self._wrap_ddp_init)
        if "loader" in targets:
            from torch.utils.data import DataLoader

            self._patch(DataLoader, "__init__", self._wrap_loader_init)
        if "fsdp" in targets:
            self._patch_fully_shard()
        if "torch.intra_op_threads" in self.values:
            torch.set_num_threads(int(self.values["torch.intra_op_threads"]))
            self.applied["torch.intra_op_threads"] = 1
            self._patch(torch, "set_num_threads", self._wrap_set_num_threads)
        if "dp.as_ddp" in self.values:
            from ddpdoctor.capture import as_ddp

            as_ddp.install()
        for name, value in self.values.items():
            if name.startswith("env."):
                var = name.split(".", 1)[1]
                if os.environ.get(var) == str(value):
                    self.applied[name] = 1
                else:
                    self.reasons[name] = f"{var} is {os.environ.get(var)!r} in this rank, not {value!r}"

    def uninstall(self) -> None:
        if "dp.as_ddp" in self.values:
            from ddpdoctor.capture import as_ddp

            as_ddp.uninstall()
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches.clear()

    def _patch(self, owner: Any, name: str, wrapper: Any) -> None:
        original = getattr(owner, name)
        self._patches.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    # ---- the hooks -----------------------------------------------------------------------------------------
    def _wrap_ddp_init(self, original: Any) -> Any:
        signature = _signature(original)
        applier = self

        def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
            args, kwargs = applier._ddp_arguments(signature, ddp, args, kwargs)
            original(ddp, *args, **kwargs)
            hook = applier.values.get("ddp.comm_hook")
            if hook is not None:
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                ddp.register_comm_hook(None, getattr(default_hooks, f"{hook}_compress_hook"))
                applier.applied["ddp.comm_hook"] += 1

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        return invisible(__init__)

    def _ddp_arguments(
        self, signature: inspect.Signature | None, ddp: Any, args: tuple, kwargs: dict
    ) -> tuple[tuple, dict]:
        overrides = {
            name.split(".", 1)[1]: value
            for name, value in self.values.items()
            if name.startswith("ddp.") and name != "ddp.comm_hook"
        }
        if signature is None:  # cannot bind: keyword arguments only
            return args, {**kwargs, **overrides}
        bound = signature.bind(ddp, *args, **kwargs)
        if "broadcast_buffers" in overrides and "forward_sync_buffers" in signature.parameters:
            # torch >= 2.13 spells the per-forward buffer sync forward_sync_buffers (broadcast_buffers is deprecated)
            overrides["forward_sync_buffers"] = overrides.pop("broadcast_buffers")
        for key, value in overrides.items():
            if key not in signature.parameters:
                self.reasons[f"ddp.{_KNOB_OF.get(key, key)}"] = (
                    f"this torch's DistributedDataParallel has no {key} argument"
                )
                continue
            bound.arguments[key] = value
            self.applied[f"ddp.{_KNOB_OF.get(key, key)}"] += 1
        if self.values.get("embedding.sparse") and "module" in bound.arguments:
            self._sparse_embeddings(bound.arguments["module"])
        if self.values.get("batchnorm.sync") and "module" in bound.arguments:
            import torch.nn as nn

            module = bound.arguments["module"]
            layers = sum(
                1
                for m in module.modules()
                if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm)
            )
            if layers:
                bound.arguments["module"] = nn.SyncBatchNorm.convert_sync_batchnorm(module)
                self.applied["batchnorm.sync"] += layers
            else:
                self.reasons["batchnorm.sync"] = "the model handed to DDP has no BatchNorm layer to convert"
        return bound.args[1:], bound.kwargs

    def _sparse_embeddings(self, module: Any) -> None:
        """``embedding.sparse``: sparse gradients for the embeddings of the model DDP is about to wrap."""
        import torch.nn as nn

        tables = [m for m in module.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
        for table_module in tables:
            table_module.sparse = True
        self.applied["embedding.sparse"] += len(tables)
        if not tables:
            self.reasons["embedding.sparse"] = "the model handed to DDP has no nn.Embedding or nn.EmbeddingBag"

    def _wrap_loader_init(self, original: Any) -> Any:
        signature = _signature(original)
        applier = self
        overrides = {name.split(".", 1)[1]: value for name, value in self.values.items() if name.startswith("loader.")}

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            if signature is None:
                kwargs = {**kwargs, **overrides}
            else:
                bound = signature.bind(loader, *args, **kwargs)
                for key, value in overrides.items():
                    if key in signature.parameters:
                        bound.arguments[key] = value
                args, kwargs = bound.args[1:], bound.kwargs
            original(loader, *args, **kwargs)
            for key in overrides:
                applier.applied[f"loader.{key}"] += 1

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        return invisible(__init__)

    def _patch_fully_shard(self) -> None:
        """Wrap ``fully_shard`` wherever a script can import it from (the same function under several names)."""
        import importlib

        try:
            import torch.distributed.fsdp as fsdp
        except ImportError:
            self._fsdp_not_applied("this torch has no FSDP2")
            return
        original = getattr(fsdp, "fully_shard", None)
        if original is None:
            self._fsdp_not_applied("this torch has no fully_shard")
            return
        wrapper = self._wrap_fully_shard(original)
        for name in (
            "torch.distributed.fsdp",
            "torch.distributed.fsdp._fully_shard",
            "torch.distributed.fsdp._fully_shard._fully_shard",
            "torch.distributed._composable.fsdp",
            "torch.distributed._composable.fsdp.fully_shard",
        ):
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            if getattr(module, "fully_shard", None) is original:
                self._patches.append((module, "fully_shard", original))
                module.fully_shard = wrapper

    def _fsdp_not_applied(self, why: str) -> None:
        self.reasons.update(dict.fromkeys([n for n in self.values if n.startswith("fsdp.")], why))

    def _wrap_fully_shard(self, original: Any) -> Any:
        import functools

        signature = _signature(original)
        applier = self

        @functools.wraps(original)  # keeps fully_shard.state and the other attributes contract() gives it
        def fully_shard(*args: Any, **kwargs: Any) -> Any:
            if signature is not None:
                bound = signature.bind(*args, **kwargs)
                if "fsdp.reshard_after_forward" in applier.values and "reshard_after_forward" in signature.parameters:
                    bound.arguments["reshard_after_forward"] = applier.values["fsdp.reshard_after_forward"]
                    applier.applied["fsdp.reshard_after_forward"] += 1
                if "fsdp.param_dtype" in applier.values and "mp_policy" in signature.parameters:
                    import dataclasses

                    import torch
                    from torch.distributed.fsdp import MixedPrecisionPolicy

                    policy = bound.arguments.get("mp_policy") or MixedPrecisionPolicy()
                    dtype = getattr(torch, applier.values["fsdp.param_dtype"])
                    bound.arguments["mp_policy"] = dataclasses.replace(policy, param_dtype=dtype)
                    applier.applied["fsdp.param_dtype"] += 1
                args, kwargs = bound.args, bound.kwargs
            return original(*args, **kwargs)

        return invisible(fully_shard)

    def _wrap_set_num_threads(self, original: Any) -> Any:
        def set_num_threads(n: int) -> None:  # the knob holds the number of threads for the whole run
            return None

        set_num_threads.__wrapped__ = original  # type: ignore[attr-defined]
        return set_num_threads

    # ---- report --------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """knob -> {"value": as given, "applied": how many objects it changed, "reason": why none (or None)}."""
        out = {}
        if "dp.as_ddp" in self.values:
            from ddpdoctor.capture import as_ddp

            self.applied["dp.as_ddp"] = as_ddp.built
        for name, text in self.settings.items():
            applied = self.applied.get(name, 0)
            reason = None
            if not applied:
                reason = self.reasons.get(name) or table.BY_NAME[name].not_applicable
            out[name] = {"value": text, "applied": applied, "reason": reason}
        return out


def _signature(function: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(inspect.unwrap(function))
    except (TypeError, ValueError):
        return None


def install(settings: dict[str, str], *, local_world_size: int = 1) -> Applier:
    """Apply ``settings`` (knob -> value text) in this process until :func:`uninstall`."""
    global _active
    uninstall()
    _active = Applier(settings, local_world_size=local_world_size)
    _active.install()
    return _active


def uninstall() -> None:
    global _active
    if _active is not None:
        _active.uninstall()


def describe() -> dict[str, Any]:
    """What the knobs of this process did (empty without ``--set``)."""
    return _active.to_json() if _active is not None else {}
