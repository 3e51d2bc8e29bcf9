// The playground's SVG charts: bars of probabilities, heatmaps of weights (with their colour scale) and line charts.

import { $, clear, describe, el, text } from "./common.js";

// ------------------------------------------------------------------ bars

// Bars of probabilities on an absolute 0..1 scale; `removed` marks tokens a filter removed.
export function drawBars(svg, weights, labels, options) {
  clear(svg);
  const opts = options || {};
  const width = 640;
  const top = 24;
  const plotHeight = 170;
  const n = weights.length;
  const slot = Math.min(90, (width - 40) / n);
  el("line", { class: "axis", x1: 30, y1: top + plotHeight, x2: 30 + slot * n, y2: top + plotHeight }, svg);
  weights.forEach((w, i) => {
    const shown = opts.heights ? opts.heights[i] : w;
    const h = Math.max(0, Math.min(1, shown)) * plotHeight;
    const x = 30 + i * slot + slot * 0.15;
    const removed = opts.removed ? opts.removed[i] : false;
    const bar = el(
      "rect",
      {
        class: removed ? "bar removed" : "bar",
        x,
        y: top + plotHeight - h,
        width: slot * 0.7,
        height: h,
        "data-index": i,
        "data-weight": String(w),
        "data-removed": removed ? "true" : "false",
      },
      svg,
    );
    el("title", {}, bar).textContent = `${labels[i]}: ${w.toFixed(4)}${removed ? " (removed)" : ""}`;
    text(svg, x + slot * 0.35, top + plotHeight - h - 6, w.toFixed(4), { "text-anchor": "middle" });
    text(svg, x + slot * 0.35, top + plotHeight + 16, labels[i], { "text-anchor": "middle" });
  });
  describe(svg, weights.map((w, i) => `${labels[i]}: ${w.toFixed(4)}${opts.removed && opts.removed[i] ? " (removed)" : ""}`).join(", "));
}

// ------------------------------------------------------------------ heatmaps

// The heatmaps' colour map: white (weight 0) through blue to dark blue (the top of the scale). The colour
// bar beside each heatmap is drawn from the same stops.
const RAMP = [
  [0, [255, 255, 255]],
  [0.35, [158, 192, 240]],
  [0.7, [47, 111, 223]],
  [1, [16, 42, 110]],
];

function rampColor(t) {
  const x = Math.max(0, Math.min(1, t));
  let k = 1;
  while (k < RAMP.length - 1 && RAMP[k][0] < x) k++;
  const [t0, c0] = RAMP[k - 1];
  const [t1, c1] = RAMP[k];
  const f = (x - t0) / (t1 - t0);
  const c = c0.map((v, i) => Math.round(v + f * (c1[i] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// Five evenly spaced ticks from 0 to max, written with the digits they need.
function scaleTicks(max) {
  return [0, 0.25, 0.5, 0.75, 1].map((f) => {
    const v = f * max;
    return { value: v, label: v === 0 ? "0" : String(Number(v.toPrecision(2))) };
  });
}

let uid = 0;

// One head's weights as a grid of cells (queries down, keys across) with its colour bar. A masked cell
// (its score is -inf: the request's causal mask, key padding or explicit mask removed it) is hatched grey;
// a weight of exactly 0 that was not masked (sparsemax, entmax, relu) is white, the bottom of the scale.
// The same drawing shows the norm-based weights ||A_ij v_j|| (scale.kind "norm") and the rollout (panel 6):
// scale.noun names a cell's value, scale.plural the whole map, scale.name what one map is ("head 0" by default),
// scale.grid the grid's side in px (160), scale.masks false leaves the masked swatch out of the legend (nothing
// there can be masked), scale.axes names a row and a column ([singular, plural] of each) and scale.xTitle and
// scale.yTitle the axes.
export function drawHeatmap(container, weights, masked, head, scale) {
  const noun = scale.noun || "weight";
  const plural = scale.plural || "weights";
  const who = scale.name || `head ${head}`;
  const [rowNoun, rowsNoun, columnNoun, columnsNoun] = scale.axes || ["query", "queries", "key", "keys"];
  const L = weights.length;
  const S = weights[0].length;
  const grid = scale.grid || 160;
  const gx = 32;
  const gy = 22;
  const cell = grid / Math.max(L, S);
  const bx = gx + grid + 14; // colour bar
  const barWidth = 12;
  const id = ++uid;
  const figure = document.createElement("figure");
  const svg = el("svg", {
    viewBox: `0 0 ${grid + 102} ${grid + 56}`,
    role: "img",
    class: cell < 4 ? "heatmap fine" : "heatmap",
    "data-head": head,
    "data-kind": scale.kind || "weights",
    "data-scale-max": scale.max,
  });
  const defs = el("defs", {}, svg);
  const hatch = el("pattern", { id: `hatch-${id}`, class: "hatch", patternUnits: "userSpaceOnUse", width: 5, height: 5, patternTransform: "rotate(45)" }, defs);
  el("rect", { width: 5, height: 5, fill: "#e9ebf0" }, hatch);
  el("line", { x1: 0, y1: 0, x2: 0, y2: 5, stroke: "#7b8394", "stroke-width": 2 }, hatch);
  const gradient = el("linearGradient", { id: `ramp-${id}`, x1: 0, y1: 1, x2: 0, y2: 0 }, defs);
  for (const [t] of RAMP) el("stop", { offset: t, "stop-color": rampColor(t) }, gradient);
  const hatchFill = `url(#hatch-${id})`;

  let nMasked = 0;
  let nZero = 0;
  let min = Infinity;
  let max = -Infinity;
  for (let i = 0; i < L; i++) {
    for (let j = 0; j < S; j++) {
      const w = weights[i][j];
      const m = masked[i][j];
      const attrs = { x: gx + j * cell, y: gy + i * cell, width: cell, height: cell, "data-i": i, "data-j": j, "data-w": w, "data-masked": m };
      let title;
      if (m) {
        nMasked++;
        el("rect", { ...attrs, class: "cell masked", fill: hatchFill }, svg);
        title = `${rowNoun} ${i}, ${columnNoun} ${j}: masked`;
      } else {
        min = Math.min(min, w);
        max = Math.max(max, w);
        if (w === 0) nZero++;
        el("rect", { ...attrs, class: w === 0 ? "cell zero" : "cell", fill: rampColor(w / scale.max) }, svg);
        title = `${rowNoun} ${i}, ${columnNoun} ${j}: ${noun} ${w.toFixed(4)}`;
      }
      el("title", {}, svg.lastChild).textContent = title;
    }
  }
  const every = cell >= 14 ? 1 : cell >= 7 ? 2 : [5, 10, 20, 25, 50, 100].find((n) => n * cell >= 14) || Math.ceil(14 / cell);
  for (let j = 0; j < S; j += every) text(svg, gx + (j + 0.5) * cell, gy + grid + 11, String(j), { class: "index", "text-anchor": "middle" });
  for (let i = 0; i < L; i += every) text(svg, gx - 3, gy + (i + 0.5) * cell + 3, String(i), { class: "index", "text-anchor": "end" });
  text(svg, gx, 14, scale.xTitle || "key →", { class: "axis-title" });
  text(svg, 11, gy, scale.yTitle || "query →", { class: "axis-title", "text-anchor": "end", transform: `rotate(-90 11 ${gy})` });

  // the colour bar: the scale's ticks on its right, this head's smallest and largest weights on its left
  const by = (v) => gy + grid - (v / scale.max) * grid;
  const bar = el("g", { class: "colorbar", "data-min": 0, "data-max": scale.max }, svg);
  el("rect", { x: bx, y: gy, width: barWidth, height: grid, fill: `url(#ramp-${id})`, class: "colorbar-ramp" }, bar);
  for (const tick of scaleTicks(scale.max)) {
    el("line", { class: "axis", x1: bx + barWidth, y1: by(tick.value), x2: bx + barWidth + 3, y2: by(tick.value) }, bar);
    text(bar, bx + barWidth + 5, by(tick.value) + 3.5, tick.label, { class: "tick", "data-value": tick.value });
  }
  text(svg, bx + barWidth / 2, 14, scale.title, { class: "axis-title", "text-anchor": "middle" });
  if (Number.isFinite(min)) {
    for (const [what, v] of [["min", min], ["max", max]]) {
      const y = by(Math.min(v, scale.max));
      const mark = el("polygon", { class: `range-mark ${what}`, points: `${bx - 6},${y - 3.5} ${bx},${y} ${bx - 6},${y + 3.5}`, "data-value": v }, bar);
      el("title", {}, mark).textContent = `${what}imum ${noun} of this ${scale.name ? "map" : "head"}${scale.masks === false ? "" : " (unmasked cells)"}: ${v.toFixed(4)}`;
    }
  }

  // the legend: what hatched and white cells mean
  const ly = gy + grid + 18;
  const masks = scale.masks !== false;
  if (masks) {
    const masked0 = el("g", { class: "legend-entry", "data-kind": "masked" }, svg);
    el("rect", { x: gx, y: ly, width: 10, height: 10, fill: hatchFill, class: "swatch" }, masked0);
    text(masked0, gx + 14, ly + 9, "masked", { class: "legend" });
  }
  const zero0 = el("g", { class: "legend-entry", "data-kind": "zero" }, svg);
  el("rect", { x: masks ? gx + 66 : gx, y: ly, width: 10, height: 10, fill: rampColor(0), class: "swatch" }, zero0);
  text(zero0, masks ? gx + 80 : gx + 14, ly + 9, masks ? `${noun} 0 (not masked)` : `${noun} 0`, { class: "legend" });

  const unmasked = masks ? "unmasked " : "";
  const range = Number.isFinite(min) ? `${unmasked}${noun}s ${min.toFixed(3)} to ${max.toFixed(3)}` : "every cell masked";
  const shortRange = Number.isFinite(min) ? `${unmasked}${noun}s ${min.toFixed(3)}–${max.toFixed(3)}` : range;
  const counts = masks ? `${nMasked} masked cells, ${nZero} unmasked cells of ${noun} 0` : `${nZero} cells of ${noun} 0`;
  svg.setAttribute(
    "aria-label",
    `${plural} of ${who}: ${L} ${rowsNoun} by ${S} ${columnsNoun}, ${counts}, ${range}; colour scale ${scale.label}`,
  );
  figure.appendChild(svg);
  const caption = document.createElement("figcaption");
  caption.textContent = `${who} · ${shortRange}`;
  figure.appendChild(caption);
  container.appendChild(figure);
}

// ------------------------------------------------------------------ line charts

// Ticks from 0 to at least max at a round step (1, 2 or 5 times a power of ten), with their labels.
export function axisTicks(max) {
  const top = max > 0 && Number.isFinite(max) ? max : 1;
  const raw = top / 5;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const n = raw / magnitude;
  const step = (n <= 1 ? 1 : n <= 2 ? 2 : n <= 5 ? 5 : 10) * magnitude;
  const count = Math.ceil(top / step - 1e-9);
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const label = (v) => (v === 0 ? "0" : step < 1e-3 ? v.toExponential(1) : v.toFixed(decimals));
  const ticks = Array.from({ length: count + 1 }, (_, i) => {
    const value = Number((i * step).toPrecision(12));
    return { value, label: label(value) };
  });
  return { hi: count * step, ticks };
}

const scaleLabel = (x) => String(Number(x.toPrecision(2)));

// Lines over a log x axis (or, with options.linear, a linear one ticked at options.xTicks). Each series names its
// y axis ("left" or "right"), each axis has its own ticks from 0 and its title; the legend names every line with
// its colour, dash and marker.
export function drawLines(svg, xs, series, options) {
  clear(svg);
  const opts = options || {};
  const left = 72;
  const right = 568;
  const top = 46;
  const bottom = 232;
  const toAxis = opts.linear ? (x) => x : Math.log10;
  const xName = opts.xName || "scale";
  const xText = opts.linear ? String : scaleLabel;
  const lx = xs.map(toAxis);
  const x0 = Math.min(...lx);
  const x1 = Math.max(...lx);
  const px = (x) => left + ((toAxis(x) - x0) / (x1 - x0 || 1)) * (right - left);
  const axes = {};
  for (const side of ["left", "right"]) {
    const on = series.filter((s) => s.axis === side);
    if (on.length === 0) continue;
    const { hi, ticks } = axisTicks(Math.max(...on.flatMap((s) => s.values.filter(Number.isFinite))));
    axes[side] = { hi, ticks, title: on.length === 1 ? on[0].name : opts.yLabel, cls: on.length === 1 ? `s${series.indexOf(on[0])}` : "" };
  }
  const py = (side, v) => bottom - (v / axes[side].hi) * (bottom - top);

  // series first (the first <path> is the first series); a value that is not a finite number leaves a gap
  series.forEach((s, k) => {
    let pen = "M";
    const d = s.values
      .map((v, i) => {
        if (!Number.isFinite(v)) {
          pen = "M";
          return "";
        }
        const segment = `${pen}${px(xs[i]).toFixed(1)},${py(s.axis, v).toFixed(1)}`;
        pen = "L";
        return segment;
      })
      .filter(Boolean)
      .join(" ");
    el("path", { class: `line s${k}`, d, "data-series": s.name, "data-axis": s.axis, "data-values": JSON.stringify(s.values) }, svg);
    s.values.forEach((v, i) => {
      if (!Number.isFinite(v)) return;
      const x = px(xs[i]);
      const y = py(s.axis, v);
      const point = k === 0 ? el("circle", { class: `point s${k}`, cx: x, cy: y, r: 3 }, svg) : el("rect", { class: `point s${k}`, x: x - 3, y: y - 3, width: 6, height: 6 }, svg);
      el("title", {}, point).textContent = `${xName} ${xText(xs[i])}: ${s.name} ${v.toPrecision(3)}`;
    });
  });

  // axes, ticks and titles
  el("line", { class: "axis", x1: left, y1: bottom, x2: right, y2: bottom }, svg);
  for (const [side, axis] of Object.entries(axes)) {
    const x = side === "left" ? left : right;
    const out = side === "left" ? -1 : 1;
    el("line", { class: "axis", x1: x, y1: top, x2: x, y2: bottom }, svg);
    for (const tick of axis.ticks) {
      const y = py(side, tick.value);
      if (side === "left" && tick.value > 0) el("line", { class: "grid", x1: left, y1: y, x2: right, y2: y }, svg);
      el("line", { class: "axis", x1: x, y1: y, x2: x + out * 4, y2: y }, svg);
      text(svg, x + out * 7, y + 4, tick.label, { class: `tick y-tick ${side} ${axis.cls}`, "text-anchor": side === "left" ? "end" : "start", "data-value": tick.value });
    }
    const tx = side === "left" ? 16 : 626;
    const ty = (top + bottom) / 2;
    text(svg, tx, ty, axis.title, { class: `axis-title y-title ${side} ${axis.cls}`, "text-anchor": "middle", transform: `rotate(${side === "left" ? -90 : 90} ${tx} ${ty})` });
  }
  (opts.xTicks || xs).forEach((x) => {
    el("line", { class: "axis", x1: px(x), y1: bottom, x2: px(x), y2: bottom + 4 }, svg);
    text(svg, px(x), bottom + 16, xText(x), { class: "tick x-tick", "text-anchor": "middle", "data-value": x });
  });
  text(svg, (left + right) / 2, bottom + 36, opts.xLabel, { class: "axis-title x-title", "text-anchor": "middle" });
  if (opts.marker && opts.marker.x >= Math.min(...xs) && opts.marker.x <= Math.max(...xs)) {
    const x = px(opts.marker.x);
    el("line", { class: "reference", x1: x, y1: top, x2: x, y2: bottom }, svg);
    text(svg, x + 4, top + 10, opts.marker.label, { class: "legend" });
  }

  // the legend: one entry per line
  const legend = el("g", { class: "legend-box" }, svg);
  series.forEach((s, k) => {
    const x = left + k * 250;
    const entry = el("g", { class: "legend-entry", "data-series": s.name }, legend);
    el("line", { class: `line s${k}`, x1: x, y1: 16, x2: x + 28, y2: 16 }, entry);
    if (k === 0) el("circle", { class: `point s${k}`, cx: x + 14, cy: 16, r: 3 }, entry);
    else el("rect", { class: `point s${k}`, x: x + 11, y: 13, width: 6, height: 6 }, entry);
    const where = Object.keys(axes).length > 1 ? ` (${s.axis} axis)` : "";
    text(entry, x + 34, 20, `${s.name}${where}`, { class: "legend" });
  });
  describe(
    svg,
    `${opts.xLabel}: ${xs.map(xText).join(", ")}. ` +
      series.map((s) => `${s.name}${Object.keys(axes).length > 1 ? ` (${s.axis} axis)` : ""}: ${s.values.map((v) => v.toPrecision(3)).join(", ")}`).join("; "),
  );
}
