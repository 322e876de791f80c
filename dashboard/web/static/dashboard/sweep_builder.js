// The sweep builder's "Add a field": a copy of the last grid row, emptied and
// numbered after it (field_<i>, values_<i>). Without JavaScript, Preview adds
// a blank row instead.
(function () {
  const button = document.getElementById("add-grid-row");
  const grid = document.getElementById("sweep-grid");
  if (!button || !grid) return;
  button.hidden = false;
  button.addEventListener("click", function () {
    const rows = grid.querySelectorAll("tr.grid-row");
    const last = rows[rows.length - 1];
    const copy = last.cloneNode(true);
    const index = rows.length;
    copy.querySelector("select").name = "field_" + index;
    copy.querySelector("select").value = "";
    copy.querySelector("select").setAttribute("aria-label", "field " + (index + 1));
    copy.querySelector("input").name = "values_" + index;
    copy.querySelector("input").value = "";
    copy.querySelector("input").setAttribute("aria-label", "values " + (index + 1));
    last.after(copy);
    copy.querySelector("select").focus();
  });
})();
