"""Gate thresholds: parsing (+5%, +2ms, -0.1, off...) and [tool.ddpdoctor.gate] / flag precedence."""

from __future__ import annotations

import pytest

from ddpdoctor.compare import catalog
from ddpdoctor.compare.thresholds import DEFAULT_FAIL_ON, load_config, parse_assignment, parse_threshold
from ddpdoctor.errors import UsageError


@pytest.mark.parametrize(
    ("metric", "text", "amount", "relative"),
    [
        ("step_ms.median", "+5%", 0.05, True),
        ("step_ms.median", "5%", 0.05, True),
        ("exposed_comm_ms", "+2 ms", 2.0, False),
        ("exposed_comm_ms", "+2ms", 2.0, False),
        ("exposed_comm_ms", "0.5s", 500.0, False),
        ("overlap_ratio", "-0.1", 0.1, False),
        ("overlap_ratio", "0.1", 0.1, False),
        ("gpu0_peak_reserved", "+10%", 0.10, True),  # alias of gpu0_peak_reserved_bytes
        ("gpu0_peak_reserved_bytes", "+512MiB", 512 * 2**20, False),
        ("busbw_gbps", "-15%", 0.15, True),
    ],
)
def test_parse_threshold(metric, text, amount, relative):
    t = parse_threshold(metric, text)
    assert t is not None
    assert t.metric == catalog.canonical(metric)
    assert t.amount == pytest.approx(amount) and t.relative is relative


def test_off_disables_a_metric():
    assert parse_threshold("dataloader_ms", "off") is None


@pytest.mark.parametrize(
    ("metric", "text", "words"),
    [
        ("step_ms.median", "-5%", "goes up"),  # the sign must be the worse direction
        ("overlap_ratio", "+0.1", "goes down"),
        ("exposed_comm_ms", "+2 GiB", "in ms"),
        ("no_such_metric", "+5%", "unknown gate metric"),
        ("step_ms.median", "fast", "not a threshold"),
    ],
)
def test_bad_thresholds_are_usage_errors(metric, text, words):
    with pytest.raises(UsageError, match=words):
        parse_threshold(metric, text)


def test_exceeded_by_follows_the_worse_direction():
    up = parse_threshold("step_ms.median", "+5%")
    down = parse_threshold("overlap_ratio", "-0.1")
    assert up.exceeded_by(0.06) and not up.exceeded_by(0.04) and not up.exceeded_by(-0.5)
    assert down.exceeded_by(-0.2) and not down.exceeded_by(-0.05) and not down.exceeded_by(0.5)


def test_assignment_forms():
    assert parse_assignment("step_ms.median=+5%") == ("step_ms.median", "+5%")
    assert parse_assignment("exposed_comm_ms: +2 ms") == ("exposed_comm_ms", "+2 ms")
    with pytest.raises(UsageError):
        parse_assignment("step_ms.median")


def test_defaults_without_config(tmp_path):
    config = load_config(cwd=tmp_path)
    assert config.fail_on == DEFAULT_FAIL_ON and config.strict_env is False and config.source is None
    assert config.thresholds["step_ms.median"].text() == "+10%"
    assert config.thresholds["overlap_ratio"].text() == "-0.1"
    assert config.thresholds["exposed_comm_ms"].text() == "+2 ms"
    assert "busbw_gbps" not in config.thresholds  # shown by compare, gated only when asked for


def test_pyproject_found_upwards_and_flags_win(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ddpdoctor.gate]\nfail-on = "warning"\nstrict-env = true\n'
        '[tool.ddpdoctor.gate.thresholds]\n"step_ms.median" = "+3%"\ndataloader_ms = "off"\n'
        'gpu0_peak_reserved = "+1 GiB"\n'
    )
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    config = load_config(cwd=sub)
    assert config.source == str(tmp_path / "pyproject.toml")
    assert config.fail_on == "warning" and config.strict_env is True
    assert config.thresholds["step_ms.median"].text() == "+3%"
    assert "dataloader_ms" not in config.thresholds
    assert config.thresholds["gpu0_peak_reserved_bytes"].amount == 2**30
    flagged = load_config(flags=["step_ms.median=+7%"], fail_on="off", strict_env=False, cwd=sub)
    assert flagged.thresholds["step_ms.median"].text() == "+7%"
    assert flagged.fail_on is None and flagged.strict_env is False


def test_unknown_config_key_names_the_file(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.ddpdoctor.gate]\nthreshold = "+5%"\n')
    with pytest.raises(
        UsageError, match=r"pyproject.toml: unknown key\(s\) in \[tool.ddpdoctor.gate\]: threshold"
    ):
        load_config(cwd=tmp_path)


def test_config_file_option(tmp_path):
    conf = tmp_path / "gate.toml"
    conf.write_text('[gate.thresholds]\n"step_ms.p90" = "+33%"\n')
    assert load_config(str(conf), cwd=tmp_path).thresholds["step_ms.p90"].text() == "+33%"
    with pytest.raises(UsageError, match="does not exist"):
        load_config(str(tmp_path / "missing.toml"))
