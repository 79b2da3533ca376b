// A sortable, filterable table (the diff and sweep pages). Cells carry their sort key in data-v; a header
// with data-t="n" sorts numerically (non-numbers last). opts: filter (a text input, a regex), inputs (the
// controls that re-filter; default [filter]), keep(tr, regex) -> bool, shown (the "n of m" element), noun.
function tpSortableTable(table, opts) {
  var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
  function apply() {
    var re = null;
    try { re = opts.filter.value ? new RegExp(opts.filter.value, "i") : null; } catch (e) { re = null; }
    var n = 0;
    rows.forEach(function (tr) { var ok = opts.keep(tr, re); tr.style.display = ok ? "" : "none"; if (ok) n++; });
    opts.shown.textContent = n + " of " + rows.length + " " + opts.noun + " shown";
  }
  (opts.inputs || [opts.filter]).forEach(function (el) {
    el.addEventListener(el.tagName === "SELECT" ? "change" : "input", apply);
  });
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
    th.addEventListener("click", function () {
      var asc = !th.classList.contains("sorted-asc");
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
      th.classList.add(asc ? "sorted-asc" : "sorted-desc");
      var numeric = th.getAttribute("data-t") === "n";
      rows.sort(function (a, b) {
        var x = a.cells[col].getAttribute("data-v"), y = b.cells[col].getAttribute("data-v");
        if (numeric) {
          var fx = x === "" ? NaN : parseFloat(x), fy = y === "" ? NaN : parseFloat(y);
          if (isNaN(fx) && isNaN(fy)) return 0; if (isNaN(fx)) return 1; if (isNaN(fy)) return -1;
          return asc ? fx - fy : fy - fx;
        }
        return asc ? x.localeCompare(y) : y.localeCompare(x);
      });
      rows.forEach(function (tr) { body.appendChild(tr); });
    });
  });
  apply();
}
