// The dashboard's sections, each built from the report JSON of one run (see ddpdoctor/tensorboard/report.py).
import { barChart, color, lineChart } from "./charts.js";
import { el, figure, fmtBytes, fmtGbps, fmtMs, fmtNum, fmtRatio, groupBy, isNum, mean, note, section, table }
  from "./dom.js";

const PART_LABELS = {
  dataloader_ms: "data loading", forward_ms: "forward", backward_ms: "backward", optimizer_ms: "optimizer",
  exposed_comm_ms: "exposed communication", other_ms: "other", dp_scatter_ms: "DP scatter",
  dp_replicate_ms: "DP replicate", dp_parallel_apply_ms: "DP parallel_apply", dp_gather_ms: "DP gather",
  dp_backward_reduce_ms: "DP backward reduce",
};

// While a rank runs, the dashboard reloads its report this often (index.js).
export const REFRESH_S = 15;
const rankLabel = (r) => `rank ${r}`;
const ranksOf = (rows) => [...new Set(rows.map((r) => r.rank))].sort((a, b) => a - b);

export function summary(report) {
  const run = report.run || {};
  const facts = [
    ["run", run.name || run.path], ["mode", run.mode], ["world size", run.world_size], ["backend", run.backend],
    ["steps analysed", run.steps_analyzed],
    ["figures from", report.source === "trace" ? "the traces and capture files" : "the capture files only"],
  ];
  if (run.ddp_comm_hook) facts.push(["comm hook", run.ddp_comm_hook]);
  const overrides = report.override_lines || [];
  return el("div", { class: "summary" },
    el("dl", {}, facts.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v === null || v === undefined ? "–" : v)])),
    overrides.length ? el("p", { class: "note", "data-overrides": "" },
      `Thresholds from a config file: ${overrides.join("; ")}`) : null,
    (report.notes || []).map((n) => el("p", { class: "note" }, n)));
}

export function health(report) {
  // how a job that failed, hung or crashed ended (the text report's lines; report.py builds them)
  const lines = report.health_lines || [];
  if (!lines.length) return null;
  return section("health", report.health_title || "How the job ended", null, el("ul", {}, lines.map((line) => el("li", {}, line))));
}

export function overTime(report) {
  // a long run's "Over time" (diagnose's section, its lines as the text report shows them; report.py builds them):
  // each finding with the windows it held in, and the series' trends. Lines starting with two spaces are items of
  // the line before.
  const lines = report.over_time_lines || [];
  if (!lines.length) return null;
  const items = [];
  for (const line of lines) {
    if (line.startsWith("  ") && items.length) items[items.length - 1].sub.push(line.trim());
    else items.push({ line, sub: [] });
  }
  return section("over-time", report.over_time_title || "Over time", null,
    el("ul", { class: "over-time" }, items.map(({ line, sub }) => el("li", {}, line,
      sub.length ? el("ul", {}, sub.map((s) => el("li", { "data-over-time": "" }, s))) : null))));
}

export function findings(report) {
  const list = report.findings || [];
  const cards = list.map((f) => el("article", { class: `finding sev-${String(f.severity).replace(/[^a-z]/g, "")}`,
    "data-finding": f.name },
  el("header", {}, el("span", { class: "badge" }, f.severity), el("strong", {}, `${f.id} ${f.name}`),
    el("span", { class: "ranks" }, (f.ranks || []).length ? `ranks ${f.ranks.join(", ")}` : ""),
    isNum(f.estimated_gain_ms) ? el("span", { class: "gain" }, `could save ~${fmtMs(f.estimated_gain_ms)}/step`) : null),
  el("p", { class: "message" }, f.message),
  el("p", { class: "recommendation" }, el("b", {}, "Recommendation: "), f.recommendation),
  f.evidence && Object.keys(f.evidence).length
    ? el("details", {}, el("summary", {}, "evidence"),
      table(["term", "value"], Object.entries(f.evidence).map(([k, v]) => [k, JSON.stringify(v)])))
    : null));
  const skipped = report.not_evaluated || [];
  // why each passed rule did not fire (older documents: names only)
  const passed = report.passed_reasons || (report.passed || []).map((name) => ({ name, reason: "" }));
  return section("findings", `Findings (${list.length})`, null,
    cards.length ? cards : note("No rule fired on this run."),
    skipped.length ? el("details", { class: "not-evaluated" }, el("summary", {}, `Not evaluated (${skipped.length})`),
      el("ul", {}, skipped.map((n) => el("li", {}, el("b", {}, n.name), `: ${n.reason}`)))) : null,
    passed.length ? el("details", { class: "passed" }, el("summary", {}, `Passed (${passed.length})`),
      el("ul", {}, passed.map((p) => el("li", {}, el("b", {}, p.name), p.reason ? `: ${p.reason}` : "")))) : null);
}

export function rankTable(report) {
  // the per-rank table of the text report (report.py builds its cells): the step breakdown with the wait for
  // late ranks, or each rank's state for a run without trace
  const t = report.rank_table;
  if (!t) return null;
  const explain = t.kind === "status" ? "No trace was recorded: what the run files and dumps say of each rank."
    : "ms per step; p50/p90: step time; wait: time in collectives waiting for late ranks; overlap: share of communication hidden behind computation.";
  // of a large job, the ranks worth reading and a line saying which (report/document.py listed_ranks)
  return section("ranks", t.title, explain, table(t.columns, t.rows), t.note ? el("p", { class: "explain" }, t.note) : null);
}

export function breakdown(report) {
  const parts = report.components || [];
  const rows = report.per_step || [];
  if (parts.length && rows.length) {
    const ranks = ranksOf(rows);
    const byRank = groupBy(rows, "rank");
    const fixed = report.phase_colors || {};  // one colour per part in every chart (ddpdoctor/report/palette.py)
    const series = parts.map((p, k) => ({ name: PART_LABELS[p] || p, color: fixed[p] || color(k),
      values: ranks.map((r) => mean(byRank.get(r).map((row) => row[p]))) }));
    return section("breakdown", "Step breakdown per rank", "Mean time per profiled step, split into parts that do not overlap.",
      figure("breakdown", "ms per step", barChart({ categories: ranks.map(rankLabel), series, stacked: true, fmt: fmtMs }),
        series.map((s) => [s.name, s.color])));
  }
  const ddp = report.ddp_breakdown || [];
  if (ddp.length) {
    const keys = [["ddp_forward_ms", "forward compute"], ["ddp_backward_ms", "backward compute"],
      ["ddp_backward_comm_ms", "backward communication"], ["ddp_overlap_ms", "communication overlapped"]];
    const series = keys.map(([k, name], i) => ({ name, color: color(i), values: ddp.map((r) => r[k]) }));
    return section("breakdown", "Step breakdown per rank",
      "As DistributedDataParallel's own logging reports it (averages over the iterations it sampled); the trace " +
      "breakdown appears once trace metrics are available.",
      figure("breakdown", "ms per iteration", barChart({ categories: ddp.map((r) => rankLabel(r.rank)), series, fmt: fmtMs }),
        series.map((s) => [s.name, s.color])));
  }
  return section("breakdown", "Step breakdown per rank", null, note("No step breakdown was measured for this run."));
}

// The step timeline (ddpdoctor/report/timeline.py) comes as an element tree, [tag, {attribute: value}, [child...]],
// text as strings: built here with createElementNS and text nodes, never parsed. Only the elements and attributes
// the timeline is made of are made; anything else is left out.
const SVG_NS = "http://www.w3.org/2000/svg";
const TIMELINE_TAGS = new Set(["svg", "g", "rect", "line", "path", "text", "title"]);
const TIMELINE_ATTRS = /^(class|role|width|height|x|y|x1|x2|y1|y2|d|fill|stroke|stroke-width|stroke-dasharray|text-anchor|data-[a-z-]+)$/;

function svgTree(node) {
  if (typeof node === "string") return document.createTextNode(node);
  const [tag, attrs, children] = Array.isArray(node) ? node : [];
  if (!TIMELINE_TAGS.has(tag)) return document.createTextNode("");
  const element = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (TIMELINE_ATTRS.test(key)) element.setAttribute(key, String(value));
  }
  for (const child of children || []) element.appendChild(svgTree(child));
  return element;
}

export function timeline(report) {
  const t = report.timeline;
  if (!t) return null;
  if (!t.steps) return section("timeline", "Step timeline", null, note(t.note));
  const choices = t.steps.flatMap((s, i) => [
    el("input", { type: "radio", name: "ddp-tl", id: `ddp-tl-${i}`, checked: i === 0 }),
    el("label", { for: `ddp-tl-${i}` }, s.label)]);
  const panels = t.steps.map((s) => el("div", { class: "tl-panel", "data-step": s.step }, svgTree(s.svg)));
  return section("timeline", "Step timeline",
    "One step of every rank on one clock: per rank, its training loop (upper row) and its collectives (lower row: " +
    "waiting for late peers, then the transfer); findings marked where they happen. Hover a part for its time.",
    el("div", { class: "tl" }, choices, panels), el("p", { class: "explain" }, t.caption));
}

export function stepTimes(report) {
  const live = report.series && report.series.ranks.length ? report.series : null;
  // every step from the always-on series (written as the job goes), else the steps of the rank files
  const rows = ((live || {}).rows || report.steps || []).filter((r) => isNum(r.step_ms));
  const profiled = (report.steps || []).filter((r) => r.profiled).map((r) => r.step);
  const counts = live ? table(["rank", "steps recorded", "last step", "last step time", "memory (last read)"],
    live.ranks.map((r) => [rankLabel(r.rank), fmtNum(r.steps), isNum(r.last_step) ? String(r.last_step) : "–",
      fmtMs(r.last_step_ms), fmtBytes(r.memory_bytes)])) : null;
  if (counts) {
    counts.setAttribute("data-table", "series");
    counts.querySelectorAll("tbody tr").forEach((tr, i) => {
      tr.setAttribute("data-rank", live.ranks[i].rank);
      tr.setAttribute("data-steps", live.ranks[i].steps);
    });
  }
  if (!rows.length) return section("step-time", "Step time", null, counts, note("No step times were recorded yet."));
  const byRank = groupBy(rows, "rank");
  const series = ranksOf(rows).map((r, k) => ({ name: rankLabel(r), color: color(k),
    points: byRank.get(r).map((row) => [row.step, row.step_ms]) }));
  const shade = profiled.length ? [Math.min(...profiled), Math.max(...profiled)] : null;
  const stride = live ? Math.max(...live.ranks.map((r) => r.stride)) : 1;
  const soFar = report.running ? ` so far (the job is running: this page reloads every ${REFRESH_S} s)` : "";
  const thinned = stride > 1 ? `; one point per ${stride} steps, the slowest of them` : "";
  const explain = live
    ? `Wall time of every step each rank recorded${soFar}, from its always-on series${thinned}; the shaded steps were profiled.`
    : "Wall time of every step; the shaded steps were profiled.";
  return section("step-time", report.running ? "Step time (live)" : "Step time", explain, counts,
    figure("step-time", "ms per step", lineChart({ series, fmt: fmtMs, shade, shadeLabel: "profiled steps" }),
      series.map((s) => [s.name, s.color])));
}

export function overlap(report) {
  const rows = (report.per_step || []).filter((r) => isNum(r.overlap_ratio));
  if (rows.length) {
    const steps = [...new Set(rows.map((r) => r.step))].sort((a, b) => a - b);
    const ranks = ranksOf(rows);
    const series = ranks.map((r, k) => ({ name: rankLabel(r), color: color(k),
      values: steps.map((s) => (rows.find((row) => row.rank === r && row.step === s) || {}).overlap_ratio) }));
    return section("overlap", "Communication / computation overlap per step",
      "Share of each step's communication hidden behind computation (higher is better).",
      figure("overlap", "overlap (0-100%)", barChart({ categories: steps.map((s) => `step ${s}`), series, fmt: fmtRatio }),
        series.map((s) => [s.name, s.color])));
  }
  const ddp = (report.rank_metrics || []).filter((r) => isNum(r.ddp_reported_overlap_ratio));
  if (ddp.length) {
    const series = [{ name: "overlap reported by DDP", color: color(0), values: ddp.map((r) => r.ddp_reported_overlap_ratio) }];
    return section("overlap", "Communication / computation overlap",
      "Per-step overlap needs trace metrics; this is the overlap DistributedDataParallel's own logging reports.",
      figure("overlap", "overlap (0-100%)", barChart({ categories: ddp.map((r) => rankLabel(r.rank)), series, fmt: fmtRatio }),
        series.map((s) => [s.name, s.color])));
  }
  return section("overlap", "Communication / computation overlap", null, note("No communication was measured."));
}

export function memory(report) {
  const rows = (report.devices || []).filter((r) => isNum(r.peak_reserved_bytes) || isNum(r.peak_allocated_bytes));
  if (!rows.length) {
    return section("memory", "Memory per device", null,
      note("No CUDA device memory was recorded (a CPU run, or no allocation on a GPU)."));
  }
  const categories = rows.map((r) => `rank ${r.rank} ${r.device}`);
  const series = [
    { name: "peak reserved", color: color(0), values: rows.map((r) => r.peak_reserved_bytes) },
    { name: "peak allocated", color: color(1), values: rows.map((r) => r.peak_allocated_bytes) },
  ];
  const markers = rows.map((r, index) => ({ index, value: r.capacity_bytes, label: "capacity" }))
    .filter((m) => isNum(m.value));
  return section("memory", "Memory per device", "Peak memory of each rank on each device it used, against the device's capacity.",
    figure("memory", "bytes", barChart({ categories, series, markers, fmt: fmtBytes }),
      [...series.map((s) => [s.name, s.color]), ["capacity", "#444444"]]));
}

export function collectives(report) {
  const rows = report.collectives || [];
  if (!rows.length) {
    return section("collectives", "Collectives", null,
      note(report.source === "trace" ? "No collective was found in the traces." : "Collective statistics need trace metrics."));
  }
  const labelled = rows.map((r) => ({ ...r, label: `rank ${r.rank} ${r.kind}` }));
  const series = [{ name: "bus bandwidth", color: color(2), values: labelled.map((r) => r.busbw_gbps) }];
  return section("collectives", "Collectives", "Bus bandwidth follows the nccl-tests convention: compare it with the link speed.",
    figure("busbw", "GB/s", barChart({ categories: labelled.map((r) => r.label), series, fmt: fmtGbps }),
      series.map((s) => [s.name, s.color])),
    table(["rank", "kind", "calls", "bytes", "time", "algbw", "busbw"], labelled.map((r) => [String(r.rank),
      String(r.kind), fmtNum(r.count), fmtBytes(r.bytes), fmtMs(r.ms), fmtGbps(r.algbw_gbps), fmtGbps(r.busbw_gbps)])));
}

export function skew(report) {
  const ranks = (report.rank_metrics || []).filter((r) => isNum(r.step_ms_median));
  if (!ranks.length) return section("skew", "Rank skew", null, note("No step times per rank."));
  const run = report.run_metrics || {};
  const series = [{ name: "median step time", color: color(0), values: ranks.map((r) => r.step_ms_median) }];
  if (ranks.some((r) => isNum(r.late_arrival_ms))) {
    series.push({ name: "late arrival at collectives", color: color(3), values: ranks.map((r) => r.late_arrival_ms) });
  }
  const facts = [["step skew", isNum(run.step_skew_ratio) ? `${run.step_skew_ratio.toFixed(2)}×` : "–"],
    ["straggler", isNum(run.straggler_rank) ? rankLabel(run.straggler_rank) : "none found"],
    ["others wait for it", fmtMs(run.straggler_wait_ms)]];
  return section("skew", "Rank skew", "Median step time per rank; a straggler makes every other rank wait in each collective.",
    figure("skew", "ms", barChart({ categories: ranks.map((r) => rankLabel(r.rank)), series, fmt: fmtMs }),
      series.map((s) => [s.name, s.color])),
    el("dl", { class: "facts" }, facts.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])));
}

export function gil(report) {
  const rows = (report.steps || []).filter((r) => isNum(r.gil_contention));
  if (!rows.length) return null;
  const byRank = groupBy(rows, "rank");
  const series = ranksOf(rows).map((r, k) => ({ name: rankLabel(r), color: color(k),
    points: byRank.get(r).map((row) => [row.step, row.gil_contention]) }));
  return section("gil", "GIL contention", "Share of time Python threads waited for the GIL, per step (gilknocker).",
    figure("gil", "contention (0-100%)", lineChart({ series, fmt: fmtRatio }), series.map((s) => [s.name, s.color])));
}

export function trials(report) {
  const rows = (report.run || {}).trials || [];
  if (!rows.length) return null;
  const signed = (v) => (isNum(v) ? `${v >= 0 ? "+" : ""}${v.toFixed(1)}` : "–");
  const gain = (t) => (isNum(t.gain_ms) ? `${signed(t.gain_ms)} ms/step` + (t.gain_interval_ms && t.gain_interval_ms.every(isNum)
    ? ` [${signed(t.gain_interval_ms[0])}, ${signed(t.gain_interval_ms[1])}]` : "") : "–");
  const estimates = (t) => (t.estimates || []).filter((e) => isNum(e.estimated_gain_ms))
    .map((e) => `${e.rule} ${e.estimated_gain_ms.toFixed(1)} ms`).join("; ");
  const changes = (t) => [t.went_away && t.went_away.length ? `gone: ${t.went_away.join(", ")}` : "",
    t.appeared && t.appeared.length ? `new: ${t.appeared.join(", ")}` : ""].filter(Boolean).join("; ");
  return section("trials", `Trials of this run (${rows.length})`,
    "Knobs `ddpdoctor try` applied, each measured against control runs of the same steps; an interval that holds 0 is no measurable effect.",
    table(["setting", "verdict", "median step B/A", "measured gain", "estimated", "findings"], rows.map((t) => [
      String(t.settings), t.error ? `failed: ${t.error}` : String(t.verdict), isNum(t.step_ratio) ? t.step_ratio.toFixed(2) : "–",
      gain(t), estimates(t), changes(t)])));
}
