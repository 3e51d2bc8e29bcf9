// Panel 5: decoding with an attention session (POST /v1/sessions/{sequence_id}/steps, DELETE to end it).

import {
  $,
  api,
  apiKey,
  clear,
  describe,
  el,
  failChart,
  fmt,
  hasRoute,
  problem,
  rng,
  showChart,
  tensor,
  text,
  wholeNumber,
} from "./common.js";
import { axisTicks, drawLines } from "./charts.js";

// ------------------------------------------------------------------ panel 5: decoding with a session

const STEPS_PATH = "/v1/sessions/{sequence_id}/steps";
const DECODE_OUTPUTS = ["dec-cache-length", "dec-positions-seen", "dec-steps", "dec-entropy", "dec-sink-mass", "dec-max-weight"];
// what #dec-bars records of the step it shows (data-*, read by the browser tests)
const DECODE_DATA = ["sequence", "head", "cacheLength", "positionsSeen", "steps", "entropy", "sinkMass", "maxWeight"];
const DECODE_HELP = $("dec-summary").textContent;

// The sequence this page decodes: its id and the settings fixed at its start, the positions seen so far and
// those its cache keeps, the last answer's newest row of weights per head, and per step (the start is step 0)
// the newest row's entropy, sink mass and largest weight per head.
let decoding = null;

// A fresh string id per Start: "playground-" and 16 hex digits (never all digits, which would name an integer id).
function sessionId() {
  const bytes = crypto.getRandomValues(new Uint8Array(8));
  return `playground-${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

// Q, K and V of one position, (heads, E) each, drawn from the seed and the position alone: a position's tensors
// are the same whether it came in the prompt or in a step of its own.
function tokenQKV(seq, position) {
  const next = rng(Math.imul(seq.seed + 1, 0x9e3779b1) ^ Math.imul(position + 1, 0x85ebca6b));
  return [0, 1, 2].map(() => tensor(next, [seq.heads, seq.dim]));
}

// Positions first .. first + count - 1 as one step's query, key and value: (heads, count, E) each.
function stepTensors(seq, first, count) {
  const tokens = Array.from({ length: count }, (_, i) => tokenQKV(seq, first + i));
  const [query, key, value] = [0, 1, 2].map((k) => Array.from({ length: seq.heads }, (_, h) => tokens.map((t) => t[k][h])));
  return { query, key, value };
}

// The positions a cache keeps once `seen` were appended: all of them, or with a window the first `sinks` and the
// last `window` others (docs/guides/sessions.md, "Limits and eviction").
function keptPositions(seq, seen) {
  const all = (from, count) => Array.from({ length: count }, (_, i) => from + i);
  if (!seq.window) return all(0, seen);
  const sinks = Math.min(seq.sinks, seen);
  const rest = Math.min(seq.window, seen - sinks);
  return [...all(0, sinks), ...all(seen - rest, rest)];
}

// Every k-th value of 0 .. n - 1, k = 1, 2 or 5 times a power of ten, at most 16 of them.
function everyFew(n) {
  let k = 1;
  while (n / k > 16) k = [2, 5, 10].map((f) => f * 10 ** Math.floor(Math.log10(k) + 1e-9)).find((x) => x > k);
  return Array.from({ length: Math.ceil(n / k) }, (_, i) => i * k);
}

// One row of weights over the sequence's positions 0 .. seen - 1: a bar per kept position (the positions sink
// mass counts in their own colour), a hatched band where the window evicted positions.
function drawCache(svg, row, kept, seen, sinkPositions) {
  clear(svg);
  const left = 56;
  const right = 624;
  const top = 36;
  const bottom = 196;
  const slot = (right - left) / Math.max(seen, 1);
  const px = (p) => left + p * slot;
  const { hi, ticks } = axisTicks(Math.max(...row));
  const py = (v) => bottom - (Math.max(0, v) / hi) * (bottom - top);
  const hatch = el("pattern", { id: "dec-hatch", patternUnits: "userSpaceOnUse", width: 6, height: 6, patternTransform: "rotate(45)" }, el("defs", {}, svg));
  el("rect", { width: 6, height: 6, fill: "#f1f2f6" }, hatch);
  el("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#c4c9d4", "stroke-width": 2 }, hatch);

  const isKept = new Set(kept);
  const runs = [];
  for (let p = 0; p < seen; p++) {
    if (isKept.has(p)) continue;
    const run = runs[runs.length - 1];
    if (run && run.to === p - 1) run.to = p;
    else runs.push({ from: p, to: p });
  }
  for (const run of runs) {
    const width = (run.to - run.from + 1) * slot;
    const band = el("rect", { class: "evicted", x: px(run.from), y: top, width, height: bottom - top, fill: "url(#dec-hatch)", "data-from": run.from, "data-to": run.to }, svg);
    const what = run.from === run.to ? `position ${run.from}` : `positions ${run.from}–${run.to}`;
    el("title", {}, band).textContent = `${what}: evicted by the window`;
    if (width >= 60) text(svg, px(run.from) + width / 2, top + 14, "evicted", { class: "legend", "text-anchor": "middle" });
  }
  kept.forEach((p, i) => {
    const w = row[i];
    const sink = p < sinkPositions;
    const bar = el("rect", { class: sink ? "bar sink" : "bar", x: px(p) + slot * 0.12, y: py(w), width: slot * 0.76, height: bottom - py(w), "data-position": p, "data-weight": String(w) }, svg);
    el("title", {}, bar).textContent = `position ${p}${sink ? " (sink)" : ""}: weight ${w.toFixed(4)}`;
  });

  el("line", { class: "axis", x1: left, y1: bottom, x2: right, y2: bottom }, svg);
  el("line", { class: "axis", x1: left, y1: top, x2: left, y2: bottom }, svg);
  for (const tick of ticks) {
    el("line", { class: "axis", x1: left - 4, y1: py(tick.value), x2: left, y2: py(tick.value) }, svg);
    text(svg, left - 7, py(tick.value) + 4, tick.label, { class: "tick y-tick", "text-anchor": "end", "data-value": tick.value });
  }
  for (const p of everyFew(seen)) {
    el("line", { class: "axis", x1: px(p + 0.5), y1: bottom, x2: px(p + 0.5), y2: bottom + 4 }, svg);
    text(svg, px(p + 0.5), bottom + 16, String(p), { class: "tick x-tick", "text-anchor": "middle", "data-value": p });
  }
  text(svg, (left + right) / 2, bottom + 34, "position in the sequence (the newest last)", { class: "axis-title x-title", "text-anchor": "middle" });
  const ty = (top + bottom) / 2;
  text(svg, 16, ty, "weight", { class: "axis-title y-title", "text-anchor": "middle", transform: `rotate(-90 16 ${ty})` });

  const entries = [["kept", "kept"]];
  if (sinkPositions > 0) entries.push(["sink", `sink (position${sinkPositions > 1 ? `s 0–${sinkPositions - 1}` : " 0"}, counted in sink mass)`]);
  if (runs.length > 0) entries.push(["gone", "evicted by the window"]);
  let x = left;
  for (const [kind, label] of entries) {
    const entry = el("g", { class: "legend-entry", "data-kind": kind }, svg);
    el("rect", { class: `swatch ${kind}`, x, y: 8, width: 12, height: 12, ...(kind === "gone" ? { fill: "url(#dec-hatch)" } : {}) }, entry);
    text(entry, x + 17, 18, label, { class: "legend" });
    x += 40 + label.length * 6.5;
  }
  const evicted = runs.map((r) => (r.from === r.to ? `${r.from}` : `${r.from}–${r.to}`)).join(", ");
  describe(
    svg,
    `${kept.length} kept positions of ${seen}: ` + kept.map((p, i) => `${p}: ${row[i].toFixed(4)}`).join(", ") + (evicted ? `; evicted: ${evicted}` : ""),
  );
}

function setDecodeData(values) {
  const svg = $("dec-bars");
  for (const name of DECODE_DATA) {
    if (values && values[name] !== undefined) svg.dataset[name] = String(values[name]);
    else delete svg.dataset[name];
  }
}

function failDecode(message) {
  failChart($("dec-bars"), "dec-error", message);
  failChart($("dec-chart"), "dec-error", message);
  setDecodeData(null);
  for (const id of DECODE_OUTPUTS) $(id).textContent = "–";
}

// The last answer's cache (unless the sequence ended) and the history of the chosen head.
function drawDecode() {
  const seq = decoding;
  const head = Number($("dec-head").value);
  const last = seq.history[seq.history.length - 1];
  const bars = $("dec-bars");
  const chart = $("dec-chart");
  if (seq.ended) {
    clear(bars);
    bars.setAttribute("hidden", "");
    bars.dataset.state = "ended";
  } else {
    showChart(bars, "dec-error");
    drawCache(bars, seq.rows[head], seq.kept, seq.seen, seq.sinkPositions);
  }
  showChart(chart, "dec-error");
  drawLines(
    chart,
    seq.history.map((_, i) => i),
    [
      { name: "entropy (nats)", axis: "left", values: seq.history.map((s) => s.entropy[head]) },
      { name: "sink mass", axis: "right", values: seq.history.map((s) => s.sinkMass[head]) },
    ],
    { linear: true, xName: "step", xLabel: "step (0: the prompt at the start)", xTicks: everyFew(seq.history.length) },
  );
  $("dec-cache-length").textContent = String(seq.cacheLength);
  $("dec-positions-seen").textContent = String(seq.seen);
  $("dec-steps").textContent = String(seq.history.length);
  $("dec-entropy").textContent = fmt(last.entropy[head], 4);
  $("dec-sink-mass").textContent = fmt(last.sinkMass[head], 4);
  $("dec-max-weight").textContent = fmt(last.maxWeight[head], 4);
  setDecodeData({
    sequence: seq.id,
    head,
    cacheLength: seq.cacheLength,
    positionsSeen: seq.seen,
    steps: seq.history.length,
    entropy: last.entropy[head],
    sinkMass: last.sinkMass[head],
    maxWeight: last.maxWeight[head],
  });
  const kept = seq.window ? `window ${seq.window} and ${seq.sinks} sinks` : "every position kept";
  $("dec-summary").textContent = seq.ended
    ? `sequence ${seq.id} ended (DELETE): its cache is freed; Start begins a new one.`
    : `sequence ${seq.id}: ${seq.heads} heads of size ${seq.dim}, ${kept}, head ${head} shown · engine ${seq.engine} · ` +
      `a sequence idle for ATTN_SESSION_IDLE_S (default 60 s) is evicted, and its next step refused.`;
}

function stepBody(tensors) {
  const temperature = Number($("dec-temperature").value);
  const sinkPositions = wholeNumber("dec-sink-positions", "sink positions");
  return { ...tensors, normalizer: $("dec-normalizer").value, temperature, precision: "float64", sink_positions: sinkPositions, return: ["weights", "diagnostics"] };
}

// One step's request; its answer becomes the panel's state (false: refused, and the error shown).
async function decodeRequest(seq, body) {
  const result = await api(`v1/sessions/${encodeURIComponent(seq.id)}/steps`, body);
  if (!result.ok) {
    failDecode(problem(result));
    return false;
  }
  const b = result.body;
  const newest = (t) => t.map((rows) => rows[rows.length - 1]); // (heads, L_step, ...): the step's last row per head
  const numbers = (t) => newest(t).map((v) => (typeof v === "number" ? v : NaN));
  seq.seen = b.positions_seen;
  seq.cacheLength = b.cache_length;
  seq.kept = keptPositions(seq, b.positions_seen);
  seq.rows = newest(b.weights);
  seq.sinkPositions = body.sink_positions;
  seq.engine = b.engine ? b.engine.name : "";
  const d = b.diagnostics;
  seq.history.push({ entropy: numbers(d.entropy), sinkMass: numbers(d.sink_mass), maxWeight: numbers(d.max_weight) });
  drawDecode();
  return true;
}

export async function sessionsServed() {
  if (await hasRoute(STEPS_PATH)) {
    if ($("dec-summary").dataset.missing) $("dec-summary").textContent = DECODE_HELP;
    delete $("dec-summary").dataset.missing;
    return true;
  }
  failDecode("");
  $("dec-summary").textContent = `this server does not serve sessions (its /openapi.json has no POST ${STEPS_PATH})`;
  $("dec-summary").dataset.missing = "true";
  return false;
}

function headOptions(heads) {
  const select = $("dec-head");
  const chosen = Math.min(Number(select.value) || 0, heads - 1);
  select.textContent = "";
  for (let h = 0; h < heads; h++) select.appendChild(document.createElement("option")).textContent = String(h);
  select.value = String(chosen);
}

async function decodeStart() {
  if (!(await sessionsServed())) return;
  let seq;
  let body;
  try {
    seq = { heads: wholeNumber("dec-heads", "heads"), dim: wholeNumber("dec-dim", "E"), seed: wholeNumber("dec-seed", "seed"), window: null, sinks: 0 };
    const prompt = wholeNumber("dec-prompt", "prompt");
    if ($("dec-windowed").checked) {
      seq.window = wholeNumber("dec-window", "window");
      seq.sinks = wholeNumber("dec-sinks", "sinks");
    }
    body = { ...stepBody(stepTensors(seq, 0, prompt)), start: true };
  } catch (e) {
    failDecode(e.message);
    return;
  }
  if (seq.window) Object.assign(body, { window: seq.window, sinks: seq.sinks });
  if (decoding && !decoding.ended) await api(`v1/sessions/${encodeURIComponent(decoding.id)}`, undefined, "DELETE"); // the previous one's cache
  decoding = { ...seq, id: sessionId(), seen: 0, history: [], ended: false };
  headOptions(seq.heads);
  await decodeRequest(decoding, body);
}

async function decodeStep() {
  if (!(await sessionsServed())) return false;
  if (!decoding) {
    failDecode("no sequence yet: press Start first");
    return false;
  }
  let body;
  try {
    body = stepBody(stepTensors(decoding, decoding.seen, 1));
  } catch (e) {
    failDecode(e.message);
    return false;
  }
  return decodeRequest(decoding, body);
}

async function decodeEnd() {
  if (!(await sessionsServed())) return;
  if (!decoding) {
    failDecode("no sequence to end: press Start first");
    return;
  }
  const result = await api(`v1/sessions/${encodeURIComponent(decoding.id)}`, undefined, "DELETE");
  if (!result.ok) {
    failDecode(problem(result));
    return;
  }
  decoding.ended = true;
  decoding.cacheLength = 0;
  decoding.seen = result.body.positions_seen;
  drawDecode();
}

// The buttons' actions run one after another, in the order they were clicked; the panel is aria-busy meanwhile.
let decodeQueue = Promise.resolve();
let decodePending = 0;
function queued(action) {
  return () => {
    decodePending++;
    $("panel-decode").setAttribute("aria-busy", "true");
    decodeQueue = decodeQueue
      .then(action)
      .catch((e) => failDecode(String((e && e.message) || e)))
      .finally(() => {
        if (--decodePending === 0) $("panel-decode").removeAttribute("aria-busy");
      });
  };
}

$("dec-start").addEventListener("click", queued(decodeStart));
$("dec-step").addEventListener("click", queued(decodeStep));
$("dec-run").addEventListener(
  "click",
  queued(async () => {
    for (let i = 0; i < 16 && (await decodeStep()); i++);
  }),
);
$("dec-end").addEventListener("click", queued(decodeEnd));
$("dec-head").addEventListener("change", () => {
  if (decoding && decoding.history.length > 0 && $("dec-chart").dataset.state === "ok") drawDecode();
});
$("dec-temperature").addEventListener("input", () => {
  $("dec-temperature-value").textContent = Number($("dec-temperature").value).toFixed(1);
});
// Leaving the page ends its sequence (else its cache would wait ATTN_SESSION_IDLE_S for eviction).
window.addEventListener("pagehide", () => {
  if (!decoding || decoding.ended) return;
  const headers = apiKey() ? { "x-api-key": apiKey() } : {};
  fetch(`v1/sessions/${encodeURIComponent(decoding.id)}`, { method: "DELETE", headers, keepalive: true }).catch(() => {});
});
$("dec-windowed").addEventListener("change", () => {
  $("dec-window").disabled = $("dec-sinks").disabled = !$("dec-windowed").checked;
});
