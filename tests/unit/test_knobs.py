"""The knob table (ddpdoctor/knobs.py): values, errors in one line, the README's table, rule prescriptions, and the
capture applying DataLoader and thread knobs in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor import knobs
from ddpdoctor.diagnosis import load_rules

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_knob_table_is_the_table():
    assert knobs.table_markdown() in README


def test_values_parse_and_bad_ones_say_why():
    assert knobs.parse_value("ddp.bucket_cap_mb", "2.5") == 2.5
    assert knobs.parse_value("ddp.static_graph", "True") is True
    assert knobs.parse_value("loader.num_workers", "cpus_per_rank", cpus_per_rank=3) == 3
    with pytest.raises(knobs.KnobError, match="must be a number above 0"):
        knobs.parse_value("ddp.bucket_cap_mb", "0")
    with pytest.raises(knobs.KnobError, match="did you mean loader.num_workers"):
        knobs.parse_value("loader.num_worker", "2")
    with pytest.raises(knobs.KnobError, match="given twice"):
        knobs.parse_settings(["ddp.static_graph=true", "ddp.static_graph=false"])
    assert knobs.environment({"env.OMP_NUM_THREADS": "2", "ddp.static_graph": "true"}) == {"OMP_NUM_THREADS": "2"}


def test_code_lines():
    assert knobs.knob("ddp.bucket_cap_mb").code_line(5.0) == "DDP(model, ..., bucket_cap_mb=5)"
    assert knobs.knob("ddp.comm_hook").code_line("bf16").endswith("default_hooks.bf16_compress_hook)")


def test_every_builtin_prescription_names_a_knob_and_values_it_takes():
    prescribed = {p.knob for r in load_rules() for p in r.prescriptions}
    assert "ddp.bucket_cap_mb" in prescribed and "loader.num_workers" in prescribed
    assert prescribed <= set(knobs.BY_NAME)


def test_a_rule_prescribing_an_unknown_knob_is_refused(tmp_path):
    from ddpdoctor.diagnosis.rules import RuleError, load_rule_file

    source = Path(__file__).resolve().parents[2] / "rules" / "broadcast-buffers-cost.toml"
    text = source.read_text().replace('knob = "ddp.broadcast_buffers"', 'knob = "ddp.broadcast_buffer"')
    bad = tmp_path / "broadcast-buffers-cost.toml"
    bad.write_text(text)
    with pytest.raises(RuleError, match="unknown knob 'ddp.broadcast_buffer'"):
        load_rule_file(bad)


def test_capture_applies_loader_and_thread_knobs_in_process():
    import torch
    from torch.utils.data import DataLoader

    from ddpdoctor.capture import knobs as capture_knobs

    threads = torch.get_num_threads()
    applier = capture_knobs.install(
        {"loader.pin_memory": "true", "torch.intra_op_threads": "1", "ddp.static_graph": "true"}
    )
    try:
        loader = DataLoader(list(range(8)), batch_size=2, pin_memory=False)
        assert loader.pin_memory is True
        torch.set_num_threads(threads + 1)  # the script's own call is held off by the knob
        assert torch.get_num_threads() == 1
    finally:
        capture_knobs.uninstall()
        torch.set_num_threads(threads)
    report = applier.to_json()
    assert report["loader.pin_memory"] == {"value": "true", "applied": 1, "reason": None}
    assert report["ddp.static_graph"]["applied"] == 0
    assert report["ddp.static_graph"]["reason"] == "the job builds no DistributedDataParallel"
    assert DataLoader(list(range(4)), pin_memory=False).pin_memory is False  # uninstalled


def test_explain_names_the_prescriptions():
    from ddpdoctor.diagnosis import find_rule
    from ddpdoctor.report.rule_docs import rule_markdown

    text = rule_markdown(find_rule(load_rules(), "poor-comm-compute-overlap"))
    assert "Tried by `ddpdoctor try RUN --findings`" in text and "- `ddp.bucket_cap_mb` = 1, 5, 25" in text


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("torch.intra_op_threads", "9" * 30),  # crashed the rank: Overflow when unpacking long long
        ("torch.intra_op_threads", "5000"),
        ("env.OMP_NUM_THREADS", "9" * 25),
        ("env.OMP_NUM_THREADS", "+4"),  # set as text in the job's environment: digits only
        ("loader.num_workers", "100000"),  # would start that many worker processes per loader
        ("loader.prefetch_factor", "9" * 20),
        ("ddp.bucket_cap_mb", "nan"),
        ("ddp.bucket_cap_mb", "inf"),
        ("ddp.bucket_cap_mb", "1e300"),
        ("ddp.bucket_cap_mb", "-1"),
    ],
)
def test_values_out_of_range_are_refused_in_one_line(name, value):
    with pytest.raises(knobs.KnobError) as raised:
        knobs.parse_setting(f"{name}={value}")
    message = str(raised.value)
    assert message.startswith(f"{name}=") and "\n" not in message, message


def test_values_in_range_are_taken():
    assert knobs.parse_value("torch.intra_op_threads", "64") == 64
    assert knobs.parse_value("loader.num_workers", "0") == 0
    assert knobs.parse_value("ddp.bucket_cap_mb", "1024") == 1024.0
