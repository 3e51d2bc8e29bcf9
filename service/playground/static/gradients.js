// Panel 3: the normalizer's gradient health over a sweep of scales (POST /v1/attention/analyze).

import { $, api, failChart, hasRoute, problem, rng, serialized, showChart, tensor } from "./common.js";
import { drawLines } from "./charts.js";

// ------------------------------------------------------------------ panel 3: gradients

const SCALES = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50];

// aria-busy while a sweep runs (its requests take a while): assistive technology, and the tests, wait for it.
export const gradientPanel = serialized(async () => {
  const svg = $("grad-chart");
  svg.setAttribute("aria-busy", "true");
  try {
    await gradientSweep();
  } finally {
    svg.removeAttribute("aria-busy");
  }
});

async function gradientSweep() {
  const dim = Number($("grad-dim").value);
  const length = Number($("grad-length").value);
  const svg = $("grad-chart");
  const marker = { x: 1 / Math.sqrt(dim), label: "1/√E" };
  const fail = (message) => {
    failChart(svg, "grad-error", message);
    $("grad-summary").textContent = "";
  };
  const analyzed = (await hasRoute("/v1/attention/analyze"))
    ? await api("v1/attention/analyze", { shape: [1, 1, length, dim], seed: 0, scales: SCALES, temperatures: [1] })
    : { ok: false, status: 404, body: null };
  if (analyzed.ok) {
    const rows = analyzed.body.sweep;
    showChart(svg, "grad-error");
    drawLines(
      svg,
      rows.map((r) => r.scale),
      [
        { name: "mean Jacobian norm", axis: "left", values: rows.map((r) => r.mean_jacobian_norm) },
        { name: "mean normalized entropy", axis: "right", values: rows.map((r) => r.mean_normalized_entropy) },
      ],
      { xLabel: "scale (log axis)", marker },
    );
    $("grad-summary").textContent =
      `POST /v1/attention/analyze, E=${dim}, L=S=${length}: 1/sqrt(E) = ${(1 / Math.sqrt(dim)).toFixed(3)}; ` +
      `large scales saturate the softmax and its Jacobian (the gradient) vanishes.`;
    svg.dataset.source = "analyze";
    return;
  }
  if (analyzed.status !== 404) {
    fail(problem(analyzed));
    return;
  }
  // Without /v1/attention/analyze: the gradient norms of one random problem from /v1/attention/backward.
  const next = rng(11);
  const q = tensor(next, [length, dim]);
  const k = tensor(next, [length, dim]);
  const v = tensor(next, [length, dim]);
  const g = tensor(next, [length, dim]);
  const norms = [];
  for (const scale of SCALES) {
    const r = await api("v1/attention/backward", { query: q, key: k, value: v, grad_output: g, scale, precision: "float64" });
    if (!r.ok) {
      fail(problem(r));
      return;
    }
    const frob = (m) => Math.sqrt(m.flat().reduce((acc, x) => acc + x * x, 0));
    norms.push([frob(r.body.grad_query), frob(r.body.grad_key)]);
  }
  showChart(svg, "grad-error");
  drawLines(
    svg,
    SCALES,
    [
      { name: "|grad_query|", axis: "left", values: norms.map((n) => n[0]) },
      { name: "|grad_key|", axis: "left", values: norms.map((n) => n[1]) },
    ],
    { xLabel: "scale (log axis)", yLabel: "gradient norm (Frobenius)", marker },
  );
  $("grad-summary").textContent = `POST /v1/attention/backward, E=${dim}, L=S=${length}: gradient norms of one random problem.`;
  svg.dataset.source = "backward";
}

$("grad-run").addEventListener("click", gradientPanel);
