// DOM and number helpers. Text from a run (names, messages) only ever goes in as text nodes.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined && value !== false) node.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export const isNum = (v) => typeof v === "number" && Number.isFinite(v);

export function fmtMs(v) {
  if (!isNum(v)) return "–";
  return v >= 100 ? `${v.toFixed(0)} ms` : v >= 10 ? `${v.toFixed(1)} ms` : `${v.toFixed(2)} ms`;
}

export function fmtRatio(v) {
  if (!isNum(v)) return "–";
  return v !== 0 && Math.abs(v) < 0.1 ? `${(100 * v).toFixed(1)}%` : `${(100 * v).toFixed(0)}%`;
}

export function fmtBytes(v) {
  if (!isNum(v)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

export function fmtGbps(v) {
  return isNum(v) ? `${v.toFixed(v >= 10 ? 0 : 2)} GB/s` : "–";
}

export function fmtNum(v) {
  if (!isNum(v)) return "–";
  return Number.isInteger(v) ? String(v) : v.toFixed(3);
}

export function mean(values) {
  const nums = values.filter(isNum);
  return nums.length ? nums.reduce((a, b) => a + b, 0) / nums.length : null;
}

export function groupBy(rows, key) {
  const groups = new Map();
  for (const row of rows) {
    const k = row[key];
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k).push(row);
  }
  return groups;
}

// A section of the dashboard: heading, optional explanation, then content.
export function section(id, title, explanation, ...content) {
  return el("section", { class: "ddp-section", id: `ddp-${id}`, "data-section": id },
    el("h2", {}, title), explanation ? el("p", { class: "explain" }, explanation) : null, ...content);
}

// A chart with its caption and legend; data-chart names it for tests and styling.
export function figure(id, caption, svg, legendItems = []) {
  const legend = el("div", { class: "legend" },
    legendItems.map(([name, color]) => el("span", { class: "legend-item" },
      el("span", { class: "swatch", style: `background:${/^#[0-9a-f]{6}$/i.test(color) ? color : "#888"}` }), name)));
  return el("figure", { class: "chart", "data-chart": id }, el("figcaption", {}, caption), svg,
    legendItems.length ? legend : null);
}

export function note(text) {
  return el("p", { class: "empty" }, text);
}

export function table(headers, rows) {
  return el("table", { class: "ddp-table" },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c))))));
}
