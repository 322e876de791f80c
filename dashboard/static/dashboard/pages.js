/*
 * Page behaviour around the live charts (static/dashboard/live.js draws them):
 *
 * - [data-layer-picker="<chart id>"]: a <select> of MoE layers; choosing one
 *   points that chart (and its CSV/JSON links) at ?layer=<n> and redraws it.
 *   The heatmap's uirevision is shared by all layers, so the x zoom stays.
 * - [data-run-status="<url>"]: while the run is queued or running, polls the
 *   run's status endpoint and updates the [data-field] elements inside the
 *   page (status, progress, steps, collapse, log) as text, never as HTML.
 */
(function (root) {
  "use strict";

  function withParam(url, name, value) {
    var u = new URL(url, root.location.href);
    u.searchParams.set(name, String(value));
    return u.pathname + u.search;
  }

  function attachLayerPicker(select) {
    var chartEl = root.document.getElementById(select.dataset.layerPicker);
    if (!chartEl) return;
    select.addEventListener("change", function () {
      var url = withParam(chartEl.dataset.url, "layer", select.value);
      chartEl.dataset.url = url;
      var links = chartEl.parentElement.querySelectorAll(".chart-downloads a");
      Array.prototype.forEach.call(links, function (a) {
        a.href = withParam(a.getAttribute("href"), "layer", select.value);
      });
      var chart = chartEl.liveChart;
      if (chart) {
        chart.url = url;
        chart.refresh();
      }
    });
  }

  function setText(scope, field, text) {
    var el = scope.querySelector('[data-field="' + field + '"]');
    if (el) el.textContent = text;
    return el;
  }

  function attachStatus(section) {
    var url = section.dataset.runStatus;
    var interval = Number(section.dataset.intervalMs) || 5000;
    var running = section.dataset.running === "true";
    var page = root.document;

    async function poll() {
      try {
        var response = await root.fetch(url, {
          credentials: "same-origin",
          headers: { Accept: "application/json" },
        });
        if (!response.ok) throw new Error("HTTP " + response.status);
        var s = await response.json();
        var status = setText(section, "status", s.status);
        if (status) status.className = "status status-" + s.status;
        setText(section, "steps", s.current_step + "/" + s.total_steps);
        var progress = section.querySelector('[data-field="progress"]');
        if (progress) progress.value = s.current_step;
        var collapse = section.querySelector('[data-field="collapse"]');
        if (collapse && s.collapsed) {
          collapse.hidden = false;
          collapse.textContent =
            "Collapsed at step " + s.collapse_step + ": " + (s.collapse_reason || "reason not recorded");
        }
        if (s.log_tail !== null && s.log_tail !== undefined) setText(page, "log", s.log_tail);
        running = Boolean(s.running);
        section.dataset.running = running ? "true" : "false";
      } catch (err) {
        section.dispatchEvent(new root.CustomEvent("runstatus:error", { detail: String(err) }));
      }
      if (running) root.setTimeout(poll, interval);
    }
    if (running) root.setTimeout(poll, interval);
  }

  function init() {
    Array.prototype.forEach.call(
      root.document.querySelectorAll("[data-layer-picker]"),
      attachLayerPicker,
    );
    Array.prototype.forEach.call(
      root.document.querySelectorAll("[data-run-status]"),
      attachStatus,
    );
  }

  if (root.document.readyState === "loading") {
    root.document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})(window);
