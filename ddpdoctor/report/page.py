"""The frame of every HTML document ddpdoctor writes (diagnosis, comparison, gate): one stylesheet, inline, and
nothing loaded from anywhere. The title is escaped here; the parts are HTML the renderers escaped already."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

from ddpdoctor.report import fmt

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}h1{font-size:1.5em;margin-bottom:.2em}
h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}h3{font-size:1em;margin-top:1.2em}
.facts{color:#666}.headline{font-size:1.15em;font-weight:bold;margin:.3em 0}.caveat{color:#8a5a00}
.finding{border-left:5px solid #999;padding:.4em .9em;margin:.8em 0;background:#fafafa}
.finding.error{border-color:#d62728}.finding.warning{border-color:#f0a30a}.finding.info{border-color:#1f77b4}
.sev{font-weight:bold;text-transform:uppercase;font-size:.85em}.gain{float:right;font-weight:bold}
.rec{color:#225522}table{border-collapse:collapse;margin:.5em 0}
td,th{border-bottom:1px solid #e4e4e4;padding:3px 9px;text-align:right}th{background:#f3f3f3}
td.l,th.l{text-align:left}.ev td{font-size:.85em;color:#555}svg text{font:11px sans-serif;fill:#333}
svg .lg{font-size:11px}svg .grid{stroke:#ddd}.note{color:#777;font-size:.9em}
.fail{color:#d62728;font-weight:bold}.warn{color:#8a5a00}.ok{color:#225522}
"""


def write_page(stream: TextIO, title: str, parts: Iterable[str]) -> None:
    """Write one self-contained HTML document: ``title`` (plain text, escaped here) and the body ``parts``."""
    stream.write(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{fmt.esc(title)}</title><style>{CSS}</style></head><body>\n"
    )
    stream.write("\n".join(parts))
    stream.write("\n</body></html>\n")
