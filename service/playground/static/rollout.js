// Panel 6: attention rollout across layers from a .npy or .npz stack (POST /v1/attention/rollout).

import { $, api, fmt, hasRoute, problem, serialized, showError, SVG, wholeNumber } from "./common.js";
import { drawHeatmap } from "./charts.js";

// ------------------------------------------------------------------ panel 6: rollout across layers

// A stack of attention weights from a .npy or .npz file (read by npy.js, never decoded into numbers: its bytes go
// to POST /v1/attention/rollout as the base64 tensor form), the rollout of one batch entry drawn as a heatmap.
const ROLLOUT_MAX_L = 256; // cells drawn: L * L SVG rectangles
let rolloutFile = null; // {name, kind, arrays: [{name, array} or {name, error}]}
let rolloutAnswer = null; // {key, label, rollout [B, L, L], shape, dtype}
const rolloutBase64 = new WeakMap(); // a parsed array -> its bytes in base64, encoded once

// A number from 0 to 1 from a field; a field that is not one is marked invalid and named in the error.
function fraction(id, name) {
  const input = $(id);
  const v = Number(input.value);
  if (input.value.trim() === "" || !Number.isFinite(v) || v < 0 || v > 1) {
    input.setAttribute("aria-invalid", "true");
    throw new Error(`${name}: a number from 0 to 1`);
  }
  input.removeAttribute("aria-invalid");
  return v;
}

function clearRollout() {
  const container = $("ro-heatmap");
  container.textContent = "";
  for (const name of ["key", "batch", "shape", "dtype", "max"]) delete container.dataset[name];
  $("ro-sums").querySelector("tbody").textContent = "";
  $("ro-sums-box").hidden = true;
  $("ro-summary").textContent = "";
}

function failRollout(message) {
  clearRollout();
  $("ro-heatmap").dataset.state = "error";
  showError("ro-error", message);
}

// The chosen array as the service's weights: {name, array, shape [layers, B, H, L, L]} ([layers, H, L, L] gets
// B = 1: the same bytes).
function rolloutStack() {
  const entry = rolloutFile.arrays[Number($("ro-array").value) || 0];
  const label = rolloutFile.kind === "npz" ? `${rolloutFile.name}[${entry.name}]` : rolloutFile.name;
  if (entry.error) throw new Error(entry.error);
  const a = entry.array;
  if (a.shape.length !== 4 && a.shape.length !== 5) {
    throw new Error(`${label}: shape (${a.shape.join(", ")}) has ${a.shape.length} axes; a stack is [layers, B, H, L, L] or [layers, H, L, L]`);
  }
  const shape = a.shape.length === 4 ? [a.shape[0], 1, ...a.shape.slice(1)] : a.shape.slice();
  if (shape[4] > ROLLOUT_MAX_L) throw new Error(`${label}: L = ${shape[4]}; this page draws rollouts up to L = ${ROLLOUT_MAX_L}`);
  return { name: entry.name, label, array: a, shape };
}

function rolloutKey(stack, options) {
  return `${rolloutFile.name}|${stack.name}|${options.head_fusion}|${options.residual}|${options.discard_ratio}|${options.renormalize}`;
}

// One batch entry's rollout [L, L] on a colour bar from 0 to its largest value, and its rows' sums.
function drawRollout(answer, batch) {
  const matrix = answer.rollout[batch];
  let top = 0;
  for (const row of matrix) for (const v of row) top = Math.max(top, v);
  const scale = {
    max: top > 0 ? top : 1,
    grid: 320,
    title: "share, 0–max",
    label: top > 0 ? `0 to the largest value of batch entry ${batch} (${top.toFixed(3)})` : "0 to 1 (every value 0)",
    kind: "rollout",
    noun: "share",
    plural: "rollout",
    name: `batch entry ${batch}`,
    masks: false,
    axes: ["position", "positions", "token", "tokens"],
    xTitle: "input token →",
    yTitle: "position →",
  };
  const container = $("ro-heatmap");
  container.textContent = "";
  drawHeatmap(container, matrix, matrix.map((row) => row.map(() => false)), batch, scale);
  const tbody = $("ro-sums").querySelector("tbody");
  tbody.textContent = "";
  const sums = matrix.map((row) => row.reduce((a, b) => a + b, 0));
  sums.forEach((sum, i) => {
    const tr = document.createElement("tr");
    tr.dataset.row = String(i);
    tr.dataset.sum = String(sum);
    for (const content of [String(i), fmt(sum, 6)]) {
      const td = document.createElement("td");
      td.textContent = content;
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  });
  $("ro-sums-box").hidden = false;
  const [layers, B, H, L] = answer.shape;
  const low = Math.min(...sums);
  const high = Math.max(...sums);
  $("ro-summary").textContent =
    `${answer.label}: ${layers} layers, B = ${B}, ${H} heads, L = ${L}, ${answer.dtype} · rollout of batch entry ${batch} ` +
    `(row i: how much position i draws on each input token) · row sums ${fmt(low, 6)} to ${fmt(high, 6)} · ` +
    `colour: ${scale.label}`;
  container.dataset.state = "ok";
  container.dataset.key = `${answer.key}|${batch}`;
  container.dataset.batch = String(batch);
  container.dataset.shape = answer.shape.join(",");
  container.dataset.dtype = answer.dtype;
  container.dataset.max = String(top);
}

export const rolloutPanel = serialized(async () => {
  if (!rolloutFile) return;
  if (!(await hasRoute("/v1/attention/rollout"))) {
    failRollout("this server does not serve POST /v1/attention/rollout (rollout across layers)");
    return;
  }
  let stack;
  let options;
  let batch;
  try {
    stack = rolloutStack();
    $("ro-batch").max = String(stack.shape[1] - 1);
    options = {
      head_fusion: $("ro-fusion").value,
      residual: fraction("ro-residual", "residual"),
      discard_ratio: fraction("ro-discard", "discard ratio"),
      renormalize: $("ro-renormalize").checked,
    };
    batch = wholeNumber("ro-batch", "batch entry");
  } catch (e) {
    failRollout(e.message);
    return;
  }
  const key = rolloutKey(stack, options);
  if (!rolloutAnswer || rolloutAnswer.key !== key) {
    // a new stack or new options: ask the server (another batch entry of the same answer is drawn from it)
    if (!rolloutBase64.has(stack.array)) rolloutBase64.set(stack.array, window.npyFiles.base64(stack.array.data));
    const weights = { shape: stack.shape, dtype: stack.array.dtype, b64: rolloutBase64.get(stack.array) };
    $("panel-rollout").setAttribute("aria-busy", "true");
    let result;
    try {
      result = await api("v1/attention/rollout", { weights, ...options, precision: "float64" });
    } finally {
      $("panel-rollout").removeAttribute("aria-busy");
    }
    if (!result.ok) {
      rolloutAnswer = null;
      failRollout(problem(result));
      return;
    }
    rolloutAnswer = { key, label: stack.label, rollout: result.body.rollout, shape: stack.shape, dtype: stack.array.dtype };
  }
  showError("ro-error", "");
  drawRollout(rolloutAnswer, batch);
});

// A file chosen: read it (an .npz's arrays listed in the menu, the first stack-shaped one chosen), then draw.
async function rolloutFileChosen() {
  const file = $("ro-file").files[0];
  rolloutFile = null;
  rolloutAnswer = null;
  $("ro-array").textContent = "";
  $("ro-array-label").hidden = true;
  if (!file) {
    clearRollout();
    showError("ro-error", "");
    return;
  }
  let read;
  try {
    read = await window.npyFiles.readFile(file.name, await file.arrayBuffer());
  } catch (e) {
    $("ro-file").setAttribute("aria-invalid", "true");
    failRollout(e instanceof window.npyFiles.NpyError ? e.message : `${file.name}: ${e.message}`);
    return;
  }
  $("ro-file").removeAttribute("aria-invalid");
  read.arrays.forEach((a, i) => {
    const option = document.createElement("option");
    option.value = String(i);
    option.textContent = a.error ? `${a.name} (not readable)` : `${a.name} (${a.array.shape.join(" × ")}, ${a.array.dtype})`;
    $("ro-array").appendChild(option);
  });
  const stackShaped = read.arrays.findIndex((a) => a.array && (a.array.shape.length === 4 || a.array.shape.length === 5));
  $("ro-array").value = String(Math.max(0, stackShaped));
  $("ro-array-label").hidden = read.arrays.length < 2;
  rolloutFile = { name: file.name, ...read };
  rolloutPanel();
}

$("ro-file").addEventListener("change", () => {
  rolloutFileChosen().catch((e) => failRollout(String((e && e.message) || e)));
});
for (const id of ["ro-array", "ro-fusion", "ro-renormalize"]) $(id).addEventListener("change", rolloutPanel);
for (const id of ["ro-residual", "ro-discard", "ro-batch"]) $(id).addEventListener("input", rolloutPanel);

// A new API key: the next redraw asks the service again instead of reusing the last answer.
export function forgetRollout() {
  rolloutAnswer = null;
}
