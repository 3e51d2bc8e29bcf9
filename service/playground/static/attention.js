// Panels 1 and 2: scores to weights (POST /v1/softmax), and attention's weights as heatmaps with the per-head
// inspection and the norm-based weights (POST /v1/attention).

import {
  $,
  api,
  failChart,
  fmt,
  parseNumbers,
  problem,
  rng,
  serialized,
  showChart,
  showError,
  tensor,
  wholeNumber,
} from "./common.js";
import { drawBars, drawHeatmap } from "./charts.js";

// ------------------------------------------------------------------ panel 1: scores to weights

function failSoftmax(message) {
  failChart($("bars"), "softmax-error", message);
  for (const id of ["entropy", "effective-support", "support"]) $(id).textContent = "–";
}

export const softmaxPanel = serialized(async () => {
  const normalizer = $("normalizer").value;
  const temperature = Number($("temperature").value);
  $("temperature-value").textContent = temperature.toFixed(1);
  $("alpha-label").hidden = normalizer !== "entmax";
  let scores;
  try {
    scores = parseNumbers($("scores").value);
    $("scores").removeAttribute("aria-invalid");
  } catch (e) {
    $("scores").setAttribute("aria-invalid", "true");
    failSoftmax(`Scores: ${e.message}`);
    return;
  }
  const body = { logits: scores, temperature, normalizer, precision: "float64" };
  if (normalizer === "entmax") body.alpha = Number($("alpha").value);
  const result = await api("v1/softmax", body);
  if (!result.ok) {
    failSoftmax(problem(result));
    return;
  }
  const p = result.body.probabilities;
  const svg = $("bars");
  showChart(svg, "softmax-error");
  drawBars(
    svg,
    p,
    scores.map((s, i) => `${i}: ${s}`),
  );
  const entropy = Number(result.body.diagnostics.entropy);
  $("entropy").textContent = fmt(entropy, 4);
  $("effective-support").textContent = fmt(Math.exp(entropy), 2);
  $("support").textContent = `${p.filter((x) => x > 0).length} of ${p.length}`;
  svg.dataset.key = `${normalizer}|${temperature.toFixed(1)}|${scores.join(",")}`;
});

$("preset").addEventListener("change", () => {
  if ($("preset").value) $("scores").value = $("preset").value;
  softmaxPanel();
});
$("scores").addEventListener("input", () => {
  $("preset").value = "";
  softmaxPanel();
});
for (const id of ["temperature", "normalizer", "alpha"]) $(id).addEventListener("input", softmaxPanel);

// ------------------------------------------------------------------ panel 2: heatmap

// A pasted JSON field; a field that does not parse is marked invalid and named in the error.
function pastedJSON(id, name) {
  try {
    const value = JSON.parse($(id).value);
    $(id).removeAttribute("aria-invalid");
    return value;
  } catch (e) {
    $(id).setAttribute("aria-invalid", "true");
    throw new Error(`${name}: ${e.message}`);
  }
}

// The rows of a nested list (its last-but-one axis): L of a query, S of a key; 0 for what is not one.
function rowCount(t) {
  let x = t;
  while (Array.isArray(x) && Array.isArray(x[0]) && Array.isArray(x[0][0])) x = x[0];
  return Array.isArray(x) ? x.length : 0;
}

function qkInputs() {
  let inputs;
  if ($("qk-source").value === "pasted") {
    const query = pastedJSON("pasted-query", "query");
    const key = pastedJSON("pasted-key", "key");
    inputs = { query, key, value: key };
  } else {
    const heads = Number($("heads").value);
    const length = Number($("length").value);
    const dim = Number($("dim").value);
    const next = rng(Number($("seed").value) * 7919 + 1);
    const query = [tensor(next, [heads, length, dim])];
    const key = [tensor(next, [heads, length, dim])];
    inputs = { query, key, value: key };
  }
  const maskKind = $("mask-kind").value;
  if (maskKind === "pasted") {
    inputs.mask = pastedJSON("pasted-mask", "mask");
  } else if (maskKind === "window") {
    // a boolean [L, S] mask (true = may attend), broadcast over batches and heads
    const L = rowCount(inputs.query);
    const S = rowCount(inputs.key);
    inputs.mask = Array.from({ length: L }, (_, i) => Array.from({ length: S }, (_, j) => Math.abs(i - j) <= 2));
  }
  return inputs;
}

function failHeatmap(message) {
  const container = $("heatmaps");
  container.textContent = "";
  delete container.dataset.key;
  delete container.dataset.mask;
  delete container.dataset.scale;
  container.dataset.state = "error";
  $("head-diagnostics").querySelector("tbody").textContent = "";
  $("head-diagnostics").hidden = true;
  clearInspection();
  $("heat-summary").textContent = "";
  showError("heat-error", message);
}

// ------------------------------------------------------------------ panel 2: per-head inspection

// The values of inspection.heads[] the table shows, each recorded exactly on its row as data-* (read by the tests).
const INSPECTION_COLUMNS = [
  ["sink_mass", 3, true],
  ["spectral_norm", 2, false],
  ["previous_token_score", 3, true],
  ["duplicate_token_score", 3, true],
  ["induction_score", 3, true],
  ["norm_max_share", 3, true],
];
const camel = (name) => name.replace(/_(\w)/g, (_, c) => c.toUpperCase());

// The token ids follow the sequence length (1 2 3 1 2 3 ..., S of them, when L = S; none otherwise) until the
// field is edited; from then on the field is sent as typed, so ids that do not match S are the server's 422.
let tokensFollowLength = true;
const defaultTokens = (S) => Array.from({ length: S }, (_, i) => (i % 3) + 1).join(" ");

// The token ids of the field, [S] integers, or null when it is empty (no pattern scores).
function tokenIds(L, S) {
  const input = $("token-ids");
  if (tokensFollowLength) input.value = L === S && S > 0 ? defaultTokens(S) : "";
  const parts = input.value.split(/[\s,]+/).filter((p) => p.length > 0);
  const bad = parts.find((p) => !/^-?\d+$/.test(p) || !Number.isSafeInteger(Number(p)));
  if (bad !== undefined) {
    input.setAttribute("aria-invalid", "true");
    throw new Error(`token ids: "${bad}" is not a whole number (integers separated by spaces or commas)`);
  }
  input.removeAttribute("aria-invalid");
  return parts.length > 0 ? parts.map(Number) : null;
}

function clearInspection() {
  const table = $("head-inspection");
  table.querySelector("tbody").textContent = "";
  table.hidden = true;
  delete table.dataset.key;
  clearNorms();
}

function clearNorms() {
  const norms = $("norm-heatmaps");
  norms.textContent = "";
  norms.hidden = true;
  delete norms.dataset.key;
  delete norms.dataset.max;
}

// One row per (batch, head) of the answer's inspection: numbers, and a meter for those between 0 and 1.
function drawInspection(report) {
  const table = $("head-inspection");
  const tbody = table.querySelector("tbody");
  tbody.textContent = "";
  for (const h of report.heads) {
    const row = document.createElement("tr");
    row.dataset.head = String(h.head);
    row.dataset.batch = String(h.batch);
    const head = document.createElement("td");
    head.textContent = String(h.head);
    row.appendChild(head);
    for (const [name, digits, unit] of INSPECTION_COLUMNS) {
      const td = document.createElement("td");
      const v = h[name];
      if (typeof v !== "number") {
        td.textContent = "–";
        td.className = "none";
        td.title = "needs token ids (L = S)";
      } else {
        row.dataset[camel(name)] = String(v);
        td.textContent = fmt(v, digits);
        if (unit) {
          const meter = document.createElement("meter");
          Object.assign(meter, { min: 0, max: 1, value: v });
          meter.setAttribute("aria-hidden", "true");
          td.appendChild(meter);
        }
      }
      row.appendChild(td);
    }
    tbody.appendChild(row);
  }
  const sinks = report.sink_positions > 0 ? `sink mass on keys 0–${report.sink_positions - 1}` : "no sink positions";
  table.querySelector("caption").textContent = `per-head inspection · ${sinks} · spectral norm of scale·QKᵀ/T`;
  table.hidden = false;
}

// The norm-based weights ||A_ij v_j|| of the first batch entry, one heatmap per head, on their own colour scale
// (0 to the largest unmasked value of every head shown).
function drawNormHeatmaps(norms, masked) {
  let top = 0;
  norms.forEach((w, h) => w.forEach((row, i) => row.forEach((v, j) => (top = masked[h][i][j] ? top : Math.max(top, v)))));
  const scale = {
    max: top > 0 ? top : 1,
    title: "‖Av‖, 0–max",
    label: top > 0 ? `0 to the largest norm shown (${top.toFixed(3)})` : "0 to 1 (no norm above 0)",
    kind: "norm",
    noun: "norm",
    plural: "norm-based weights ‖A_ij v_j‖",
  };
  const container = $("norm-heatmaps");
  container.textContent = "";
  norms.forEach((w, h) => drawHeatmap(container, w, masked[h], h, scale));
  container.dataset.max = String(top);
  container.hidden = false;
  return scale;
}

export const heatmapPanel = serialized(async () => {
  const temperature = Number($("heat-temperature").value);
  $("heat-temperature-value").textContent = temperature.toFixed(1);
  $("pasted-inputs").hidden = $("qk-source").value !== "pasted";
  $("mask-input").hidden = $("mask-kind").value !== "pasted";
  let inputs;
  let tokens;
  let sinkPositions;
  try {
    inputs = qkInputs();
    tokens = tokenIds(rowCount(inputs.query), rowCount(inputs.key));
    sinkPositions = wholeNumber("sink-positions", "sink positions");
  } catch (e) {
    failHeatmap(e.message);
    return;
  }
  const showNorms = $("norm-toggle").checked;
  const body = {
    ...inputs,
    causal: $("causal").checked,
    normalizer: $("heat-normalizer").value,
    temperature,
    precision: "float64",
    return: ["weights", "scores", "diagnostics", "inspection", ...(showNorms ? ["norm_weights"] : [])],
    sink_positions: sinkPositions,
  };
  if (tokens) body.token_ids = [tokens]; // [B, S], B = 1
  if ($("exclude-bos").checked) body.exclude_bos = true;
  if ($("exclude-current").checked) body.exclude_current_token = true;
  if (rowCount(inputs.key) > 0) $("valid-keys").max = String(rowCount(inputs.key)); // a key length counts keys: 0 to S
  if ($("padding").checked) {
    const batches = Array.isArray(inputs.query?.[0]?.[0]?.[0]) ? inputs.query.length : 1;
    body.key_lengths = Array(batches).fill(Number($("valid-keys").value));
  }
  const result = await api("v1/attention", body);
  if (!result.ok) {
    failHeatmap(problem(result));
    return;
  }
  showError("heat-error", "");
  const toBHLS = (t) => {
    let x = t;
    while (!Array.isArray(x[0][0][0])) x = [x];
    return x;
  };
  const weights = toBHLS(result.body.weights);
  // masked = the score is -inf (null in JSON): what the request's causal mask, key lengths and mask removed
  const scores = toBHLS(result.body.scores);
  const masked = scores[0].map((head) => head.map((row) => row.map((s) => s === null)));
  let scale = { max: 1, title: "weight, 0–1", label: "weights on the fixed 0 to 1 scale" };
  if ($("heat-scale").value === "data") {
    let top = 0;
    weights[0].forEach((w, h) => w.forEach((row, i) => row.forEach((v, j) => (top = masked[h][i][j] ? top : Math.max(top, v)))));
    scale =
      top > 0
        ? { max: top, title: "weight, 0–max", label: `0 to the largest weight shown (${top.toFixed(3)})` }
        : { max: 1, title: "weight, 0–1", label: "0 to 1 (no unmasked weight above 0 to scale to)" };
  }
  const container = $("heatmaps");
  container.textContent = "";
  container.dataset.state = "ok";
  weights[0].forEach((w, h) => drawHeatmap(container, w, masked[h], h, scale));
  const diagnostics = result.body.diagnostics;
  $("head-diagnostics").hidden = false;
  const tbody = $("head-diagnostics").querySelector("tbody");
  tbody.textContent = "";
  for (const h of diagnostics.heads) {
    const row = document.createElement("tr");
    const flags = [h.collapsed ? "collapsed" : "", h.uniform ? "uniform" : ""].filter(Boolean).join(", ") || "–";
    for (const value of [h.head, fmt(h.mean_entropy, 3), fmt(h.mean_normalized_entropy, 3), fmt(h.mean_distance, 2), flags]) {
      const td = document.createElement("td");
      td.textContent = String(value);
      row.appendChild(td);
    }
    tbody.appendChild(row);
  }
  drawInspection(result.body.inspection);
  const normScale = showNorms ? drawNormHeatmaps(toBHLS(result.body.norm_weights)[0], masked) : null;
  if (!showNorms) clearNorms();
  $("heat-summary").textContent =
    `colour: ${scale.label}${normScale ? `; norm-based weights (V = K here): ${normScale.label}` : ""}; hatched: masked (score −∞) · ` +
    `fully masked rows ${diagnostics.fully_masked_rows} · saturated rows ${diagnostics.saturated_rows} · ` +
    `${tokens ? `token ids ${tokens.join(" ")}` : "no token ids: no pattern scores"} · engine ${result.body.engine.name}`;
  container.dataset.key = `${body.causal}|${$("padding").checked}|${body.normalizer}|${temperature.toFixed(1)}`;
  const inspectionKey = `${tokens ? tokens.join(" ") : "none"}|${sinkPositions}|${!!body.exclude_bos}|${!!body.exclude_current_token}`;
  $("head-inspection").dataset.key = inspectionKey;
  if (showNorms) $("norm-heatmaps").dataset.key = container.dataset.key;
  container.dataset.mask = $("mask-kind").value;
  container.dataset.scale = $("heat-scale").value;
});

// one redraw per change: "change" for check boxes and menus, "input" (each keystroke, each step) for the rest
for (const id of ["qk-source", "causal", "padding", "heat-normalizer", "mask-kind", "heat-scale", "exclude-bos", "exclude-current", "norm-toggle"]) {
  $(id).addEventListener("change", heatmapPanel);
}
for (const id of ["seed", "heads", "length", "dim", "valid-keys", "heat-temperature", "pasted-query", "pasted-key", "pasted-mask", "sink-positions"]) {
  $(id).addEventListener("input", heatmapPanel);
}
$("token-ids").addEventListener("input", () => {
  tokensFollowLength = false;
  heatmapPanel();
});
