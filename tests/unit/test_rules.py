"""Rule files: the shipped rules load and are documented; bad rule files, hostile expressions and bad config
are clear errors naming the file; parameters can be overridden from pyproject.toml or --config."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ddpdoctor.diagnosis import RuleError, apply_config, find_rule, load_config, load_rules, select_rules
from ddpdoctor.diagnosis.expr import Expr, ExprError, Values, compile_expr, evaluate
from ddpdoctor.diagnosis.rules import DOC_SECTIONS, builtin_rules_dir, load_rule_file
from ddpdoctor.diagnosis.template import compile_template
from ddpdoctor.errors import DDPDoctorError
from ddpdoctor.metrics.catalog import RULE_RANK as ALL_RANK
from ddpdoctor.metrics.catalog import RULE_RUN as RUN
from ddpdoctor.report.rule_docs import rule_markdown

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "rules"
REQUIRED_NAMES = {
    "gil-contention",
    "gpu0-oom-risk",
    "poor-comm-compute-overlap",
    "rank-straggler",
    "dataloader-bound",
    "use-ddp-instead-of-dp",
    "find-unused-parameters-cost",
    "ddp-bucket-size-mismatch",
    "host-sync-stalls",
    "low-collective-bandwidth",
    "cpu-thread-oversubscription",
    "broadcast-buffers-cost",
}


# ------------------------------------------------------------------------------------------- shipped rules
def test_all_shipped_rules_load_with_unique_ids_and_the_interface_names():
    rules = load_rules()
    assert {r.name for r in rules} >= REQUIRED_NAMES
    assert len({r.id for r in rules}) == len(rules)
    assert len(list(RULES_DIR.glob("*.toml"))) == len(rules)


def test_builtin_rules_dir_is_the_repo_rules_folder_in_a_source_checkout():
    found = builtin_rules_dir()
    assert sorted(p.name for p in found.iterdir() if p.name.endswith(".toml")) == sorted(
        p.name for p in RULES_DIR.glob("*.toml")
    )


@pytest.mark.parametrize("rule", load_rules(), ids=lambda r: r.name)
def test_every_rule_is_documented_like_ruff(rule):
    docs = rule.docs
    for section in DOC_SECTIONS:
        assert getattr(docs, section), section
    assert "```" in docs.example and "```" in docs.fix, "example and fix need code"
    assert all(ref.startswith("https://") for ref in docs.references)
    assert set(docs.options) == set(rule.params)
    assert len(rule.summary) <= 120 and "\n" not in rule.summary
    text = rule_markdown(rule)
    for heading in (
        "## What it does",
        "## Why is this bad?",
        "## Example",
        "## How to fix it",
        "## Options",
        "## References",
        "## Condition",
    ):
        assert heading in text
    for metric in rule.metrics - {"rank"}:
        assert f"`{metric}`" in text  # every metric it reads is explained


@pytest.mark.parametrize("rule", load_rules(), ids=lambda r: r.name)
def test_every_rule_reads_only_registered_metrics(rule):
    assert rule.metrics <= set(ALL_RANK) | set(RUN)


def test_find_rule_by_name_or_id_case_insensitive():
    rules = load_rules()
    assert find_rule(rules, "DDP002").name == "poor-comm-compute-overlap"
    assert find_rule(rules, "ddp002").name == "poor-comm-compute-overlap"
    assert find_rule(rules, "rank-straggler").id == "DDP003"
    with pytest.raises(DDPDoctorError, match="did you mean rank-straggler"):
        find_rule(rules, "rank-stragler")


def test_select_and_ignore_by_name_or_id():
    rules = load_rules()
    assert [r.name for r in select_rules(rules, ["dataloader-bound", "DDP003"])] == [
        "dataloader-bound",
        "rank-straggler",
    ]
    left = {r.name for r in select_rules(rules, [], ["gil-contention", "DDP001"])}
    assert "gil-contention" not in left and "dataloader-bound" not in left and len(left) == len(rules) - 2
    with pytest.raises(DDPDoctorError, match="unknown rule 'nope'"):
        select_rules(rules, ["nope"])


# ------------------------------------------------------------------------------------------- bad rule files
def _rule_text(name: str = "dataloader-bound") -> str:
    return (RULES_DIR / f"{name}.toml").read_text()


def _write(tmp_path: Path, text: str, name: str = "dataloader-bound") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_unknown_metric_is_an_error_naming_the_file_and_metric(tmp_path):
    path = _write(tmp_path, _rule_text().replace('when = "dataloader_ms >', 'when = "data_loader_ms >'))
    with pytest.raises(RuleError) as err:
        load_rule_file(path)
    assert str(path) in str(err.value)
    assert "unknown metric 'data_loader_ms'" in str(err.value) and "did you mean dataloader_ms" in str(
        err.value
    )


def test_unknown_metric_in_the_message_template_is_an_error(tmp_path):
    path = _write(tmp_path, _rule_text().replace("{dataloader_ms:.1f}", "{loader_ms:.1f}"))
    with pytest.raises(RuleError, match=r"message: unknown metric 'loader_ms'"):
        load_rule_file(path)


@pytest.mark.parametrize("section", ["why_is_this_bad", "what_it_does", "fix", "example"])
def test_missing_doc_section_is_an_error_naming_the_file(tmp_path, section):
    text = _rule_text()
    start = text.index(f"{section} = ")
    end = (
        text.index("\n[", start)
        if section == "fix"
        else min(
            i
            for i in (text.find("\n" + k + " = ", start + 1) for k in DOC_SECTIONS + ("references",))
            if i > 0
        )
    )
    path = _write(tmp_path, text[:start] + text[end + 1 :])
    with pytest.raises(RuleError) as err:
        load_rule_file(path)
    assert str(path) in str(err.value) and f"missing [docs] {section}" in str(err.value)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: re.sub(r"(?m)^recommendation = .*\n", "", t), "missing recommendation"),
        (lambda t: t.replace('severity = "warning"', 'severity = "fatal"'), "severity must be one of"),
        (lambda t: t.replace('applies_to = "any"', 'applies_to = "fsdp"'), "applies_to must be one of"),
        (lambda t: t.replace('scope = "rank"', 'scope = "rank"\nwhne = "1"'), "unknown key(s) whne"),
        (
            lambda t: t.replace('when = "dataloader_ms >', 'when = "dataloader_ms >> 2 >'),
            "RShift is not allowed",
        ),
        (lambda t: t.replace('when = "dataloader_ms >', 'when = "dataloader_ms >>>'), "syntax error"),
        (
            lambda t: t.replace("params.min_ms", "params.min_milliseconds", 1),
            "unknown parameter params.min_millis",
        ),
        (
            lambda t: t.replace('min_ms = "Smallest', 'min_msx = "Smallest'),
            "[docs.options] must describe every",
        ),
        (lambda t: re.sub(r"references = \[.*?\]\n", "", t, flags=re.S), "missing [docs] references"),
        (lambda t: t.replace('id = "DDP001"', 'id = "1"'), "must be capital letters then digits"),
        (lambda t: t.replace("{step_ms_median:.1f}", "{step_ms_median:99999}"), "format spec"),
        (lambda t: t.replace("{step_ms_median:.1f}", "{step_ms_median!r}"), "conversions are not allowed"),
        (
            lambda t: t.replace(
                "dataloader_ms > params", "mean(step_skew_ratio) > 0 and dataloader_ms > params"
            ),
            "run-level metric; use it directly",
        ),
        (lambda t: "not = [toml", "not valid TOML"),
    ],
)
def test_bad_rule_files_are_clear_errors_naming_the_file(tmp_path, edit, expected):
    path = _write(tmp_path, edit(_rule_text()))
    with pytest.raises(RuleError) as err:
        load_rule_file(path)
    assert str(err.value).startswith(str(path)), err.value
    assert expected in str(err.value), err.value


def test_per_rank_metric_must_be_aggregated_in_a_run_level_rule(tmp_path):
    text = _rule_text("low-collective-bandwidth").replace(
        "mean(exposed_comm_ms) / mean(step_ms_median)", "mean(exposed_comm_ms) / step_ms_median"
    )
    with pytest.raises(RuleError, match="step_ms_median is a per-rank metric; aggregate it"):
        load_rule_file(_write(tmp_path, text, "low-collective-bandwidth"))


def test_a_rule_file_is_parsed_again_only_when_its_bytes_change(tmp_path):
    """A process that diagnoses again reuses the rule it checked; an edited file is read as it is now, an edit
    that breaks it is an error again, and a file put back as it was is the rule it was."""
    path = _write(tmp_path, _rule_text())
    first = load_rule_file(path)
    assert load_rule_file(path) is first
    path.write_text(_rule_text().replace("[params]\n", "[params]\n# edited\n"))
    edited = load_rule_file(path)
    assert edited is not first and edited == first  # same rule, parsed from the new bytes
    path.write_text(_rule_text().replace('when = "dataloader_ms >', 'when = "data_loader_ms >'))
    with pytest.raises(RuleError, match="data_loader_ms"):
        load_rule_file(path)
    with pytest.raises(RuleError, match="data_loader_ms"):  # a broken file is never remembered as good
        load_rule_file(path)
    path.write_text(_rule_text())
    assert load_rule_file(path) is first


def test_file_name_must_match_rule_name(tmp_path):
    path = tmp_path / "loader.toml"
    path.write_text(_rule_text())
    with pytest.raises(RuleError, match="must be named dataloader-bound.toml"):
        load_rule_file(path)


def test_rules_dir_adds_rules_and_rejects_duplicates_and_missing_dirs(tmp_path):
    custom = tmp_path / "custom"
    custom.mkdir()
    text = (
        _rule_text()
        .replace('id = "DDP001"', 'id = "ACME001"')
        .replace('name = "dataloader-bound"', 'name = "slow-loader"')
    )
    (custom / "slow-loader.toml").write_text(text)
    names = {r.name for r in load_rules([custom])}
    assert "slow-loader" in names and "dataloader-bound" in names
    (custom / "dataloader-bound.toml").write_text(_rule_text().replace('id = "DDP001"', 'id = "ACME002"'))
    with pytest.raises(RuleError, match="rule dataloader-bound is already defined in"):
        load_rules([custom])
    with pytest.raises(RuleError, match="rules directory does not exist"):
        load_rules([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuleError, match="no rule files"):
        load_rules([tmp_path / "empty"])


# ------------------------------------------------------------------------------------------- hostile input
HOSTILE = [
    "__import__('os').system('echo pwned')",
    "().__class__.__bases__[0].__subclasses__()",
    "params.__class__",
    "params.__dict__",
    "dataloader_ms.__class__",
    "(1).real",
    "open('/etc/passwd')",
    "exec('import os')",
    "eval('1')",
    "getattr(params, 'min_ms')",
    "9 ** 9 ** 9",
    "2 ** 99999999",
    "step_ms_median ** 1000",
    "step_ms_median ** dataloader_ms",
    "'a' * 10 ** 9",
    "[x for x in (1, 2)]",
    "(lambda: 1)()",
    "__builtins__",
    "globals()",
    "f'{dataloader_ms}'",
    "dataloader_ms if True else __import__('os')",
    "(x := 1)",
    "{'a': 1}['a']",
    "1 << 100000",
    "mean(dataloader_ms + 1)",
    "import os",
    "(" * 300 + "1" + ")" * 300,
    "1 + " * 1500 + "1",
]


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_expressions_are_rejected_before_evaluation(source):
    with pytest.raises(ExprError):
        compile_expr(source, scope="rank", params={"min_ms": 1.0})


@pytest.mark.parametrize(
    "source", ["__import__('os').system('echo pwned')", "9 ** 9 ** 9", "params.__class__"]
)
def test_hostile_expressions_in_a_rule_file_are_clear_errors(tmp_path, source):
    text = re.sub(r"(?m)^when = .*$", f'when = "{source}"'.replace("'", "'"), _rule_text())
    path = _write(tmp_path, text)
    with pytest.raises(RuleError) as err:
        load_rule_file(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    "source",
    [
        "().__class__.__bases__",
        "9 ** 9 ** 9",
        "[1, 2][0]",
        "open('/etc/passwd')",
        "params.__class__",
        "__import__('os')",
    ],
)
def test_the_evaluator_refuses_unchecked_hostile_trees_too(source):
    # Defence in depth: even a tree that skipped compile_expr's checks is refused by the evaluator.
    expr = Expr(source, ast.parse(source, mode="eval").body, frozenset(), ())
    with pytest.raises(ExprError):
        evaluate(expr, Values({}, [], {"min_ms": 1.0}))


# ------------------------------------------------------------------------------------------- expression logic
def _values(**run):
    ranks = [
        {"rank": 0, "dataloader_ms": 10.0, "step_ms_median": 100.0},
        {"rank": 1, "dataloader_ms": None, "step_ms_median": 120.0},
        {"rank": 2, "dataloader_ms": 30.0, "step_ms_median": 0.0},
    ]
    return Values(run, ranks, {"x": 2.0, "flag": True})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("mean(dataloader_ms)", 20.0),  # the rank without a value is skipped
        ("max(dataloader_ms) - min(dataloader_ms)", 20.0),
        ("sum(step_ms_median)", 220.0),
        ("count(dataloader_ms)", 2),
        ("p90(step_ms_median)", 116.0),
        ("median(step_ms_median)", 100.0),
        ("straggler_wait_ms > 1", None),  # unknown run-level metric -> unknown
        ("straggler_wait_ms > 1 or mean(dataloader_ms) > 5", True),  # three-valued or
        ("straggler_wait_ms > 1 and mean(dataloader_ms) > 50", False),  # three-valued and
        ("not straggler_wait_ms", None),
        ("coalesce(straggler_wait_ms, params.x) * 3", 6.0),
        ("max(mean(dataloader_ms), params.x, 50)", 50),
        ("mean(dataloader_ms) / 0", None),  # division by zero is unknown, not infinity
        ("0 < mean(dataloader_ms) < 25", True),
        ("params.flag and 2 ** 10 == 1024", True),
        ("abs(-params.x) if world_size == 4 else -1", 2.0),
    ],
)
def test_expression_semantics_with_missing_values(source, expected):
    assert evaluate(source, _values(world_size=4, straggler_wait_ms=None)) == expected


def test_rank_scope_reads_the_rank_and_aggregates_over_all_ranks():
    base = _values()
    rank2 = Values(base.run, base.ranks, base.params, base.ranks[2])
    assert evaluate(compile_expr("dataloader_ms > mean(dataloader_ms)", scope="rank"), rank2) is True
    assert evaluate(compile_expr("dataloader_ms / step_ms_median", scope="rank"), rank2) is None


def test_templates_format_numbers_and_show_unknown_as_na():
    t = compile_template("{mean(dataloader_ms):.1f} ms on {ranks}; skew {step_skew_ratio:.2f}x", scope="run")
    assert (
        t.render(_values(step_skew_ratio=None), {"ranks": "ranks 0-2"}) == "20.0 ms on ranks 0-2; skew n/ax"
    )


# ------------------------------------------------------------------------------------------- configuration
def test_params_are_overridden_from_the_nearest_pyproject_with_a_ddpdoctor_table(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        "[tool.ddpdoctor.rules.dataloader-bound]\nmin_share = 0.5\n"
        "[tool.ddpdoctor.rules.DDP002]\nmin_overlap = 0.8\n"
    )
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    (tmp_path / "a" / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # no [tool.ddpdoctor]: skipped
    config = load_config(cwd=nested)
    assert config.source == str(tmp_path / "pyproject.toml")
    rules = {r.name: r for r in apply_config(load_rules(), config)}
    assert rules["dataloader-bound"].params["min_share"] == 0.5
    assert rules["dataloader-bound"].params_source["min_share"] == str(tmp_path / "pyproject.toml")
    assert rules["dataloader-bound"].params["min_ms"] == 2.0
    assert rules["poor-comm-compute-overlap"].params["min_overlap"] == 0.8
    assert "from " + str(tmp_path / "pyproject.toml") in rule_markdown(rules["dataloader-bound"])


def test_config_file_replaces_the_pyproject_search(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.ddpdoctor.rules.dataloader-bound]\nmin_share = 0.5\n")
    plain = tmp_path / "ddpdoctor.toml"
    plain.write_text("[rules.dataloader-bound]\nmin_ms = 7\n")
    config = load_config(plain, cwd=tmp_path)
    rule = {r.name: r for r in apply_config(load_rules(), config)}["dataloader-bound"]
    assert rule.params == {"min_share": 0.10, "min_ms": 7}
    other = tmp_path / "other.toml"
    other.write_text("[tool.ddpdoctor.rules.rank-straggler]\nmin_wait_ms = 9.5\n")
    rule = {r.name: r for r in apply_config(load_rules(), load_config(other))}["rank-straggler"]
    assert rule.params["min_wait_ms"] == 9.5


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[tool.ddpdoctor.rules.dataloader-bound]\nmin_sharee = 0.5\n", "has no parameter 'min_sharee'"),
        ("[tool.ddpdoctor.rules.dataloader-bound]\nmin_share = 'high'\n", "must be a number"),
        ("[tool.ddpdoctor.rules.no-such-rule]\nx = 1\n", "names no known rule"),
        ("[tool.ddpdoctor]\nrules = 3\n", "must hold one table per rule"),
        ("[tool.ddpdoctor.rules.dataloader-bound\n", "not valid TOML"),
    ],
)
def test_bad_config_is_a_clear_error_naming_the_file(tmp_path, text, expected):
    path = tmp_path / "conf.toml"
    path.write_text(text)
    with pytest.raises(RuleError) as err:
        apply_config(load_rules(), load_config(path))
    assert str(path) in str(err.value) and expected in str(err.value)


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(RuleError, match="config file does not exist"):
        load_config(tmp_path / "nope.toml")


def test_explain_says_what_a_rule_applies_to_as_ddpdoctor_rules_does(capsys):
    """One wording of "applies to" (issue 27): `explain NAME`'s header line is `rules --format json`'s ``applies``
    for every built-in rule (explain once said "DistributedDataParallel runs" for rules that fit FSDP and TP too)."""
    import json

    from ddpdoctor.cli import main

    assert main(["rules", "--format", "json"]) == 0
    listed = {r["name"]: r["applies"] for r in json.loads(capsys.readouterr().out)}
    assert listed
    for name, applies in listed.items():
        assert main(["explain", name]) == 0
        header = capsys.readouterr().out.splitlines()[2]
        assert f" · applies to: {applies} · " in header, (name, header)
