"""The bertviz-style head view: SVG drawn by a little JavaScript, as a standalone HTML page or
as the app's component (the same drawing code).

Hovering a token is handled in the browser, so lines appear without a round trip to the
server (a Plotly chart would rerun the app per hover). The selected token is drawn and
highlighted from the start; hover another to preview its lines (once the pointer moves: a
token that lands under a still pointer when the view is drawn anew is not previewed); a click
selects it (in the app: for the whole page and the link; a query on the left selects the row,
a key on the right the column). One colour per head (tick boxes toggle heads); the line's
opacity is the gold probability; solid = gold edge the predictor keeps, dashed = gold edge it
misses, dotted = predicted edge that is not gold (toggle). No external script or font is
loaded, and text is set through ``textContent`` only: the view is safe for any token string.
"""

from __future__ import annotations

import json

from sparsefinder.explore.head_lines import HeadLines

ROW_PX = 16
HEADER_PX = 64
#: One colour per head, cycled (12 distinct hues, as bertviz's palette has).
HEAD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
               "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939")
SIDES = ("query", "key")


def page_height(lines: HeadLines) -> int:
    """Pixel height of the page for ``lines`` (the app sizes its frame with it)."""
    return HEADER_PX + ROW_PX * len(lines.tokens) + 24


def view_data(lines: HeadLines, selected: int | None = None, side: str = "query") -> dict:
    """What the drawing code reads: the lines, the colours, and the selected token (an
    absolute position, drawn and highlighted on load when it lies in the window)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    inside = selected is not None and 0 <= selected - lines.start < len(lines.tokens)
    chosen = {"side": side, "index": selected - lines.start} if inside else None
    return dict(lines.to_json(), colors=list(HEAD_COLORS), row=ROW_PX, header=HEADER_PX,
                selected=chosen)


def _payload(data: dict) -> str:
    """The data as a JSON literal that cannot close the ``<script>`` element."""
    # JSON allows \uXXXX escapes anywhere in a string: no "<" or "&" is left to end the element
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace(
        "&", "\\u0026")


CSS = """
.hv { margin: 0; font: 12px sans-serif; color: #212121; }
.hv .controls { padding: 4px 6px; line-height: 20px; }
.hv .controls label { margin-right: 8px; white-space: nowrap; }
.hv .swatch { display: inline-block; width: 10px; height: 10px; margin-right: 2px; }
.hv svg text { font: 12px monospace; cursor: pointer; dominant-baseline: middle; }
.hv svg text.active { font-weight: bold; fill: #0d47a1; }
.hv svg rect.mark { fill: #fff59d; }
.hv .legend { color: #616161; }
"""

#: ``drawHeadView(root, D, onPick)``: draws into ``root`` (an element or a shadow root);
#: ``onPick(side, position)`` is called when a token is clicked (null: nobody listens).
DRAW_JS = """
function drawHeadView(root, D, onPick) {
  const NS = "http://www.w3.org/2000/svg";
  root.querySelectorAll(".hv").forEach((old) => old.remove());
  const box = document.createElement("div");
  box.className = "hv";
  root.append(box);
  const hidden = root.hvHidden || (root.hvHidden = new Set());
  const n = D.tokens.length, width = 560, left = 150, right = 410;
  const top = 10;
  const controls = document.createElement("div");
  controls.className = "controls";
  const legend = document.createElement("div");
  legend.className = "legend";
  legend.textContent = "click a token to select it, hover another to preview · solid: gold "
    + "kept · dashed: gold missed · dotted: extra predicted · opacity: gold probability";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", top + n * D.row + 10);
  box.append(controls, legend, svg);
  const shown = D.heads.map((h) => !hidden.has(h));
  let showExtra = root.hvExtra !== false, current = null;
  let pinned = D.selected ? { side: D.selected.side, index: D.selected.index } : null;
  D.heads.forEach((h, i) => {
    const label = document.createElement("label");
    const tick = document.createElement("input");
    tick.type = "checkbox"; tick.checked = shown[i]; tick.dataset.head = String(h);
    tick.addEventListener("change", () => {
      shown[i] = tick.checked;
      if (tick.checked) hidden.delete(h); else hidden.add(h);
      redraw();
    });
    const sw = document.createElement("span");
    sw.className = "swatch"; sw.style.background = D.colors[i % D.colors.length];
    label.append(tick, sw, document.createTextNode("h" + h));
    controls.append(label);
  });
  const extra = document.createElement("label");
  const extraBox = document.createElement("input");
  extraBox.type = "checkbox"; extraBox.checked = showExtra; extraBox.id = "extra";
  extraBox.addEventListener("change", () => {
    showExtra = root.hvExtra = extraBox.checked; redraw();
  });
  extra.append(extraBox, document.createTextNode("extra predicted"));
  controls.append(extra);
  const markLayer = document.createElementNS(NS, "g");
  const lineLayer = document.createElementNS(NS, "g");
  lineLayer.id = "lines";
  svg.append(markLayer, lineLayer);
  const y = (i) => top + i * D.row + D.row / 2;
  // Hover previews wait until the pointer really moves: after a click the app draws the
  // view anew around the picked token, and the token that lands under a still pointer
  // must not replace the picked one's lines (the browser reports an "enter" for it).
  let armed = false, origin = null;
  svg.addEventListener("mousemove", (ev) => {
    if (armed) return;
    if (origin === null) { origin = [ev.clientX, ev.clientY]; return; }
    if (Math.abs(ev.clientX - origin[0]) + Math.abs(ev.clientY - origin[1]) > 6) armed = true;
  });
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
    t.addEventListener("mouseenter", () => { if (armed) show(side, i); });
    t.addEventListener("mouseleave", () => show(pinned && pinned.side, pinned && pinned.index));
    t.addEventListener("click", () => {
      pinned = { side: side, index: i };
      show(side, i);
      if (onPick) onPick(side, D.start + i);
    });
    svg.append(t);
    texts[side].push(t);
  }
  for (let i = 0; i < n; i++) { tokenText("query", i); tokenText("key", i); }
  function show(side, index) {
    current = side === null || side === undefined ? null : { side: side, index: index };
    redraw();
  }
  function redraw() {
    while (lineLayer.firstChild) lineLayer.removeChild(lineLayer.firstChild);
    while (markLayer.firstChild) markLayer.removeChild(markLayer.firstChild);
    texts.query.concat(texts.key).forEach((t) => {
      t.classList.remove("active");
      const i = Number(t.dataset.index), side = t.dataset.side;
      titles[side][i].textContent = (D.start + i) + " · " + D.tokens[i] + " · gold edges outside "
        + "the window: " + outCount(side, i) + (onPick ? " · click: select" : "");
    });
    if (pinned !== null) {  // the selected token: a highlight behind its text
      const t = texts[pinned.side][pinned.index];
      t.classList.add("active");
      const mark = document.createElementNS(NS, "rect");
      mark.setAttribute("class", "mark");
      mark.setAttribute("x", pinned.side === "query" ? 0 : right);
      mark.setAttribute("y", y(pinned.index) - D.row / 2);
      mark.setAttribute("width", left);
      mark.setAttribute("height", D.row);
      markLayer.append(mark);
    }
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
  show(pinned && pinned.side, pinned && pinned.index);
}
"""

#: The app's component (``st.components.v2``): a click sends ``{side, index}`` (an absolute
#: token position) as the ``token`` trigger.
COMPONENT_JS = DRAW_JS + """
export default function (component) {
  const { data, parentElement, setTriggerValue } = component;
  drawHeadView(parentElement, data,
               (side, index) => setTriggerValue("token", { side: side, index: index }));
}
"""

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><style>body { margin: 0; }__CSS__</style></head><body>
<div id="root"></div>
<script id="data" type="application/json">__PAYLOAD__</script>
<script>__DRAW__
drawHeadView(document.getElementById("root"),
             JSON.parse(document.getElementById("data").textContent), null);
</script></body></html>
"""


def head_lines_html(lines: HeadLines, selected: int | None = None) -> str:
    """The head view of ``lines`` as a standalone HTML page (open it in a browser)."""
    return (_PAGE.replace("__CSS__", CSS).replace("__DRAW__", DRAW_JS)
            .replace("__PAYLOAD__", _payload(view_data(lines, selected))))
