"""The cached built-in rules (``ddpdoctor.diagnosis.rule_cache``) and the cached catalog tables: the same objects as
a fresh parse, rebuilt when a rule file changes, never serving a broken file's rules."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from ddpdoctor.diagnosis import rule_cache, rules
from ddpdoctor.metrics import catalog


@pytest.fixture
def builtin_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the built-in rules as the built-in folder, with the cache file under tmp_path."""
    folder = tmp_path / "rules"
    shutil.copytree(Path(str(rules.builtin_rules_dir())), folder)
    monkeypatch.setattr(rules, "builtin_rules_dir", lambda: folder)
    monkeypatch.setattr(rule_cache, "_CACHE", tmp_path / "cache" / "builtin_rules.pickle")
    return folder


def _fresh(folder: Path) -> tuple[rules.Rule, ...]:
    return rules.load_rules([folder], builtin=False)


def test_cached_rules_equal_a_fresh_parse(builtin_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = rules.load_rules()  # parses, writes the cache
    assert rule_cache._CACHE.is_file()
    fresh = _fresh(builtin_copy)

    def no_parse(path: object) -> rules.Rule:
        raise AssertionError(f"{path} parsed although the cache matches")

    monkeypatch.setattr(rules, "load_rule_file", no_parse)
    second = rules.load_rules()  # from the cache
    assert first == second == fresh
    assert [r.when.source for r in second] == [r.when.source for r in first]
    assert second[0] is not first[0]  # each call gets its own objects (params dicts are not shared)


def test_a_changed_rule_file_is_parsed_again(builtin_copy: Path) -> None:
    rules.load_rules()
    path = builtin_copy / "dataloader-bound.toml"
    text = path.read_text()
    assert 'severity = "warning"' in text
    path.write_text(text.replace('severity = "warning"', 'severity = "error"', 1))
    (rule,) = [r for r in rules.load_rules() if r.name == "dataloader-bound"]
    assert rule.severity == "error"


def test_a_broken_rule_file_fails_every_time(builtin_copy: Path) -> None:
    rules.load_rules()
    (builtin_copy / "dataloader-bound.toml").write_text("not = [toml")
    for _ in range(2):
        with pytest.raises(rules.RuleError, match="dataloader-bound.toml: not valid TOML"):
            rules.load_rules()


def test_a_corrupt_cache_file_is_rebuilt(builtin_copy: Path) -> None:
    expected = rules.load_rules()
    rule_cache._CACHE.write_bytes(b"\x80\x05garbage")
    assert rules.load_rules() == expected
    assert rules.load_rules() == expected


def test_an_unwritable_cache_folder_still_loads(builtin_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = builtin_copy.parent / "file"
    blocker.write_text("")
    monkeypatch.setattr(rule_cache, "_CACHE", blocker / "sub" / "builtin_rules.pickle")
    assert rules.load_rules() == _fresh(builtin_copy)


def test_catalog_tables_from_the_marshal_cache_equal_tomllib(tmp_path: Path) -> None:
    import tomllib

    path = tmp_path / "catalog.toml"
    shutil.copy(Path(catalog.__file__).with_name("catalog.toml"), path)
    parsed = tomllib.loads(path.read_text(encoding="utf-8"))
    assert catalog._read_toml(path) == parsed  # parses and writes the cache
    assert (tmp_path / "__pycache__" / f"catalog.toml.{sys.implementation.cache_tag}.marshal").is_file()
    cached = catalog._read_toml(path)
    assert cached == parsed and list(cached["rank"]) == list(parsed["rank"])  # same tables, same order
    path.write_text(path.read_text(encoding="utf-8") + '\n[extra]\nx = "y"\n', encoding="utf-8")
    assert catalog._read_toml(path)["extra"] == {"x": "y"}  # a changed file is parsed again
