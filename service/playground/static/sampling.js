// Panel 4: sampling from logits (POST /v1/sample) and calibration (POST /v1/calibrate).

import {
  $,
  api,
  clear,
  el,
  failChart,
  hasRoute,
  normal,
  parseNumbers,
  problem,
  rng,
  serialized,
  showChart,
  text,
} from "./common.js";
import { drawBars } from "./charts.js";

// ------------------------------------------------------------------ panel 4: sampling and calibration

export const samplingPanel = serialized(async () => {
  const temperature = Number($("s-temperature").value);
  const topK = Number($("top-k").value);
  const topP = Number($("top-p").value);
  const minP = Number($("min-p").value);
  $("s-temperature-value").textContent = temperature.toFixed(1);
  $("top-k-value").textContent = topK === 0 ? "off" : String(topK);
  $("top-p-value").textContent = topP.toFixed(2);
  $("min-p-value").textContent = minP.toFixed(2);
  let logits;
  try {
    logits = parseNumbers($("logits").value);
    $("logits").removeAttribute("aria-invalid");
  } catch (e) {
    $("logits").setAttribute("aria-invalid", "true");
    failChart($("sample-bars"), "sample-error", `Logits: ${e.message}`);
    $("sample-summary").textContent = "";
    return;
  }
  $("top-k").max = String(logits.length);
  const body = { logits, temperature, top_k: topK, top_p: topP, min_p: minP, seed: 0, return: ["tokens", "probabilities", "diagnostics"] };
  const svg = $("sample-bars");
  const result = (await hasRoute("/v1/sample")) ? await api("v1/sample", body) : { ok: false, status: 404, body: null };
  if (!result.ok) {
    const missing = result.status === 404;
    failChart(svg, "sample-error", missing ? "" : problem(result));
    $("sample-summary").textContent = missing ? "needs POST /v1/sample, which this server does not have yet" : "";
    return;
  }
  showChart(svg, "sample-error");
  const p = result.body.probabilities;
  const scaled = logits.map((z) => z / temperature);
  const m = Math.max(...scaled);
  const e = scaled.map((z) => Math.exp(z - m));
  const sum = e.reduce((a, b) => a + b, 0);
  const before = e.map((x) => x / sum);
  drawBars(
    svg,
    p,
    logits.map((z, i) => `${i}`),
    { heights: before.map((b, i) => (p[i] > 0 ? p[i] : b)), removed: p.map((x) => x === 0) },
  );
  const d = Array.isArray(result.body.diagnostics) ? result.body.diagnostics[0] : result.body.diagnostics;
  const kept = p.filter((x) => x > 0).length;
  $("sample-summary").textContent =
    `kept ${kept} of ${p.length} tokens` +
    (d && d.removed_mass !== undefined ? ` · removed mass ${Number(d.removed_mass).toFixed(4)}` : "") +
    (d && d.entropy !== undefined ? ` · entropy ${Number(d.entropy).toFixed(4)} nats` : "") +
    ` · drew token ${JSON.stringify(result.body.tokens)} (seed 0); grey bars: removed, at their probability before filtering`;
});

for (const id of ["logits", "s-temperature", "top-k", "top-p", "min-p"]) $(id).addEventListener("input", samplingPanel);

function syntheticCalibration(sharpness) {
  const next = rng(5);
  const n = 400;
  const classes = 5;
  const logits = [];
  const labels = [];
  for (let i = 0; i < n; i++) {
    const label = Math.floor(next() * classes);
    const favoured = next() < 0.7 ? label : Math.floor(next() * classes);
    logits.push(Array.from({ length: classes }, (_, c) => sharpness * ((c === favoured ? 1.5 : 0) + normal(next))));
    labels.push(label);
  }
  return { logits, labels };
}

function drawReliability(svg, reliability) {
  clear(svg);
  const left = 50;
  const right = 600;
  const top = 16;
  const bottom = 220;
  const px = (c) => left + c * (right - left);
  const py = (a) => bottom - a * (bottom - top);
  el("line", { class: "axis", x1: left, y1: bottom, x2: right, y2: bottom }, svg);
  el("line", { class: "axis", x1: left, y1: top, x2: left, y2: bottom }, svg);
  el("line", { class: "diagonal", x1: px(0), y1: py(0), x2: px(1), y2: py(1) }, svg);
  for (const [k, which] of [["before", "before"], ["after", "after"]].entries()) {
    for (const bin of reliability[which[0]]) {
      if (!bin.count) continue;
      const w = (px(bin.upper) - px(bin.lower)) / 2;
      const x = px(bin.lower) + k * w;
      el("rect", { class: which[1], x, y: py(bin.accuracy), width: w, height: bottom - py(bin.accuracy), "data-when": which[0], "data-accuracy": bin.accuracy, "data-confidence": bin.confidence }, svg);
    }
  }
  for (const tick of [0, 0.5, 1]) {
    text(svg, left - 6, py(tick) + 4, String(tick), { "text-anchor": "end" });
    text(svg, px(tick), bottom + 16, String(tick), { "text-anchor": "middle" });
  }
  text(svg, (left + right) / 2, bottom + 34, "confidence (bins); bar height = accuracy; dashed = perfect calibration", { "text-anchor": "middle" });
  el("rect", { class: "before", x: left + 12, y: top + 4, width: 12, height: 12 }, svg);
  text(svg, left + 30, top + 14, "before", { class: "legend" });
  el("rect", { class: "after", x: left + 12, y: top + 22, width: 12, height: 12 }, svg);
  text(svg, left + 30, top + 32, "after temperature scaling", { class: "legend" });
}

export const calibrationPanel = serialized(async () => {
  const sharpness = Number($("calib-sharpness").value);
  $("calib-sharpness-value").textContent = sharpness.toFixed(1);
  const { logits, labels } = syntheticCalibration(sharpness);
  const svg = $("reliability");
  const result = (await hasRoute("/v1/calibrate"))
    ? await api("v1/calibrate", { logits, labels, bins: 10 })
    : { ok: false, status: 404, body: null };
  if (!result.ok) {
    const missing = result.status === 404;
    failChart(svg, "calib-error", missing ? "" : problem(result));
    $("calib-summary").textContent = missing ? "needs POST /v1/calibrate, which this server does not have yet" : "";
    return;
  }
  showChart(svg, "calib-error");
  const b = result.body;
  drawReliability(svg, b.reliability);
  $("calib-summary").textContent =
    `fitted T = ${b.temperature.toFixed(3)} · ECE ${b.ece.before.toFixed(4)} → ${b.ece.after.toFixed(4)} · ` +
    `NLL ${b.nll.before.toFixed(4)} → ${b.nll.after.toFixed(4)} · accuracy ${Number(b.accuracy).toFixed(3)}`;
});

$("calib-run").addEventListener("click", calibrationPanel);
$("calib-sharpness").addEventListener("input", () => {
  $("calib-sharpness-value").textContent = Number($("calib-sharpness").value).toFixed(1);
});
