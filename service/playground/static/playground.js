// Attention playground: plain JavaScript against the service's own /v1 API (no libraries, works offline).
// Every chart is SVG; each drawn chart records what it shows in data-* attributes (read by the browser tests).
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ helpers

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, content, attrs) {
    const node = el("text", { x, y, ...(attrs || {}) }, parent);
    node.textContent = content;
    return node;
  }

  function clear(svg) {
    for (const child of [...svg.childNodes]) if (child.nodeName !== "title") svg.removeChild(child);
  }

  function setStatus(message) {
    $("status").textContent = message || "";
  }

  function apiKey() {
    return $("api-key").value.trim();
  }

  // POST a JSON body to the service (relative to the page, so a root_path works); {ok, status, body}.
  async function api(path, body) {
    const headers = { "content-type": "application/json", accept: "application/json" };
    if (apiKey()) headers["x-api-key"] = apiKey();
    const response = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
    let payload = null;
    try {
      payload = await response.json();
    } catch (e) {
      payload = { detail: `${response.status} ${response.statusText}` };
    }
    return { ok: response.ok, status: response.status, body: payload };
  }

  // The operations this server has (from its OpenAPI schema): panels whose endpoint is missing say so
  // instead of calling it.
  let routes = null;
  async function hasRoute(path) {
    if (routes === null) {
      const headers = apiKey() ? { "x-api-key": apiKey() } : {};
      try {
        const response = await fetch("openapi.json", { headers });
        routes = response.ok ? new Set(Object.keys((await response.json()).paths || {})) : new Set();
      } catch (e) {
        routes = new Set();
      }
    }
    return routes.has(path);
  }

  function problem(result) {
    const b = result.body || {};
    return `${result.status} ${b.title || ""}: ${b.detail || b.error || "request refused"}`;
  }

  function parseNumbers(value) {
    const parts = value.split(",").map((s) => s.trim()).filter((s) => s.length > 0);
    const numbers = parts.map(Number);
    if (numbers.length === 0 || numbers.some((x) => !Number.isFinite(x))) {
      throw new Error(`"${value}" is not a comma-separated list of numbers`);
    }
    return numbers;
  }

  // Runs fn at most once at a time; a call during a run schedules one more run with the latest state.
  function serialized(fn) {
    let running = false;
    let again = false;
    return async function run() {
      if (running) {
        again = true;
        return;
      }
      running = true;
      try {
        do {
          again = false;
          await fn();
        } while (again);
      } finally {
        running = false;
      }
    };
  }

  // mulberry32: a small seeded PRNG, so a seed gives the same Q and K every time.
  function rng(seed) {
    let a = seed >>> 0;
    return () => {
      a = (a + 0x6d2b79f5) >>> 0;
      let t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }

  function normal(next) {
    const u = Math.max(next(), 1e-12);
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * next());
  }

  function tensor(next, dims) {
    if (dims.length === 0) return normal(next);
    return Array.from({ length: dims[0] }, () => tensor(next, dims.slice(1)));
  }

  const fmt = (x, digits) => (Number.isFinite(x) ? x.toFixed(digits) : "–");

  // ------------------------------------------------------------------ bars

  // Bars of probabilities on an absolute 0..1 scale; `removed` marks tokens a filter removed.
  function drawBars(svg, weights, labels, options) {
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
    svg.setAttribute("aria-label", weights.map((w, i) => `${labels[i]}: ${w.toFixed(4)}`).join(", "));
  }

  // ------------------------------------------------------------------ panel 1: scores to weights

  const softmaxPanel = serialized(async () => {
    const normalizer = $("normalizer").value;
    const temperature = Number($("temperature").value);
    $("temperature-value").textContent = temperature.toFixed(1);
    $("alpha-label").hidden = normalizer !== "entmax";
    let scores;
    try {
      scores = parseNumbers($("scores").value);
    } catch (e) {
      setStatus(e.message);
      return;
    }
    const body = { logits: scores, temperature, normalizer, precision: "float64" };
    if (normalizer === "entmax") body.alpha = Number($("alpha").value);
    const result = await api("v1/softmax", body);
    if (!result.ok) {
      setStatus(problem(result));
      return;
    }
    setStatus("");
    const p = result.body.probabilities;
    const svg = $("bars");
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

  function heatColor(w) {
    // white -> accent blue, by weight
    const t = Math.max(0, Math.min(1, w));
    const r = Math.round(255 - t * (255 - 47));
    const g = Math.round(255 - t * (255 - 111));
    const b = Math.round(255 - t * (255 - 223));
    return `rgb(${r},${g},${b})`;
  }

  function qkInputs() {
    if ($("qk-source").value === "pasted") {
      const query = JSON.parse($("pasted-query").value);
      const key = JSON.parse($("pasted-key").value);
      return { query, key, value: key };
    }
    const heads = Number($("heads").value);
    const length = Number($("length").value);
    const dim = Number($("dim").value);
    const next = rng(Number($("seed").value) * 7919 + 1);
    const query = [tensor(next, [heads, length, dim])];
    const key = [tensor(next, [heads, length, dim])];
    return { query, key, value: key };
  }

  function drawHeatmap(container, weights, head) {
    const L = weights.length;
    const S = weights[0].length;
    const size = 200;
    const cell = size / Math.max(L, S);
    const figure = document.createElement("figure");
    const svg = el("svg", {
      viewBox: `0 0 ${size + 20} ${size + 20}`,
      role: "img",
      class: "heatmap",
      "data-head": head,
      "aria-label": `weights of head ${head}: ${L} queries by ${S} keys`,
    });
    for (let i = 0; i < L; i++) {
      for (let j = 0; j < S; j++) {
        const w = weights[i][j];
        const attrs = { x: 18 + j * cell, y: 2 + i * cell, width: cell, height: cell, "data-i": i, "data-j": j, "data-w": w };
        if (w > 0) {
          el("rect", { ...attrs, class: "cell", fill: heatColor(w) }, svg);
        } else {
          el("rect", { ...attrs, class: "cell cell-empty" }, svg);
        }
      }
    }
    text(svg, 2, 12, "q", {});
    text(svg, size + 4, size + 16, "k", {});
    figure.appendChild(svg);
    const caption = document.createElement("figcaption");
    caption.textContent = `head ${head}`;
    figure.appendChild(caption);
    container.appendChild(figure);
  }

  const heatmapPanel = serialized(async () => {
    const temperature = Number($("heat-temperature").value);
    $("heat-temperature-value").textContent = temperature.toFixed(1);
    $("pasted-inputs").hidden = $("qk-source").value !== "pasted";
    let inputs;
    try {
      inputs = qkInputs();
    } catch (e) {
      setStatus(`Q/K: ${e.message}`);
      return;
    }
    const body = {
      ...inputs,
      causal: $("causal").checked,
      normalizer: $("heat-normalizer").value,
      temperature,
      precision: "float64",
      return: ["weights", "diagnostics"],
    };
    if ($("padding").checked) {
      const batches = Array.isArray(inputs.query[0][0][0]) ? inputs.query.length : 1;
      body.key_lengths = Array(batches).fill(Number($("valid-keys").value));
    }
    const result = await api("v1/attention", body);
    if (!result.ok) {
      setStatus(problem(result));
      return;
    }
    setStatus("");
    let weights = result.body.weights;
    while (!Array.isArray(weights[0][0][0])) weights = [weights]; // to (B, H, L, S)
    const container = $("heatmaps");
    container.textContent = "";
    weights[0].forEach((w, h) => drawHeatmap(container, w, h));
    const diagnostics = result.body.diagnostics;
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
    $("heat-summary").textContent =
      `fully masked rows ${diagnostics.fully_masked_rows} · saturated rows ${diagnostics.saturated_rows} · ` +
      `engine ${result.body.engine.name}`;
    container.dataset.key = `${body.causal}|${$("padding").checked}|${body.normalizer}|${temperature.toFixed(1)}`;
  });

  for (const id of ["qk-source", "seed", "heads", "length", "dim", "causal", "padding", "valid-keys", "heat-normalizer", "heat-temperature", "pasted-query", "pasted-key"]) {
    $(id).addEventListener("input", heatmapPanel);
    $(id).addEventListener("change", heatmapPanel);
  }

  // ------------------------------------------------------------------ line charts

  function drawLines(svg, xs, series, xLabel) {
    clear(svg);
    const left = 50;
    const right = 600;
    const top = 16;
    const bottom = 220;
    const lx = xs.map(Math.log10);
    const x0 = Math.min(...lx);
    const x1 = Math.max(...lx);
    const px = (x) => left + ((Math.log10(x) - x0) / (x1 - x0 || 1)) * (right - left);
    el("line", { class: "axis", x1: left, y1: bottom, x2: right, y2: bottom }, svg);
    el("line", { class: "axis", x1: left, y1: top, x2: left, y2: bottom }, svg);
    xs.forEach((x, i) => {
      if (i % 2 === 0) text(svg, px(x), bottom + 16, x < 0.1 ? x.toPrecision(1) : String(Number(x.toPrecision(2))), { "text-anchor": "middle" });
    });
    text(svg, (left + right) / 2, bottom + 34, xLabel, { "text-anchor": "middle" });
    series.forEach((s, k) => {
      const max = Math.max(...s.values, 1e-12);
      const py = (v) => bottom - (v / max) * (bottom - top);
      const d = s.values.map((v, i) => `${i === 0 ? "M" : "L"}${px(xs[i]).toFixed(1)},${py(v).toFixed(1)}`).join(" ");
      el("path", { class: k === 0 ? "line" : "line second", d, "data-series": s.name, "data-values": JSON.stringify(s.values) }, svg);
      text(svg, right - 4, top + 14 + k * 16, `${s.name} (max ${max.toPrecision(3)})`, { "text-anchor": "end", class: "legend" });
    });
    svg.setAttribute("aria-label", series.map((s) => `${s.name}: ${s.values.map((v) => v.toPrecision(3)).join(", ")}`).join("; "));
  }

  // ------------------------------------------------------------------ panel 3: gradients

  const SCALES = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50];

  async function gradientPanel() {
    const dim = Number($("grad-dim").value);
    const length = Number($("grad-length").value);
    const svg = $("grad-chart");
    const analyzed = (await hasRoute("/v1/attention/analyze"))
      ? await api("v1/attention/analyze", { shape: [1, 1, length, dim], seed: 0, scales: SCALES, temperatures: [1] })
      : { ok: false, status: 404, body: null };
    if (analyzed.ok) {
      const rows = analyzed.body.sweep;
      drawLines(
        svg,
        rows.map((r) => r.scale),
        [
          { name: "mean Jacobian norm", values: rows.map((r) => r.mean_jacobian_norm) },
          { name: "mean normalized entropy", values: rows.map((r) => r.mean_normalized_entropy) },
        ],
        "scale (log)",
      );
      $("grad-summary").textContent =
        `POST /v1/attention/analyze, E=${dim}, L=S=${length}: 1/sqrt(E) = ${(1 / Math.sqrt(dim)).toFixed(3)}; ` +
        `large scales saturate the softmax and its Jacobian (the gradient) vanishes.`;
      svg.dataset.source = "analyze";
      return;
    }
    if (analyzed.status !== 404) {
      $("grad-summary").textContent = problem(analyzed);
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
        $("grad-summary").textContent = problem(r);
        return;
      }
      const frob = (m) => Math.sqrt(m.flat().reduce((acc, x) => acc + x * x, 0));
      norms.push([frob(r.body.grad_query), frob(r.body.grad_key)]);
    }
    drawLines(
      svg,
      SCALES,
      [
        { name: "|grad_query|", values: norms.map((n) => n[0]) },
        { name: "|grad_key|", values: norms.map((n) => n[1]) },
      ],
      "scale (log)",
    );
    $("grad-summary").textContent = `POST /v1/attention/backward, E=${dim}, L=S=${length}: gradient norms of one random problem.`;
    svg.dataset.source = "backward";
  }

  $("grad-run").addEventListener("click", gradientPanel);

  // ------------------------------------------------------------------ panel 4: sampling and calibration

  const samplingPanel = serialized(async () => {
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
    } catch (e) {
      setStatus(e.message);
      return;
    }
    $("top-k").max = String(logits.length);
    const body = { logits, temperature, top_k: topK, top_p: topP, min_p: minP, seed: 0, return: ["tokens", "probabilities", "diagnostics"] };
    const svg = $("sample-bars");
    const result = (await hasRoute("/v1/sample")) ? await api("v1/sample", body) : { ok: false, status: 404, body: null };
    svg.toggleAttribute("hidden", !result.ok);
    if (!result.ok) {
      clear(svg);
      $("sample-summary").textContent =
        result.status === 404 ? "needs POST /v1/sample, which this server does not have yet" : problem(result);
      return;
    }
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

  async function calibrationPanel() {
    const sharpness = Number($("calib-sharpness").value);
    $("calib-sharpness-value").textContent = sharpness.toFixed(1);
    const { logits, labels } = syntheticCalibration(sharpness);
    const svg = $("reliability");
    const result = (await hasRoute("/v1/calibrate"))
      ? await api("v1/calibrate", { logits, labels, bins: 10 })
      : { ok: false, status: 404, body: null };
    svg.toggleAttribute("hidden", !result.ok);
    if (!result.ok) {
      clear(svg);
      $("calib-summary").textContent =
        result.status === 404 ? "needs POST /v1/calibrate, which this server does not have yet" : problem(result);
      return;
    }
    const b = result.body;
    drawReliability(svg, b.reliability);
    $("calib-summary").textContent =
      `fitted T = ${b.temperature.toFixed(3)} · ECE ${b.ece.before.toFixed(4)} → ${b.ece.after.toFixed(4)} · ` +
      `NLL ${b.nll.before.toFixed(4)} → ${b.nll.after.toFixed(4)} · accuracy ${Number(b.accuracy).toFixed(3)}`;
  }

  $("calib-run").addEventListener("click", calibrationPanel);
  $("calib-sharpness").addEventListener("input", () => {
    $("calib-sharpness-value").textContent = Number($("calib-sharpness").value).toFixed(1);
  });

  $("api-key").value = sessionStorage.getItem("attention-api-key") || "";
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem("attention-api-key", apiKey());
    routes = null;
    softmaxPanel();
    heatmapPanel();
  });

  softmaxPanel();
  heatmapPanel();
  samplingPanel();
  gradientPanel();
  calibrationPanel();
})();
