"""The text report written without rich (not a terminal) is the one rich writes, byte for byte."""

from __future__ import annotations

import io
import random

import pytest
from rich.text import Text

from ddpdoctor.report import console as report_console
from ddpdoctor.report import text


def _rich(value: str, width: int) -> str:
    out = io.StringIO()
    report_console.console(out, width).print(Text(value), overflow="fold")
    return out.getvalue()


def _plain(value: str, width: int) -> str | None:
    console = text._PlainConsole(width)
    try:
        console.print(text._PlainText(value))
    except text._NeedsRich:
        return None
    return console.file.getvalue()


@pytest.mark.parametrize("seed", range(20))
def test_plain_lines_wrap_as_rich_wraps_them(seed: int) -> None:
    rng = random.Random(seed)
    hostile = ["a", "b", "é", "·", "→", " ", "  ", "\n", "[red]", "x" * 30, "中", "\t", "\x1b"]
    benign = ["a", "bc", "defgh", "·", "→", "─", " ", " ", " ", "  ", "\n", "[red]", "x" * 9]
    plain_count = 0
    for i in range(300):
        alphabet = hostile if i % 4 == 0 else benign
        value = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 250)))
        width = rng.choice([10, 20, 40, 100])
        got = _plain(value, width)
        if got is not None:
            plain_count += 1
            assert got == _rich(value, width), (value, width)
    assert plain_count > 50


def _diagnoses():
    """The recorded runs and the golden inputs of test_report.py."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    import pandas as pd

    from ddpdoctor.diagnosis import evaluate, load_rules
    from ddpdoctor.pipeline import analyze_run

    for run in sorted(p for p in Path("samples/recorded").iterdir() if p.is_dir()):
        yield run.name, analyze_run(run).diagnosis
    golden = Path(__file__).resolve().parents[1] / "golden" / "inputs"
    for path in sorted(golden.glob("*.json")):
        data = json.loads(path.read_text())
        frames = {k: pd.DataFrame(data[k]) for k in ("per_step", "collectives", "devices")}
        yield path.stem, evaluate(load_rules(), SimpleNamespace(run=data["run"], ranks=data["ranks"], **frames))


def test_report_without_rich_is_rich_s_report() -> None:
    from ddpdoctor.report.document import build

    plain_count = 0
    for name, result in _diagnoses():
        drawn = io.StringIO()
        text._write(text._console(drawn), result, build(result), Text, text._t)
        written = io.StringIO()
        text.render(result, written)
        assert written.getvalue() == drawn.getvalue(), name
        try:
            text._write(
                text._PlainConsole(text.WIDTH_NOT_A_TERMINAL), result, build(result), text._PlainText, text._plain_t
            )
            plain_count += 1
        except text._NeedsRich:
            pass
    assert plain_count >= 2  # the plain writer is what is tested here, not rich's fallback


def test_a_report_of_many_ranks_is_written_without_rich_too() -> None:
    # 40 ranks: the tables list some of them and say which in a note, which the plain writer writes as rich would
    import copy
    import json
    from pathlib import Path
    from types import SimpleNamespace

    import pandas as pd

    from ddpdoctor.diagnosis import evaluate, load_rules
    from ddpdoctor.report.document import build

    golden = Path(__file__).resolve().parents[1] / "golden" / "inputs" / "ddp_4ranks.json"
    data = json.loads(golden.read_text())
    ranks = [dict(copy.deepcopy(data["ranks"][i % len(data["ranks"])]), rank=i) for i in range(40)]
    frames = {k: pd.DataFrame(data[k]) for k in ("per_step", "collectives", "devices")}
    result = evaluate(load_rules(), SimpleNamespace(run={**data["run"], "world_size": 40}, ranks=ranks, **frames))
    plain = text._PlainConsole(text.WIDTH_NOT_A_TERMINAL)
    text._write(plain, result, build(result), text._PlainText, text._plain_t)  # no _NeedsRich
    drawn = io.StringIO()
    text._write(text._console(drawn), result, build(result), Text, text._t)
    assert plain.file.getvalue() == drawn.getvalue()
    assert "of 40 ranks: the lowest rank" in " ".join(drawn.getvalue().split())
