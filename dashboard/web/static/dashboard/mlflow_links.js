/*
 * MLflow clients print a run's link as <tracking URI>/#/experiments/<id>/runs/<run id>
 * ("View run ... at: ...") and an experiment's as <tracking URI>/#/experiments/<id>.
 * The part after "#" never reaches the server, so every page of the lab (the login
 * page too: the address survives the login) sends such a link on to the lab's own
 * page for that run or experiment. The addresses come from the script tag
 * (data-run-url, data-experiment-url with 0 for the id), so a lab served under a
 * path prefix works too.
 */
(function (root) {
  "use strict";
  var match = /^#\/experiments\/(\d+)(?:\/runs\/(\d+))?/.exec(root.location.hash || "");
  var script = root.document.currentScript;
  if (!match || !script) return;
  var url = match[2]
    ? script.dataset.runUrl.replace(/0\/$/, match[2] + "/")
    : script.dataset.experimentUrl.replace(/0\/$/, match[1] + "/");
  root.location.replace(url);
})(window);
