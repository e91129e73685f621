"""A baseline file is trusted by CI: one that could switch the gate off (non-finite numbers, a wrong schema,
wrong types) is refused with one line and exit 2 (issue 13, items 5, 8, 12)."""

from __future__ import annotations

import json

import pytest

from ddpdoctor.cli import main
from ddpdoctor.compare.baseline_file import from_json

GOOD = {
    "schema_version": 1,
    "kind": "ddpdoctor-baseline",
    "run": "runs/a",
    "environment": {"world_size": 2, "mode": "ddp"},
    "metrics": {"step_ms.median": 30.0, "step_ms.p90": 33.0},
    "samples": {"step_ms": [30.0, 31.0, 29.0, 30.5, 30.2, 29.8]},
    "findings": [],
    "rules_evaluated": [],
    "notes": [],
}


def _gate(tmp_path, capsys, doc: dict | str) -> tuple[int, str]:
    base = tmp_path / "baseline.json"
    base.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    capsys.readouterr()
    code = main(["gate", str(good), "--baseline", str(base)])
    return code, capsys.readouterr().err


def test_good_baseline_is_read():
    snap = from_json(GOOD, "b.json")
    assert snap.value("step_ms.median") == 30.0 and len(snap.samples["step_ms"]) == 6


@pytest.mark.parametrize(
    "text",
    [
        '"step_ms.median": NaN',
        '"step_ms.median": Infinity',
        '"step_ms.median": -Infinity',
    ],
)
def test_non_finite_metric_is_refused(tmp_path, capsys, text):
    doc = json.dumps(GOOD).replace('"step_ms.median": 30.0', text)
    code, err = _gate(tmp_path, capsys, doc)
    assert code == 2
    assert "step_ms.median" in err and "finite" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_non_finite_sample_is_refused(tmp_path, capsys):
    doc = json.dumps(GOOD).replace("[30.0, 31.0", "[NaN, 31.0")
    code, err = _gate(tmp_path, capsys, doc)
    assert code == 2 and "step_ms" in err and "finite" in err


@pytest.mark.parametrize("version", [0, "1", 1.0, True, None, -1, 2])
def test_schema_version_must_be_exactly_1(tmp_path, capsys, version):
    doc = {**GOOD, "schema_version": version}
    if version is None:
        del doc["schema_version"]
    code, err = _gate(tmp_path, capsys, doc)
    assert code == 2 and "schema_version" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "key,value,says",
    [
        ("findings", [1, 2], "findings"),
        ("findings", [{"name": 3}], "findings"),
        ("findings", "x", "findings"),
        ("rules_evaluated", [1], "rules_evaluated"),
        ("environment", [1], "environment"),
        ("metrics", {"step_ms.median": "30"}, "step_ms.median"),
        ("metrics", {"step_ms.median": 10**400}, "step_ms.median"),
        ("metrics", {"step_ms.median": [1]}, "step_ms.median"),
        ("samples", {"step_ms": 5}, "step_ms"),
        ("samples", {"step_ms": [1, "2"]}, "step_ms"),
        ("notes", "text", "notes"),
        ("devices", [1], "devices"),
        ("sample_notes", [1], "sample_notes"),
        ("run", ["a"], "run"),
    ],
)
def test_wrong_types_are_one_line_and_exit_2(tmp_path, capsys, key, value, says):
    text = _with_huge() if _huge(value) else json.dumps({**GOOD, key: value})
    code, err = _gate(tmp_path, capsys, text)
    assert code == 2, err
    assert says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def _huge(value) -> bool:
    return isinstance(value, dict) and any(isinstance(v, int) and v > 10**300 for v in value.values())


def _with_huge() -> str:
    return json.dumps(GOOD).replace('"step_ms.median": 30.0', '"step_ms.median": 1' + "0" * 400)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+nan"])
def test_non_finite_rule_param_in_config_is_refused(tmp_path, capsys, value):
    from ddpdoctor.diagnosis import RuleError, apply_config, load_config, load_rules

    (tmp_path / "pyproject.toml").write_text(f"[tool.ddpdoctor.rules.dataloader-bound]\nmin_share = {value}\n")
    with pytest.raises(RuleError, match="dataloader-bound.min_share must be a finite number"):
        apply_config(load_rules(), load_config(cwd=tmp_path))


def test_non_finite_rule_param_in_a_rule_file_is_refused(tmp_path):
    from ddpdoctor.diagnosis import RuleError
    from ddpdoctor.diagnosis.rules import builtin_rules_dir, load_rule_file

    text = (builtin_rules_dir() / "dataloader-bound.toml").read_text()
    path = tmp_path / "dataloader-bound.toml"
    import re

    path.write_text(re.sub(r"(?m)^min_share = .*$", "min_share = nan", text))
    with pytest.raises(RuleError, match="finite"):
        load_rule_file(path)
