"""The Flight Recorder is turned on in every traced process under the name the rank's torch reads, never over a
value the user set under either name (torch 2.11+ warns once per rank about the old name, so it gets only the new)."""

from __future__ import annotations

import pytest

from ddpdoctor.capture import autostart


def _env(**user):
    env = dict(user)
    autostart.enable_flight_recorder(env)
    return env


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2.13.0+cpu", {"TORCH_FR_BUFFER_SIZE": "2000"}),
        ("2.11.0", {"TORCH_FR_BUFFER_SIZE": "2000"}),
        ("2.6.0+cu124", {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}),
        ("2.4.1", {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}),
        ("weird", {"TORCH_FR_BUFFER_SIZE": "2000"}),
    ],
)
def test_the_names_this_torch_reads(version, expected):
    env = _env()
    autostart._flight_recorder_for_this_torch(version, env)
    assert env == expected


@pytest.mark.parametrize(
    "user",
    [{"TORCH_FR_BUFFER_SIZE": "0"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": ""}],
)
def test_a_users_value_under_either_name_is_left_alone(user):
    for version in ("2.13.0", "2.4.0"):
        env = _env(**user)
        autostart._flight_recorder_for_this_torch(version, env)
        assert env == user
