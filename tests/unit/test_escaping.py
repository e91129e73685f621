"""Hostile input: what comes from a trace or a file name can neither inject markup into a report nor send
escape sequences to a terminal; input files are never unpickled; rule conditions stay inside the safe
evaluator; the TensorBoard server listens on this machine only unless told otherwise.

The trace is the recorded 2-rank gloo run (tests/fixtures/ddp_gloo_2rank) with op names, thread and process
names, the backend, the host name and the folder and file names replaced by ``<script>`` tags, rich markup and
ANSI/OSC escape sequences; ``ddpdoctor diagnose`` renders it in every format.
"""

from __future__ import annotations

import gzip
import inspect
import io
import json
import re
import shutil
import tokenize
from pathlib import Path

import pytest

from ddpdoctor.cli import build_parser, main
from ddpdoctor.diagnosis.expr import ExprError, Values, compile_expr, evaluate
from ddpdoctor.report import OutputFormat

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "ddp_gloo_2rank"

SCRIPT = "<script>alert(1)</script>"
MARKUP = "[red]markup[/red]"
CSI = "\x1b[31m"  # colour
OSC = "\x1b]0;title\x07"  # set the terminal's title
HOSTILE = f"{SCRIPT}{MARKUP}{CSI}x{OSC}"
# what each looks like once made harmless in a terminal
CSI_SHOWN, OSC_SHOWN = "\\x1b[31m", "\\x1b]0;title\\x07"


def _hostile_trace(src: Path) -> dict:
    doc = json.loads(gzip.decompress(src.read_bytes()))
    doc["distributedInfo"]["backend"] = "gloo" + HOSTILE
    doc["host_name"] = HOSTILE
    for e in doc["traceEvents"]:
        name = e.get("name", "")
        if e.get("ph") == "X" and name.startswith("aten::") and not name.startswith("aten::wait"):
            e["name"] = name + HOSTILE  # op names
        elif e.get("ph") == "M" and name in ("thread_name", "process_name", "process_labels"):
            for key in ("name", "labels"):
                if key in e["args"]:
                    e["args"][key] = HOSTILE  # thread and process names
    return doc


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> Path:
    # "/" cannot be in a file name, so the </script> closing tag spans two folder names
    run = tmp_path_factory.mktemp("h") / "<script>alert(1)<" / f"script>[red]markup[/red]{CSI}x{OSC}" / "run"
    (run / "ranks").mkdir(parents=True)
    for src in sorted(FIXTURE.glob("rank*.pt.trace.json.gz")):
        (run / src.name).write_bytes(gzip.compress(json.dumps(_hostile_trace(src)).encode(), compresslevel=1))
    shutil.copy(FIXTURE / "manifest.json", run / "manifest.json")
    for src in sorted((FIXTURE / "ranks").glob("rank*.json")):
        capture = json.loads(src.read_text())
        capture["hostname"] = HOSTILE
        (run / "ranks" / src.name).write_text(json.dumps(capture))
    # a file that cannot be read, so that its (hostile) name is listed as skipped in every report
    (run / f"rank7.{CSI}{OSC}<img src=x onerror=alert(1)>.pt.trace.json").write_bytes(b"")
    return run


def _diagnose(capsys, run: Path, fmt: str) -> str:
    code = main(["diagnose", str(run), "--format", fmt])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "\x1b" not in err and "\x07" not in err
    return out


def _flat(text: str) -> str:
    return text.replace("\n", "")  # the terminal report folds long lines


def test_text_report_sends_no_escape_sequences_and_parses_no_markup(hostile_run, capsys) -> None:
    out = _diagnose(capsys, hostile_run, "text")
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    flat = _flat(out)
    assert f"{SCRIPT}{MARKUP}{CSI_SHOWN}x{OSC_SHOWN}" in flat  # the folder name, shown as it is
    assert "backend gloo" + f"{SCRIPT}{MARKUP}{CSI_SHOWN}x{OSC_SHOWN}" in flat  # from the trace
    assert f"rank7.{CSI_SHOWN}{OSC_SHOWN}<img src=x onerror=alert(1)>.pt.trace.json: empty file" in flat


def test_text_report_on_a_terminal_has_only_its_own_colours(hostile_run) -> None:
    from ddpdoctor.pipeline import RuleOptions, analyze_run
    from ddpdoctor.report import render

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    render(analyze_run(hostile_run, rules=RuleOptions()).diagnosis, "text", stream)
    out = stream.getvalue()
    assert "\x1b[" in out  # rich's own styles: this is the terminal path
    assert "\x07" not in out and "\x1b]" not in out  # no title change, no hyperlink, no OSC at all
    assert CSI_SHOWN in _flat(re.sub(r"\x1b\[[0-9;]*m", "", out))
    assert MARKUP in _flat(re.sub(r"\x1b\[[0-9;]*m", "", out))  # literal, not interpreted


def test_markdown_report_escapes_markup_and_html(hostile_run, capsys) -> None:
    out = _diagnose(capsys, hostile_run, "markdown")
    assert "\x1b" not in out and "\x07" not in out
    assert "<script" not in out and "<img" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out and "&lt;img src=x onerror=alert(1)&gt;" in out
    assert "\\[red\\]markup\\[/red\\]" in out
    assert "## Skipped (1)" in out


def test_html_report_escapes_everything(hostile_run, capsys) -> None:
    out = _diagnose(capsys, hostile_run, "html")
    assert "\x1b" not in out and "\x07" not in out
    assert "<script" not in out.lower() and "<img" not in out.lower() and "onerror=alert(1)>" not in out
    assert out.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3  # path, backend, skipped file name
    assert "&lt;img src=x onerror=alert(1)&gt;" in out
    assert "<h2>Skipped (1)</h2>" in out


def test_json_report_keeps_the_strings_exactly_and_encodes_control_characters(hostile_run, capsys) -> None:
    out = _diagnose(capsys, hostile_run, "json")
    assert "\x1b" not in out and "\x07" not in out  # JSON writes them as \u001b, \u0007
    doc = json.loads(out)
    assert doc["run"]["path"] == str(hostile_run)
    assert doc["run"]["backend"] == "gloo" + HOSTILE
    (skipped,) = doc["run"]["skipped"]
    assert "<img src=x onerror=alert(1)>" in skipped and "\\x1b" in skipped  # the loader's one-line message


def test_every_output_format_is_covered_above() -> None:
    assert {f.value for f in OutputFormat} == {"text", "json", "markdown", "html"}


def test_compare_reports_escape_trace_strings_too(hostile_run, capsys) -> None:
    for fmt in ("text", "markdown", "html"):
        code = main(["compare", str(hostile_run), str(FIXTURE), "--format", fmt])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "\x1b" not in out + err and "\x07" not in out + err
        if fmt != "text":
            assert "<script" not in out and "<img" not in out


# -------------------------------------------------------------------------------------- no pickle, ever
_UNSAFE_LOADERS = {
    "pickle",
    "cPickle",
    "_pickle",
    "dill",
    "cloudpickle",
    "joblib",
    "shelve",
    "marshal",
    "read_pickle",
    "allow_pickle",
}


def unsafe_deserialisation(source: str) -> list[str]:
    """``pickle``-like names and ``torch.load(`` in Python source, outside comments and strings."""
    tokens = [
        t
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type not in (tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.NEWLINE)
    ]
    hits = [
        f"line {t.start[0]}: {t.string}"
        for t in tokens
        if t.type == tokenize.NAME and t.string in _UNSAFE_LOADERS
    ]
    for a, dot, b, paren in zip(tokens, tokens[1:], tokens[2:], tokens[3:], strict=False):
        if (a.string, dot.string, b.string, paren.string) == ("torch", ".", "load", "("):
            hits.append(f"line {a.start[0]}: torch.load(")
    return hits


def test_the_scanner_finds_what_it_looks_for() -> None:
    assert unsafe_deserialisation("import pickle\nx = torch.load(f)\n") == [
        "line 1: pickle",
        "line 2: torch.load(",
    ]
    assert unsafe_deserialisation("# torch.load(f) and pickle are never used\ns = 'pickle'\n") == []


# The one module that may name pickle: torch's Flight Recorder dumps are pickle, read with no global allowed.
_PLAIN_PICKLE = "ddpdoctor/flight/plain_pickle.py"


def test_no_input_file_is_ever_unpickled() -> None:
    found = {
        str(path.relative_to(REPO)): hits
        for path in sorted((REPO / "ddpdoctor").rglob("*.py"))
        if (hits := unsafe_deserialisation(path.read_text())) and str(path.relative_to(REPO)) != _PLAIN_PICKLE
    }
    assert found == {}


def test_the_one_unpickler_runs_nothing_a_file_names(tmp_path) -> None:
    """A pickle that would call os.system while it loads (any global at all) is refused; plain data loads."""
    import os
    import pickle

    from ddpdoctor.flight.plain_pickle import UnpicklingError, loads_plain

    marker = tmp_path / "owned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with pytest.raises(UnpicklingError, match="refuses to load"):
        loads_plain(pickle.dumps({"entries": [Evil()]}))
    assert not marker.exists()
    with pytest.raises(UnpicklingError):
        loads_plain(pickle.dumps(range(3)))  # a builtin class is a global too
    plain = {"version": "2.10", "entries": [{"frames": [("f", 1)], "sizes": [[4]], "x": None, "ok": True}]}
    assert loads_plain(pickle.dumps(plain)) == plain


# --------------------------------------------------------------------- rule conditions: the safe evaluator
@pytest.mark.parametrize(
    ("source", "values"),
    [
        ("mean(step_ms_median) ** 64 > 1", {"step_ms_median": 1e300}),  # overflow at evaluation time
        ("(mean(step_ms_median) * -1) ** 0.5 > 1", {"step_ms_median": 4.0}),  # a complex number
        ("mean(step_ms_median) ** -1 > 1", {"step_ms_median": 0.0}),  # 0 to a negative power
        ("mean(step_ms_median) % mean(dataloader_ms) > 1", {"step_ms_median": 1.0, "dataloader_ms": 0.0}),
    ],
)
def test_arithmetic_errors_at_evaluation_are_expression_errors(source, values) -> None:
    expr = compile_expr(source, scope="run")
    try:
        result = evaluate(expr, Values({}, [{"rank": 0, **values}], {}))
    except ExprError:
        return  # reported as "could not be evaluated", never a traceback
    assert result in (True, False, None)


@pytest.mark.parametrize(
    "source",
    [
        "__import__",
        "params.__init__.__globals__",
        "params.min_ms.__class__",
        "step_ms_median.__class__.__mro__",
        "'' .join",
        "type(params)",
        "vars()",
        "breakpoint()",
        "compile('1', 'x', 'eval')",
        "mean.__globals__",
        "(lambda: 0).__code__",
        "[].__class__.__base__.__subclasses__()",
        "params.min_ms ** 65",
        "10 ** 10 ** 10",
        "pow(10, 10 ** 8)",
    ],
)
def test_more_hostile_conditions_are_refused_before_evaluation(source) -> None:
    # tests/unit/test_rules.py covers imports, dunders and huge powers; these are further spellings of them
    with pytest.raises(ExprError):
        compile_expr(source, scope="rank", params={"min_ms": 1.0})


# -------------------------------------------------------------------------------------------- servers
def test_tensorboard_listens_on_this_machine_only_by_default(tmp_path) -> None:
    from ddpdoctor.tensorboard import server

    args = build_parser().parse_args(["view", str(tmp_path)])
    assert args.host == "127.0.0.1"
    assert inspect.signature(server.start).parameters["host"].default == "127.0.0.1"
