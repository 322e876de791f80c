/*
 * Page behaviour around the live charts (static/dashboard/live.js draws them):
 *
 * - [data-layer-picker="<chart id>"]: a <select> of MoE layers; choosing one
 *   points that chart (and its CSV/JSON links) at ?layer=<n> and redraws it.
 *   The heatmap's uirevision is shared by all layers, so the x zoom stays.
 * - [data-run-status="<url>"]: while the run is queued or running, polls the
 *   run's status endpoint at the charts' interval and updates every
 *   [data-field] element of the page (status, progress, steps, placement:
 *   queue position, worker, attempt, ETA; collapse, log: the page header and
 *   the dashboard section alike) as text, never as
 *   HTML; [data-show-when="active"|"finished"] elements (cancel / delete) are
 *   shown or hidden as the run is active or not; a run that ends failed on its
 *   config reloads the page once, for its field errors and "Clone and fix".
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

  function fields(name) {
    return root.document.querySelectorAll('[data-field="' + name + '"]');
  }

  function setText(name, text) {
    Array.prototype.forEach.call(fields(name), function (el) {
      el.textContent = text;
    });
  }

  function showWhen(active) {
    var els = root.document.querySelectorAll("[data-show-when]");
    Array.prototype.forEach.call(els, function (el) {
      el.hidden = (el.dataset.showWhen === "active") !== active;
    });
  }

  function attachStatus(section) {
    var url = section.dataset.runStatus;
    var interval = Number(section.dataset.intervalMs) || 5000;
    var running = section.dataset.running === "true";

    async function poll() {
      try {
        var response = await root.fetch(url, {
          credentials: "same-origin",
          headers: { Accept: "application/json" },
        });
        if (!response.ok) throw new Error("HTTP " + response.status);
        var s = await response.json();
        setText("status", s.status);
        Array.prototype.forEach.call(fields("status"), function (el) {
          // the platform's stylesheet styles ".status.running", the dashboard's ".status-running"
          el.className = "status " + s.status + " status-" + s.status;
        });
        setText("steps", s.current_step + "/" + s.total_steps);
        if (s.placement) setText("placement", s.placement);
        // The warm start (before RL step 0) and the cache hit (dashboard/review/phase.py).
        setText("phase", s.phase_text || "");
        // Why a queued run cannot start: no worker serves its queue, or none is big enough.
        setText("waiting", s.waiting_reason || "");
        Array.prototype.forEach.call(fields("waiting"), function (el) {
          el.hidden = !s.waiting_reason;
        });
        Array.prototype.forEach.call(fields("phase"), function (el) {
          el.hidden = !s.phase_text;
        });
        Array.prototype.forEach.call(fields("progress"), function (el) {
          // the warm start's SFT steps until RL step 0, then the RL steps
          el.max = s.bar ? s.bar.max : s.total_steps;
          el.value = s.bar ? s.bar.value : s.current_step;
        });
        showWhen(Boolean(s.running));
        var collapse = section.querySelector('[data-field="collapse"]');
        if (collapse && s.collapsed) {
          collapse.hidden = false;
          collapse.textContent =
            "Collapsed at step " + s.collapse_step + ": " + (s.collapse_reason || "reason not recorded");
        }
        if (s.log_tail !== null && s.log_tail !== undefined) setText("log", s.log_tail);
        if (running && !s.running && s.failed_on_config) {
          // The field errors and "Clone and fix" (instead of Requeue) are drawn by the
          // server: show them now, once, rather than at the next visit.
          root.location.reload();
          return;
        }
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
