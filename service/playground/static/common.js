// Shared helpers of the playground's panels: the page's elements, SVG drawing primitives, error lines, the service's
// /v1 API (relative to the page), seeded inputs and number formats.

export const SVG = "http://www.w3.org/2000/svg";
export const $ = (id) => document.getElementById(id);

// ------------------------------------------------------------------ helpers

export function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

export function text(parent, x, y, content, attrs) {
  const node = el("text", { x, y, ...(attrs || {}) }, parent);
  node.textContent = content;
  return node;
}

export function clear(svg) {
  for (const child of [...svg.childNodes]) if (child.nodeName !== "title" && child.nodeName !== "desc") svg.removeChild(child);
}

// What a chart shows, in words, for screen readers: its <desc>, referenced by aria-describedby (the
// chart's name stays its <title>).
export function describe(svg, content) {
  let desc = svg.querySelector(":scope > desc");
  if (!desc) {
    desc = el("desc", { id: `${svg.id}-desc` }, svg);
    svg.setAttribute("aria-describedby", desc.id);
  }
  desc.textContent = content;
}

// A panel's error line (a polite live region); "" clears it.
export function showError(id, message) {
  $(id).textContent = message || "";
}

// A failed request takes down the chart it would have replaced: nothing stale stays on screen.
export function failChart(svg, errorId, message) {
  clear(svg);
  delete svg.dataset.key;
  delete svg.dataset.source;
  svg.dataset.state = "error";
  svg.setAttribute("hidden", "");
  describe(svg, `no chart: ${message}`);
  showError(errorId, message);
}

export function showChart(svg, errorId) {
  svg.dataset.state = "ok";
  svg.removeAttribute("hidden");
  showError(errorId, "");
}

export function apiKey() {
  return $("api-key").value.trim();
}

// POST a JSON body to the service (relative to the page, so a root_path works), or another method without one;
// {ok, status, body}.
export async function api(path, body, method) {
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
export async function hasRoute(path) {
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

// A new API key may see other operations: the next hasRoute asks the schema again.
export function forgetRoutes() {
  routes = null;
}

export function problem(result) {
  const b = result.body || {};
  return `${result.status} ${b.title || ""}: ${b.detail || b.error || "request refused"}`;
}

export function parseNumbers(value) {
  const parts = value.split(",").map((s) => s.trim()).filter((s) => s.length > 0);
  const numbers = parts.map(Number);
  if (numbers.length === 0 || numbers.some((x) => !Number.isFinite(x))) {
    throw new Error(`"${value}" is not a comma-separated list of numbers`);
  }
  return numbers;
}

// Runs fn at most once at a time; a call during a run schedules one more run with the latest state.
export function serialized(fn) {
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
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function normal(next) {
  const u = Math.max(next(), 1e-12);
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * next());
}

export function tensor(next, dims) {
  if (dims.length === 0) return normal(next);
  return Array.from({ length: dims[0] }, () => tensor(next, dims.slice(1)));
}

export const fmt = (x, digits) => (Number.isFinite(x) ? x.toFixed(digits) : "–");

// A whole number within an input's min and max; an input that holds none is marked invalid and named.
export function wholeNumber(id, name) {
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
