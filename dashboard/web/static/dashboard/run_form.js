/*
 * The run form's live "changes from the preset": each field's wrapper carries
 * data-field-path, data-reference (the reference config's value as the input
 * shows it) and data-kind. On every edit this script marks changed fields,
 * updates each section's "N changed" count and the list of changes shown
 * above the submit button. The server renders the same on every page load
 * (schema_form.changes), so the page is right without JavaScript too.
 */
(function () {
  "use strict";
  var form = document.getElementById("run-form");
  if (!form) return;
  var list = form.querySelector("[data-change-list]");
  var total = form.querySelector("[data-change-total]");

  function valueOf(wrapper) {
    var input = wrapper.querySelector("input:not([type=hidden]), select");
    if (!input) return null;
    if (input.type === "checkbox") return input.checked ? "True" : "False";
    return input.value.trim();
  }

  function differs(wrapper) {
    var now = valueOf(wrapper);
    var ref = wrapper.dataset.reference;
    var kind = wrapper.dataset.kind;
    if (now === null) return false;
    if (kind === "boolean") return now !== (ref === "True" ? "True" : "False");
    if ((kind === "integer" || kind === "number") && now !== "" && ref !== "") {
      var a = Number(now), b = Number(ref);
      if (!isNaN(a) && !isNaN(b)) return a !== b;
    }
    return now !== ref;
  }

  function hiddenUnionField(wrapper) {
    // A field of a task kind that is not selected is never sent.
    var fieldset = wrapper.closest("fieldset[id^='section-task.']");
    if (!fieldset) return false;
    var kind = fieldset.id.split(".").pop();
    var tag = form.querySelector("[name='task.name']");
    return tag && tag.value !== kind && fieldset.querySelector("legend").textContent.indexOf("when") >= 0;
  }

  function refresh() {
    var changed = [];
    form.querySelectorAll("[data-field-path]").forEach(function (wrapper) {
      var on = differs(wrapper) && !hiddenUnionField(wrapper);
      wrapper.classList.toggle("changed", on);
      if (on) changed.push(wrapper);
    });
    form.querySelectorAll("details.form-section").forEach(function (details) {
      var count = details.querySelectorAll("[data-field-path].changed").length;
      var badge = details.querySelector("[data-changed-count]");
      if (badge) badge.textContent = count ? count + " changed" : "";
    });
    if (total) total.textContent = String(changed.length);
    if (!list) return;
    list.textContent = "";
    if (!changed.length) {
      var none = document.createElement("li");
      none.className = "muted";
      none.textContent = "none: the run trains " + form.dataset.reference + " as it is";
      list.appendChild(none);
    }
    changed.forEach(function (wrapper) {
      var li = document.createElement("li");
      li.dataset.path = wrapper.dataset.fieldPath;
      var code = document.createElement("code");
      code.textContent = wrapper.dataset.fieldPath;
      var strong = document.createElement("strong");
      strong.textContent = valueOf(wrapper) || "empty";
      li.appendChild(code);
      li.appendChild(document.createTextNode(": " + (wrapper.dataset.reference || "empty") + " \u2192 "));
      li.appendChild(strong);
      list.appendChild(li);
    });
  }

  // A registered model stands for model.source and the checkpoint's shape: picking
  // one fills those fields (its option's data-model-fields, {path: value}), so the
  // form shows the model the run will train; "none" puts back what was there.
  var picker = form.querySelector("select[name=registered_model]");
  var before = {};
  function inputAt(path) {
    var wrapper = form.querySelector('[data-field-path="' + path + '"]');
    return wrapper ? wrapper.querySelector("input:not([type=hidden]), select") : null;
  }
  function setInput(input, value) {
    if (input.type === "checkbox") input.checked = value === true || value === "True";
    else input.value = value === null || value === undefined ? "" : String(value);
  }
  function applyModel() {
    Object.keys(before).forEach(function (path) {
      var input = inputAt(path);
      if (input) setInput(input, before[path]);
    });
    before = {};
    var option = picker.options[picker.selectedIndex];
    var fields = option && option.dataset.modelFields ? JSON.parse(option.dataset.modelFields) : {};
    Object.keys(fields).forEach(function (path) {
      var input = inputAt(path);
      if (!input) return;
      before[path] = input.type === "checkbox" ? (input.checked ? "True" : "False") : input.value;
      setInput(input, fields[path]);
    });
    refresh();
  }
  if (picker) picker.addEventListener("change", applyModel);

  form.addEventListener("input", refresh);
  form.addEventListener("change", refresh);
  refresh();
})();
