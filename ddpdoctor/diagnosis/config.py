"""Rule parameter overrides from the user's configuration.

``[tool.ddpdoctor.rules.<name>]`` in the nearest ``pyproject.toml`` that has a ``[tool.ddpdoctor]``
table, searched from the current directory upwards (like ruff), or in the file given with ``--config``
(then no search happens). A ``--config`` file may be a pyproject.toml or a plain TOML file with
``[rules.<name>]`` tables::

    [tool.ddpdoctor.rules.poor-comm-compute-overlap]
    min_overlap = 0.6
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.diagnosis.rules import Rule, RuleError
from ddpdoctor.tomlfile import TOMLError, load_bytes


@dataclass(frozen=True)
class RuleConfig:
    """Parameter overrides per rule (name or id -> {param: value}) and the file they came from."""

    source: str | None = None
    rules: dict[str, dict[str, Any]] = field(default_factory=dict)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return load_bytes(path.read_bytes())
    except OSError as exc:
        raise RuleError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    except TOMLError as exc:
        raise RuleError(f"{path}: not valid TOML: {exc}") from None


def find_pyproject(start: Path) -> tuple[Path, dict[str, Any]] | None:
    """The nearest pyproject.toml at or above ``start`` with a ``[tool.ddpdoctor]`` table, and that table."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            table = _read_toml(candidate).get("tool", {}).get("ddpdoctor")
            if table is not None:
                return candidate, table
    return None


def load_config(config_file: str | Path | None = None, *, cwd: str | Path | None = None) -> RuleConfig:
    """Read the overrides from ``config_file``, or from the pyproject.toml found from ``cwd`` upwards."""
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise RuleError(f"{path}: config file does not exist")
        data = _read_toml(path)
        tool = data.get("tool")
        table = tool.get("ddpdoctor", {}) if isinstance(tool, dict) else data
    else:
        found = find_pyproject(Path(cwd) if cwd is not None else Path.cwd())
        if found is None:
            return RuleConfig()
        path, table = found
    rules = table.get("rules", {}) if isinstance(table, dict) else None
    if not isinstance(rules, dict) or not all(isinstance(v, dict) for v in rules.values()):
        raise RuleError(
            f"{path}: [tool.ddpdoctor.rules] must hold one table per rule, e.g. [tool.ddpdoctor.rules.dataloader-bound]"
        )
    return RuleConfig(str(path), {name: dict(values) for name, values in rules.items()})


def apply_config(rules: Iterable[Rule], config: RuleConfig) -> tuple[Rule, ...]:
    """The rules with the configured parameters; a config entry for an unknown rule or param is an error."""
    rules = tuple(rules)
    by_key = {r.name: r for r in rules} | {r.id: r for r in rules}
    overrides: dict[str, Rule] = {}
    for key, values in config.rules.items():
        rule = by_key.get(key)
        if rule is None:
            raise RuleError(
                f"{config.source}: [tool.ddpdoctor.rules.{key}] names no known rule (see `ddpdoctor rules`)"
            )
        overrides[rule.name] = overrides.get(rule.name, rule).with_params(values, config.source or "config")
    return tuple(overrides.get(r.name, r) for r in rules)
