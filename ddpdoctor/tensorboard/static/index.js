// The ddpdoctor dashboard: TensorBoard imports this ES module into its plugin iframe and calls render().
// Self-contained: no network access beyond this plugin's own routes, charts drawn as inline SVG.
import { el } from "./dom.js";
import * as sections from "./sections.js";

const BASE = new URL("./", import.meta.url); // /data/plugin/ddpdoctor/

const STYLE = `
body { margin: 0; font: 14px/1.45 Roboto, "Helvetica Neue", Arial, sans-serif; color: #212121; background: #fafafa; }
.ddp-root { max-width: 1320px; margin: 0 auto; padding: 16px 24px 48px; }
.ddp-top { display: flex; align-items: center; gap: 16px; flex-wrap: wrap; }
.ddp-top h1 { font-size: 20px; margin: 0; } .ddp-top select { font-size: 14px; padding: 2px 6px; }
.summary dl, dl.facts { display: flex; flex-wrap: wrap; gap: 4px 20px; margin: 12px 0; }
.summary dt, dl.facts dt { color: #757575; } .summary dd, dl.facts dd { margin: 0 8px 0 0; font-weight: 500; }
.note { background: #fff8e1; border-left: 3px solid #ffb300; padding: 6px 10px; margin: 6px 0; }
.ddp-grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 16px; }
.ddp-section { background: #fff; border: 1px solid #e0e0e0; border-radius: 6px; padding: 12px 16px; }
#ddp-findings { margin: 16px 0; }
.ddp-section h2 { font-size: 16px; margin: 0 0 6px; } .explain { color: #616161; margin: 0 0 8px; }
.finding { border-left: 4px solid #9e9e9e; padding: 8px 12px; margin: 10px 0; background: #fcfcfc; }
.finding header { display: flex; gap: 10px; align-items: baseline; flex-wrap: wrap; }
.finding .badge { text-transform: uppercase; font-size: 11px; padding: 1px 6px; border-radius: 3px; color: #fff; background: #9e9e9e; }
.sev-error { border-color: #d32f2f; } .sev-error .badge { background: #d32f2f; }
.sev-warning { border-color: #f57c00; } .sev-warning .badge { background: #f57c00; }
.sev-info { border-color: #1976d2; } .sev-info .badge { background: #1976d2; }
.finding .ranks, .finding .gain { color: #616161; } .finding p { margin: 6px 0; }
.empty, .passed { color: #757575; } .not-evaluated li { margin: 2px 0; }
.chart { margin: 0; } .chart figcaption { color: #757575; font-size: 12px; }
.chart-svg { width: 100%; height: auto; display: block; }
.chart-svg .grid { stroke: #eeeeee; } .chart-svg .tick { font-size: 10px; fill: #757575; }
.chart-svg .series { stroke-width: 1.8; } .chart-svg .shade { fill: #e3f2fd; }
.chart-svg .marker { stroke: #444; stroke-width: 2; stroke-dasharray: 5 3; } .chart-svg .marker-label { font-size: 10px; fill: #444; }
.legend { display: flex; gap: 14px; flex-wrap: wrap; font-size: 12px; margin-top: 4px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
.ddp-table { border-collapse: collapse; margin-top: 8px; font-size: 12px; }
.ddp-table th, .ddp-table td { border-bottom: 1px solid #eee; padding: 3px 8px; text-align: left; }
.error { color: #c62828; }
.tl-panel { display: none; } .tl > input { margin-left: 1em; } .tl svg text { font: 11px sans-serif; fill: #333; }
.tl > input:nth-of-type(1):checked ~ .tl-panel:nth-of-type(1),
.tl > input:nth-of-type(2):checked ~ .tl-panel:nth-of-type(2) { display: block; }
.tl .tl-grid { stroke: #e4e4e4; } .tl svg text.tl-label { font-weight: bold; }
`;

async function getJSON(path, params = {}) {
  const url = new URL(path, BASE);
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
  const response = await fetch(url);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

function dashboard(report) {
  const parts = [sections.breakdown, sections.stepTimes, sections.overlap, sections.memory, sections.collectives,
    sections.skew, sections.gil].map((make) => make(report)).filter(Boolean);
  return [sections.summary(report), sections.findings(report), sections.health(report), sections.overTime(report),
    sections.timeline(report), sections.trials(report), sections.rankTable(report), el("div", { class: "ddp-grid" }, parts)]
    .filter(Boolean);
}

// What a reload keeps of the page a reader is looking at: the open <details>, the step chosen in the timeline and
// the scroll position.
function rebuild(content, parts) {
  const open = [...content.querySelectorAll("details")].map((d) => d.open);
  const checked = [...content.querySelectorAll('input[type="radio"]')].findIndex((r) => r.checked);
  const y = window.scrollY;
  content.replaceChildren(...parts);
  content.querySelectorAll("details").forEach((d, i) => { if (open[i]) d.open = true; });
  const radios = content.querySelectorAll('input[type="radio"]');
  if (checked >= 0 && radios[checked]) radios[checked].checked = true;
  window.scrollTo(0, y);
}

let shown = 0; // the latest show(): a reload of a run no longer shown is dropped
let timer = null;

async function show(root, content, run, reload = false) {
  const mine = ++shown;
  clearTimeout(timer);
  if (!reload) {
    root.dataset.state = "loading";
    content.replaceChildren(el("p", { class: "empty" }, "Loading…"));
  }
  try {
    const report = await getJSON("report", { run });
    if (mine !== shown) return;
    rebuild(content, dashboard(report));
    root.dataset.state = "ready";
    root.dataset.loads = String(Number(root.dataset.loads || 0) + 1);
    // a run in progress: its series and findings grow; reload them while a rank runs
    if (report.running) timer = setTimeout(() => show(root, content, run, true), sections.REFRESH_S * 1000);
  } catch (err) {
    if (mine !== shown) return;
    if (reload) {  // keep what is shown; try again later
      timer = setTimeout(() => show(root, content, run, true), sections.REFRESH_S * 1000);
      return;
    }
    content.replaceChildren(el("p", { class: "error" }, `Could not load run ${run}: ${err.message}`));
    root.dataset.state = "error";
  }
}

export async function render() {
  document.head.appendChild(el("style", {}, STYLE));
  const root = el("div", { class: "ddp-root", id: "ddpdoctor", "data-state": "loading" });
  const picker = el("select", { id: "ddp-run", "aria-label": "run" });
  const content = el("div", { id: "ddp-content" });
  root.append(el("div", { class: "ddp-top" }, el("h1", {}, "ddpdoctor"), picker), content);
  document.body.appendChild(root);
  let runs;
  try {
    runs = (await getJSON("runs")).runs;
  } catch (err) {
    content.replaceChildren(el("p", { class: "error" }, `Could not list runs: ${err.message}`));
    root.dataset.state = "error";
    return;
  }
  if (!runs.length) {
    content.replaceChildren(el("p", { class: "empty" },
      "No ddpdoctor run directory under the logdir (a folder with manifest.json or ranks/). " +
      "Create one with: ddpdoctor trace --out DIR train.py"));
    root.dataset.state = "ready";
    return;
  }
  for (const r of runs) picker.appendChild(el("option", { value: r.run }, r.label));
  const wanted = new URLSearchParams(window.location.search).get("run");
  picker.value = runs.some((r) => r.run === wanted) ? wanted : runs[0].run;
  picker.addEventListener("change", () => show(root, content, picker.value));
  await show(root, content, picker.value);
}
