"""The bertviz-style head view as one self-contained HTML page (SVG + a little JavaScript).

Hovering a token is handled in the browser, so lines appear without a round trip to the
server (a Plotly chart would rerun the app per hover). Hover a query on the left: its lines
to the keys it attends to; hover a key on the right: the queries attending to it; a click
pins the token. One colour per head (tick boxes toggle heads); the line's opacity is the gold
probability; solid = gold edge the predictor keeps, dashed = gold edge it misses, dotted =
predicted edge that is not gold (toggle). No external script or font is loaded, and text is
set through ``textContent`` only: the page is safe for any token string.
"""

from __future__ import annotations

import json

from sparsefinder.explore.head_lines import HeadLines

ROW_PX = 16
HEADER_PX = 64
#: One colour per head, cycled (12 distinct hues, as bertviz's palette has).
HEAD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
               "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939")


def page_height(lines: HeadLines) -> int:
    """Pixel height of the page for ``lines`` (the app sizes its frame with it)."""
    return HEADER_PX + ROW_PX * len(lines.tokens) + 24


def _payload(lines: HeadLines) -> str:
    """The data as a JSON literal that cannot close the ``<script>`` element."""
    data = dict(lines.to_json(), colors=list(HEAD_COLORS), row=ROW_PX, header=HEADER_PX)
    # JSON allows \uXXXX escapes anywhere in a string: no "<" or "&" is left to end the element
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace(
        "&", "\\u0026")


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><style>
body { margin: 0; font: 12px sans-serif; color: #212121; }
#controls { padding: 4px 6px; line-height: 20px; }
#controls label { margin-right: 8px; white-space: nowrap; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 2px; }
svg text { font: 12px monospace; cursor: pointer; dominant-baseline: middle; }
svg text.active { font-weight: bold; }
#legend { color: #616161; }
</style></head><body>
<div id="controls"></div>
<div id="legend">hover a token (click pins it) · solid: gold kept · dashed: gold missed ·
dotted: extra predicted · opacity: gold probability</div>
<svg id="view" xmlns="http://www.w3.org/2000/svg"></svg>
<script id="data" type="application/json">__PAYLOAD__</script>
<script>
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const n = D.tokens.length, width = 560, left = 150, right = 410;
  const top = 10, svg = document.getElementById("view");
  svg.setAttribute("width", width);
  svg.setAttribute("height", top + n * D.row + 10);
  const shown = D.heads.map(() => true);
  let showExtra = true, pinned = null, current = null;
  const controls = document.getElementById("controls");
  D.heads.forEach((h, i) => {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox"; box.checked = true; box.dataset.head = String(h);
    box.addEventListener("change", () => { shown[i] = box.checked; redraw(); });
    const sw = document.createElement("span");
    sw.className = "swatch"; sw.style.background = D.colors[i % D.colors.length];
    label.append(box, sw, document.createTextNode("h" + h));
    controls.append(label);
  });
  const extra = document.createElement("label");
  const extraBox = document.createElement("input");
  extraBox.type = "checkbox"; extraBox.checked = true; extraBox.id = "extra";
  extraBox.addEventListener("change", () => { showExtra = extraBox.checked; redraw(); });
  extra.append(extraBox, document.createTextNode("extra predicted"));
  controls.append(extra);
  const lineLayer = document.createElementNS(NS, "g");
  lineLayer.id = "lines";
  svg.append(lineLayer);
  const y = (i) => top + i * D.row + D.row / 2;
  const texts = { query: [], key: [] }, titles = { query: [], key: [] };
  function outCount(side, i) {
    const table = side === "query" ? D.outAsQuery : D.outAsKey;
    return table.reduce((sum, row, h) => sum + (shown[h] ? row[i] : 0), 0);
  }
  function tokenText(side, i) {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", side === "query" ? left - 6 : right + 6);
    t.setAttribute("y", y(i));
    t.setAttribute("text-anchor", side === "query" ? "end" : "start");
    t.textContent = D.tokens[i];
    t.dataset.side = side; t.dataset.index = String(i);
    const title = document.createElementNS(NS, "title");
    t.append(title);
    titles[side].push(title);
    t.addEventListener("mouseenter", () => { if (pinned === null) select(side, i); });
    t.addEventListener("mouseleave", () => { if (pinned === null) select(null, null); });
    t.addEventListener("click", () => {
      const same = pinned && pinned.side === side && pinned.index === i;
      pinned = same ? null : { side: side, index: i };
      select(same ? null : side, same ? null : i);
    });
    svg.append(t);
    texts[side].push(t);
  }
  for (let i = 0; i < n; i++) { tokenText("query", i); tokenText("key", i); }
  function select(side, index) {
    current = side === null ? null : { side: side, index: index };
    redraw();
  }
  function redraw() {
    while (lineLayer.firstChild) lineLayer.removeChild(lineLayer.firstChild);
    texts.query.concat(texts.key).forEach((t) => {
      t.classList.remove("active");
      const i = Number(t.dataset.index), side = t.dataset.side;
      titles[side][i].textContent = (D.start + i) + " · " + D.tokens[i] + " · gold edges outside "
        + "the window: " + outCount(side, i);
    });
    if (current === null) return;
    texts[current.side][current.index].classList.add("active");
    const col = current.side === "query" ? 0 : 1;
    D.edges.forEach((rows, h) => {
      if (!shown[h]) return;
      const color = D.colors[h % D.colors.length];
      rows.forEach((e) => {
        if (e[col] !== current.index || (e[3] === 3 && !showExtra)) return;
        const l = document.createElementNS(NS, "line");
        l.setAttribute("x1", left); l.setAttribute("y1", y(e[0]));
        l.setAttribute("x2", right); l.setAttribute("y2", y(e[1]));
        l.setAttribute("stroke", color);
        l.setAttribute("stroke-width", 2);
        l.setAttribute("stroke-opacity", e[3] === 3 ? 0.5 : Math.max(0.15, Math.sqrt(e[2])));
        if (e[3] === 2) l.setAttribute("stroke-dasharray", "6 3");
        if (e[3] === 3) l.setAttribute("stroke-dasharray", "1 3");
        l.dataset.head = String(D.heads[h]); l.dataset.status = ["", "TP", "FN", "FP"][e[3]];
        const title = document.createElementNS(NS, "title");
        title.textContent = "head " + D.heads[h] + " · " + D.tokens[e[0]] + " → "
          + D.tokens[e[1]] + " · gold p=" + e[2].toFixed(3) + " · "
          + ["", "kept", "missed", "extra (not gold)"][e[3]];
        l.append(title);
        lineLayer.append(l);
      });
    });
  }
  redraw();
})();
</script></body></html>
"""


def head_lines_html(lines: HeadLines) -> str:
    """The head view of ``lines`` as a standalone HTML page (open it in a browser, or embed
    it in the app)."""
    return _PAGE.replace("__PAYLOAD__", _payload(lines))
