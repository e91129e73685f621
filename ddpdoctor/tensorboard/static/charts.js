// Inline SVG charts for the ddpdoctor dashboard. Every label goes in through textContent, never as markup.

const SVG_NS = "http://www.w3.org/2000/svg";
const WIDTH = 640;
const MARGIN = { left: 64, right: 12, top: 12, bottom: 36 };

export const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896"];

export function color(i) {
  return PALETTE[i % PALETTE.length];
}

export function svgEl(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

// An axis from 0 to `max` in 2-5 round steps that covers `value`.
function niceScale(value) {
  if (!(value > 0)) return { max: 1, ticks: 4 };
  const raw = value / 4;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw * 0.9999) || 10 * power;
  const ticks = Math.max(2, Math.ceil(value / step - 1e-9));
  return { max: step * ticks, ticks };
}

function canvas(height, kind) {
  const svg = svgEl("svg", { viewBox: `0 0 ${WIDTH} ${height}`, class: "chart-svg", "data-kind": kind,
    role: "img", preserveAspectRatio: "xMinYMin meet" });
  const box = { x0: MARGIN.left, y0: MARGIN.top, w: WIDTH - MARGIN.left - MARGIN.right,
    h: height - MARGIN.top - MARGIN.bottom };
  return { svg, box };
}

function yAxis(svg, box, { max, ticks }, fmt) {
  for (let i = 0; i <= ticks; i++) {
    const value = (max * i) / ticks;
    const y = box.y0 + box.h - (box.h * i) / ticks;
    svg.appendChild(svgEl("line", { x1: box.x0, x2: box.x0 + box.w, y1: y, y2: y, class: "grid" }));
    svg.appendChild(svgEl("text", { x: box.x0 - 6, y: y + 4, "text-anchor": "end", class: "tick" }, fmt(value)));
  }
}

function xLabel(svg, box, x, text) {
  svg.appendChild(svgEl("text", { x, y: box.y0 + box.h + 16, "text-anchor": "middle", class: "tick" }, text));
}

// Vertical bars. categories: x labels; series: [{name, values, color?}]; stacked or side by side.
// markers: [{index, value, label}] draws a dashed line over category `index` (e.g. a device's capacity).
export function barChart({ categories, series, stacked = false, fmt = String, height = 220, markers = [] }) {
  const { svg, box } = canvas(height, "bar");
  const totals = categories.map((_, i) =>
    stacked ? series.reduce((sum, s) => sum + (s.values[i] || 0), 0) : Math.max(0, ...series.map((s) => s.values[i] || 0)));
  const scaleY = niceScale(Math.max(0, ...totals, ...markers.map((m) => m.value || 0)));
  const max = scaleY.max;
  yAxis(svg, box, scaleY, fmt);
  const slot = box.w / Math.max(1, categories.length);
  const groupWidth = slot * 0.7;
  const scale = (v) => (box.h * v) / max;
  categories.forEach((label, i) => {
    const left = box.x0 + slot * i + (slot - groupWidth) / 2;
    let base = box.y0 + box.h;
    series.forEach((s, k) => {
      const value = s.values[i];
      if (value === null || value === undefined || !(value >= 0)) return;
      const w = stacked ? groupWidth : groupWidth / series.length;
      const x = stacked ? left : left + w * k;
      const h = scale(value);
      const y = stacked ? base - h : box.y0 + box.h - h;
      if (stacked) base -= h;
      const rect = svgEl("rect", { x, y, width: Math.max(1, w - 1), height: Math.max(0, h), fill: s.color || color(k),
        class: "bar", "data-series": s.name });
      rect.appendChild(svgEl("title", {}, `${label} · ${s.name}: ${fmt(value)}`));
      svg.appendChild(rect);
    });
    xLabel(svg, box, left + groupWidth / 2, label);
  });
  for (const m of markers) {
    const left = box.x0 + slot * m.index + (slot - groupWidth) / 2 - 4;
    const y = box.y0 + box.h - scale(m.value);
    const line = svgEl("line", { x1: left, x2: left + groupWidth + 8, y1: y, y2: y, class: "marker" });
    line.appendChild(svgEl("title", {}, `${m.label}: ${fmt(m.value)}`));
    svg.appendChild(line);
    svg.appendChild(svgEl("text", { x: left + groupWidth + 8, y: y - 3, "text-anchor": "end", class: "marker-label" },
      m.label));
  }
  return svg;
}

// Lines over a numeric x axis. series: [{name, points: [[x, y], ...], color?}]; shade: [x0, x1] highlights a range.
export function lineChart({ series, fmt = String, height = 220, shade = null, shadeLabel = "" }) {
  const { svg, box } = canvas(height, "line");
  const xs = series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = series.flatMap((s) => s.points.map((p) => p[1]));
  const xMin = Math.min(...xs);
  const xMax = Math.max(...xs);
  const scaleY = niceScale(Math.max(0, ...ys));
  const max = scaleY.max;
  const sx = (x) => box.x0 + (xMax === xMin ? box.w / 2 : ((x - xMin) / (xMax - xMin)) * box.w);
  const sy = (y) => box.y0 + box.h - (box.h * y) / max;
  if (shade) {
    const x0 = sx(Math.max(xMin, shade[0] - 0.5));
    const x1 = sx(Math.min(xMax, shade[1] + 0.5));
    const rect = svgEl("rect", { x: x0, y: box.y0, width: Math.max(2, x1 - x0), height: box.h, class: "shade" });
    rect.appendChild(svgEl("title", {}, shadeLabel));
    svg.appendChild(rect);
  }
  yAxis(svg, box, scaleY, fmt);
  const step = Math.max(1, Math.ceil((xMax - xMin + 1) / 12));
  for (let x = xMin; x <= xMax; x += step) xLabel(svg, box, sx(x), String(x));
  series.forEach((s, k) => {
    const points = s.points.filter((p) => p[1] !== null && p[1] !== undefined);
    const stroke = s.color || color(k);
    svg.appendChild(svgEl("polyline", { points: points.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" "),
      fill: "none", stroke, class: "series", "data-series": s.name }));
    for (const [x, y] of points) {
      const dot = svgEl("circle", { cx: sx(x), cy: sy(y), r: 2.5, fill: stroke, class: "point" });
      dot.appendChild(svgEl("title", {}, `${s.name} · step ${x}: ${fmt(y)}`));
      svg.appendChild(dot);
    }
  });
  return svg;
}
