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
    for (const child of [...svg.childNodes]) if (child.nodeName !== "title" && child.nodeName !== "desc") svg.removeChild(child);
  }

  // What a chart shows, in words, for screen readers: its <desc>, referenced by aria-describedby (the
  // chart's name stays its <title>).
  function describe(svg, content) {
    let desc = svg.querySelector(":scope > desc");
    if (!desc) {
      desc = el("desc", { id: `${svg.id}-desc` }, svg);
      svg.setAttribute("aria-describedby", desc.id);
    }
    desc.textContent = content;
  }

  // A panel's error line (a polite live region); "" clears it.
  function showError(id, message) {
    $(id).textContent = message || "";
  }

  // A failed request takes down the chart it would have replaced: nothing stale stays on screen.
  function failChart(svg, errorId, message) {
    clear(svg);
    delete svg.dataset.key;
    delete svg.dataset.source;
    svg.dataset.state = "error";
    svg.setAttribute("hidden", "");
    describe(svg, `no chart: ${message}`);
    showError(errorId, message);
  }

  function showChart(svg, errorId) {
    svg.dataset.state = "ok";
    svg.removeAttribute("hidden");
    showError(errorId, "");
  }

  function apiKey() {
    return $("api-key").value.trim();
  }

  // POST a JSON body to the service (relative to the page, so a root_path works), or another method without one;
  // {ok, status, body}.
  async function api(path, body, method) {
    const headers = { "content-type": "application/json", accept: "application/json" };
    if (apiKey()) headers["x-api-key"] = apiKey();
    const init = body === undefined ? { method: method || "GET", headers } : { method: method || "POST", headers, body: JSON.stringify(body) };
    const response = await fetch(path, init);
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
    describe(svg, weights.map((w, i) => `${labels[i]}: ${w.toFixed(4)}${opts.removed && opts.removed[i] ? " (removed)" : ""}`).join(", "));
  }

  // ------------------------------------------------------------------ panel 1: scores to weights

  function failSoftmax(message) {
    failChart($("bars"), "softmax-error", message);
    for (const id of ["entropy", "effective-support", "support"]) $(id).textContent = "–";
  }

  const softmaxPanel = serialized(async () => {
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

  let uid = 0;

  // One head's weights as a grid of cells (queries down, keys across) with its colour bar. A masked cell
  // (its score is -inf: the request's causal mask, key padding or explicit mask removed it) is hatched grey;
  // a weight of exactly 0 that was not masked (sparsemax, entmax, relu) is white, the bottom of the scale.
  // The same drawing shows the norm-based weights ||A_ij v_j|| (scale.kind "norm") and the rollout (panel 6):
  // scale.noun names a cell's value, scale.plural the whole map, scale.name what one map is ("head 0" by default),
  // scale.grid the grid's side in px (160), scale.masks false leaves the masked swatch out of the legend (nothing
  // there can be masked), scale.axes names a row and a column ([singular, plural] of each) and scale.xTitle and
  // scale.yTitle the axes.
  function drawHeatmap(container, weights, masked, head, scale) {
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

  const heatmapPanel = serialized(async () => {
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

  // ------------------------------------------------------------------ line charts

  // Ticks from 0 to at least max at a round step (1, 2 or 5 times a power of ten), with their labels.
  function axisTicks(max) {
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
  function drawLines(svg, xs, series, options) {
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

  // ------------------------------------------------------------------ panel 3: gradients

  const SCALES = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50];

  // aria-busy while a sweep runs (its requests take a while): assistive technology, and the tests, wait for it.
  const gradientPanel = serialized(async () => {
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

  const calibrationPanel = serialized(async () => {
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

  // A whole number within an input's min and max; an input that holds none is marked invalid and named.
  function wholeNumber(id, name) {
    const input = $(id);
    const v = Number(input.value);
    const lo = Number(input.min);
    const hi = input.max === "" ? Infinity : Number(input.max);
    if (input.value.trim() === "" || !Number.isInteger(v) || v < lo || v > hi) {
      input.setAttribute("aria-invalid", "true");
      throw new Error(`${name}: a whole number from ${lo}${hi < Infinity ? ` to ${hi}` : " up"}`);
    }
    input.removeAttribute("aria-invalid");
    return v;
  }

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

  async function sessionsServed() {
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

  const rolloutPanel = serialized(async () => {
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

  $("api-key").value = sessionStorage.getItem("attention-api-key") || "";
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem("attention-api-key", apiKey());
    routes = null;
    softmaxPanel();
    heatmapPanel();
    samplingPanel();
    sessionsServed();
    rolloutAnswer = null;
    rolloutPanel();
  });

  softmaxPanel();
  heatmapPanel();
  samplingPanel();
  gradientPanel();
  calibrationPanel();
  sessionsServed();
})();
