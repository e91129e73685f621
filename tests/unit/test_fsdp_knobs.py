"""The fsdp.* knobs (`trace --set`, `try`): every fully_shard(...) call of the script gets the setting, wherever the
script imports fully_shard from; what the script passed itself is overridden; uninstall restores torch's own."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from ddpdoctor.capture import knobs as capture_knobs


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _group(module: nn.Module):  # noqa: ANN202 - FSDP2's parameter group of a fully_shard'ed module
    return module._get_fsdp_state()._fsdp_param_group


def test_fsdp_knobs_reach_every_fully_shard_call(one_rank_group: None) -> None:
    import torch.distributed.fsdp as fsdp

    original = fsdp.fully_shard
    applier = capture_knobs.install({"fsdp.reshard_after_forward": "false", "fsdp.param_dtype": "bfloat16"})
    try:
        from torch.distributed._composable.fsdp import fully_shard as composable
        from torch.distributed.fsdp import fully_shard

        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        fully_shard(model[0], reshard_after_forward=True)  # the script's own setting is overridden
        composable(model)
        assert fsdp.fully_shard is not original
    finally:
        capture_knobs.uninstall()
    assert fsdp.fully_shard is original
    for module in (model[0], model):
        assert _group(module).post_forward_mesh_info is None  # not resharded after forward
        assert _group(module).mp_policy.param_dtype == torch.bfloat16
    report = applier.to_json()
    assert report["fsdp.reshard_after_forward"] == {"value": "false", "applied": 2, "reason": None}
    assert report["fsdp.param_dtype"]["applied"] == 2


def test_without_fully_shard_the_knob_says_why_it_did_not_apply() -> None:
    applier = capture_knobs.install({"fsdp.reshard_after_forward": "false"})
    capture_knobs.uninstall()
    report = applier.to_json()["fsdp.reshard_after_forward"]
    assert report["applied"] == 0
    assert report["reason"] == "the job calls no torch.distributed.fsdp.fully_shard (FSDP2)"
