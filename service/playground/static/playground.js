// Attention playground: plain JavaScript against the service's own /v1 API (no libraries, works offline), as ES
// modules: this one starts the panels; each panel is a module of its own (attention.js, gradients.js, sampling.js,
// decode.js, rollout.js) on the shared helpers (common.js) and charts (charts.js). Every chart is SVG; each drawn
// chart records what it shows in data-* attributes (read by the browser tests).

import { $, apiKey, forgetRoutes } from "./common.js";
import { heatmapPanel, softmaxPanel } from "./attention.js";
import { gradientPanel } from "./gradients.js";
import { calibrationPanel, samplingPanel } from "./sampling.js";
import { sessionsServed } from "./decode.js";
import { forgetRollout, rolloutPanel } from "./rollout.js";

$("api-key").value = sessionStorage.getItem("attention-api-key") || "";
$("api-key").addEventListener("change", () => {
  sessionStorage.setItem("attention-api-key", apiKey());
  forgetRoutes();
  softmaxPanel();
  heatmapPanel();
  samplingPanel();
  sessionsServed();
  forgetRollout();
  rolloutPanel();
});

softmaxPanel();
heatmapPanel();
samplingPanel();
gradientPanel();
calibrationPanel();
sessionsServed();
