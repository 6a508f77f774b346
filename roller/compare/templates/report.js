// Sorting and filtering of the results table, and a self-check that every inline image decoded: a broken
// plot becomes a console error, which the tests' headless-Chromium run treats as a failure.
(function () {
  "use strict";
  var table = document.getElementById("results-table");
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);

  function key(row, col, numeric) {
    var text = row.cells[col].getAttribute("data-v");
    if (text === null) { text = row.cells[col].textContent.trim(); }
    if (!numeric) { return text.toLowerCase(); }
    var v = parseFloat(text);
    return isNaN(v) ? Infinity : v;
  }

  var headers = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(headers, function (th, col) {
    if (!th.classList.contains("sortable")) { return; }
    th.addEventListener("click", function () {
      var numeric = th.classList.contains("num");
      var dir = th.getAttribute("data-dir") === "asc" ? -1 : 1;
      th.setAttribute("data-dir", dir === 1 ? "asc" : "desc");
      rows.sort(function (a, b) {
        var ka = key(a, col, numeric), kb = key(b, col, numeric);
        if (ka < kb) { return -dir; }
        if (ka > kb) { return dir; }
        return (+a.getAttribute("data-i")) - (+b.getAttribute("data-i"));
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });

  var filter = document.getElementById("filter");
  filter.addEventListener("input", function () {
    var words = filter.value.toLowerCase().split(/\s+/).filter(Boolean);
    var shown = 0;
    rows.forEach(function (r) {
      var text = r.getAttribute("data-text");
      var ok = words.every(function (w) { return text.indexOf(w) >= 0; });
      r.style.display = ok ? "" : "none";
      shown += ok ? 1 : 0;
    });
    document.getElementById("shown").textContent = String(shown);
  });

  function checkImages() {
    var bad = 0;
    Array.prototype.forEach.call(document.images, function (img) {
      if (!img.complete || img.naturalWidth === 0) {
        bad += 1;
        console.error("image did not decode: " + (img.alt || "(no alt)"));
      }
    });
    document.body.setAttribute("data-report-ready", bad ? "broken-images" : "ok");
    document.body.setAttribute("data-rows", String(rows.length));
  }
  if (document.readyState === "complete") { checkImages(); } else { window.addEventListener("load", checkImages); }
})();
