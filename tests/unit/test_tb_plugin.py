"""The ddpdoctor TensorBoard plugin's routes, called as TensorBoard calls them (WSGI), without a server."""

from __future__ import annotations

import importlib.metadata
import json
import re

import pytest
from tensorboard.plugins import base_plugin
from werkzeug.test import Client

from ddpdoctor.tensorboard.loader import DDPDoctorLoader
from ddpdoctor.tensorboard.plugin import STATIC_DIR, DDPDoctorPlugin


def _plugin(logdir) -> DDPDoctorPlugin:
    plugin = DDPDoctorLoader().load(base_plugin.TBContext(logdir=str(logdir)))
    assert isinstance(plugin, DDPDoctorPlugin)
    return plugin


def _get(plugin, route, query=""):
    response = Client(plugin.get_plugin_apps()[route]).get(f"/data/plugin/ddpdoctor{route}{query}")
    return response.status_code, response


@pytest.fixture
def logdir(tmp_path):
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "manifest.json").write_text("{}")
    (tmp_path / "logs").mkdir()
    return tmp_path / "logs"


def test_registered_as_a_tensorboard_plugin():
    entry = [
        ep for ep in importlib.metadata.entry_points(group="tensorboard_plugins") if ep.name == "ddpdoctor"
    ]
    assert len(entry) == 1 and entry[0].load() is DDPDoctorLoader


def test_inactive_without_runs_active_with_one(logdir):
    assert not _plugin(logdir).is_active()
    (logdir / "exp1" / "ranks").mkdir(parents=True)
    assert _plugin(logdir).is_active()


def test_runs_route_lists_run_names_relative_to_the_logdir(logdir):
    (logdir / "a" / "b" / "ranks").mkdir(parents=True)
    status, response = _get(_plugin(logdir), "/runs")
    assert status == 200 and response.json == {"runs": [{"run": "a/b", "label": "a/b"}]}


@pytest.mark.parametrize(
    "query,status",
    [("", 400), ("?run=nope", 404), ("?run=../secret", 404), ("?run=/etc", 404), ("?run=..", 404)],
)
def test_report_serves_only_runs_found_under_the_logdir(logdir, query, status):
    (logdir / "exp1" / "ranks").mkdir(parents=True)
    code, response = _get(_plugin(logdir), "/report", query)
    assert code == status and "error" in response.json


def test_a_run_without_traces_still_gets_a_report_that_says_why(logdir):
    (logdir / "exp1" / "ranks").mkdir(parents=True)
    code, response = _get(_plugin(logdir), "/report", "?run=exp1")
    report = response.json
    assert code == 200 and report["source"] == "capture" and report["notes"]
    assert {"schema_version", "run", "ranks", "findings", "not_evaluated"} <= set(report)
    assert report["run"]["name"] == "exp1" and "logs" not in json.dumps(report["run"])  # no absolute path


def test_frontend_is_an_es_module_served_with_everything_it_imports(logdir):
    plugin = _plugin(logdir)
    assert plugin.frontend_metadata().es_module_path == "/index.js"
    apps = plugin.get_plugin_apps()
    for js in STATIC_DIR.glob("*.js"):
        for imported in re.findall(r'from "\./([\w.]+)"|import "\./([\w.]+)"', js.read_text()):
            name = "".join(imported)
            assert f"/{name}" in apps, f"{js.name} imports {name}, which the plugin does not serve"
    code, response = _get(plugin, "/index.js")
    assert code == 200 and response.mimetype == "text/javascript"
    assert "export async function render" in response.get_data(as_text=True)


def test_dashboard_code_never_parses_text_as_html():
    for js in STATIC_DIR.glob("*.js"):
        source = js.read_text()
        assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", source), js.name
        assert "http://" not in source.replace("http://www.w3.org/2000/svg", "") and "https://" not in source


def test_standalone_page_has_no_inline_script_for_tensorboards_csp(logdir):
    code, response = _get(_plugin(logdir), "/dashboard.html")
    html = response.get_data(as_text=True)
    assert code == 200 and response.mimetype == "text/html"
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", html, re.S)
    assert scripts and all(body.strip() == "" for body in scripts)
    assert 'src="./standalone.js"' in html
