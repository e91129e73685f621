"""The ``ddpdoctor`` TensorBoard plugin: a dashboard of every ddpdoctor run directory under the logdir.

Routes (under ``/data/plugin/ddpdoctor``):

- ``/index.js``: the dashboard, an ES module TensorBoard loads into its plugin iframe (``render()``); it
  imports ``/sections.js``, ``/charts.js`` and ``/dom.js``.
- ``/dashboard.html`` (``?run=NAME``): the same dashboard as a page of its own (``/standalone.js`` starts it).
- ``/runs``: ``{"runs": [{"run": NAME, "label": ...}]}``; NAME is the run directory relative to the logdir.
- ``/report?run=NAME``: the run's report (``ddpdoctor.tensorboard.report``), rebuilt when its files change.

Only run directories found under the logdir are ever read, and only by name: a request cannot name a path.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from ddpdoctor import rundir
from ddpdoctor.tensorboard.discover import find_runs

PLUGIN_NAME = "ddpdoctor"
STATIC_DIR = Path(__file__).with_name("static")
_STATIC = {
    "/index.js": ("index.js", "text/javascript"),
    "/sections.js": ("sections.js", "text/javascript"),
    "/charts.js": ("charts.js", "text/javascript"),
    "/dom.js": ("dom.js", "text/javascript"),
    "/standalone.js": ("standalone.js", "text/javascript"),
    "/dashboard.html": ("dashboard.html", "text/html"),
}
_RUNS_TTL_S = 5.0


def _signature(run_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """What a report depends on: name, size and mtime of the run's own files (top level and ``ranks/``)."""
    entries = []
    for folder in (run_dir, run_dir / rundir.RANKS_DIR):
        try:
            for path in folder.iterdir():
                if path.is_file():
                    st = path.stat()
                    entries.append((str(path.relative_to(run_dir)), st.st_size, st.st_mtime_ns))
        except OSError:
            continue
    return tuple(sorted(entries))


def _static_app(filename: str, content_type: str) -> Any:
    @wrappers.Request.application
    def serve(request: wrappers.Request) -> wrappers.Response:
        return http_util.Respond(request, (STATIC_DIR / filename).read_bytes(), content_type)

    return serve


class DDPDoctorPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        super().__init__(context)
        self._logdir = Path(context.logdir).resolve() if context.logdir else None
        self._lock = threading.Lock()
        self._runs: tuple[float, dict[str, Path]] = (0.0, {})
        self._reports: dict[str, tuple[Any, dict[str, Any]]] = {}

    # ---- TensorBoard --------------------------------------------------------------------------------------
    def get_plugin_apps(self) -> dict[str, Any]:
        apps: dict[str, Any] = {route: _static_app(*spec) for route, spec in _STATIC.items()}
        apps["/runs"] = self._runs_route
        apps["/report"] = self._report_route
        return apps

    def is_active(self) -> bool:
        return bool(self.runs())

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(
            es_module_path="/index.js", tab_name="ddpdoctor", disable_reload=True
        )

    # ---- data ---------------------------------------------------------------------------------------------
    def runs(self) -> dict[str, Path]:
        """Run name -> run directory under the logdir (rescanned at most every few seconds)."""
        if self._logdir is None:
            return {}
        with self._lock:
            stamp, runs = self._runs
            if time.monotonic() - stamp > _RUNS_TTL_S:
                runs = find_runs(self._logdir)
                self._runs = (time.monotonic(), runs)
            return runs

    def report(self, name: str) -> dict[str, Any] | None:
        """The report of run ``name``, or None when there is no such run under the logdir."""
        run_dir = self.runs().get(name)
        if run_dir is None:
            return None
        from ddpdoctor.tensorboard.report import build_report

        signature = _signature(run_dir)
        with self._lock:
            cached = self._reports.get(name)
            if cached is not None and cached[0] == signature:
                return cached[1]
        report = build_report(run_dir, name=name)
        report["run"]["name"] = run_dir.name if name == "." else name
        with self._lock:
            self._reports[name] = (signature, report)
        return report

    # ---- routes -------------------------------------------------------------------------------------------
    @wrappers.Request.application
    def _runs_route(self, request: wrappers.Request) -> wrappers.Response:
        runs = [
            {"run": name, "label": path.name if name == "." else name} for name, path in self.runs().items()
        ]
        return http_util.Respond(request, {"runs": runs}, "application/json")

    @wrappers.Request.application
    def _report_route(self, request: wrappers.Request) -> wrappers.Response:
        name = request.args.get("run")
        if not name:
            return http_util.Respond(request, {"error": "missing ?run=NAME"}, "application/json", code=400)
        try:
            report = self.report(name)
        except Exception as exc:  # the dashboard shows the error instead of a blank page
            message = f"could not build the report: {type(exc).__name__}: {exc}"
            return http_util.Respond(request, {"error": message}, "application/json", code=500)
        if report is None:
            return http_util.Respond(
                request, {"error": "no such run under the logdir"}, "application/json", code=404
            )
        return http_util.Respond(request, report, "application/json")
