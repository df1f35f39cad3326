// headprobe head explorer: the layer x head grid, a head's card and its attention on example
// sentences. One ES module, no framework, no network: the report inlines it, the notebook widget
// (anywidget) loads it as its module.
//
//   mount(element, data, {onSelect(key), head})   -> {select(key), highlight(key), focus(key)}
//   export default {render({model, el})}            // anywidget: data <- model "data", head -> "head"
//
// `data` is headprobe.report.explorer.data.explorer_data(results): every number shown is a value
// of it; nothing is computed here but the colour of a cell and where a line is drawn.

const MIN_LINE = 3; // uint8 attention below this (about 1%) draws no line
const TOP_RELATIONS = 8;
const STOPS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"]; // viridis

const CSS = `
.hx { font-size: .85rem; }
.hx-controls { display: flex; flex-wrap: wrap; gap: .4rem 1rem; align-items: center; margin: .4rem 0; }
.hx-controls select { max-width: 100%; }
.hx-legend { color: #444; font-size: .8rem; }
.hx-body { display: flex; flex-wrap: wrap; gap: 1rem; align-items: flex-start; }
.hx-grid { flex: 0 0 auto; display: flex; flex-direction: column; gap: 1px; outline: none; }
.hx-row { display: flex; gap: 1px; }
.hx-grid .hx-lab { flex: 0 0 auto; font-size: 9px; color: #555; text-align: center; line-height: 1; align-self: center; overflow: hidden; }
.hx-cell { flex: 0 0 auto; border: 1px solid rgba(0,0,0,.08); cursor: pointer; box-sizing: border-box; }
.hx-cell:focus { outline: 2px solid #000; outline-offset: 0; }
.hx-cell[aria-selected="true"] { outline: 3px solid #d62728; outline-offset: -1px; }
.hx-cell.hx-match { box-shadow: inset 0 0 0 3px #ff7f0e; }
.hx-card { flex: 1 1 340px; min-width: 0; border: 1px solid #ddd; border-radius: 6px; padding: .5rem .7rem; }
.hx-card h3 { margin: 0 0 .3rem; font-size: 1rem; }
.hx-card h4 { margin: .6rem 0 .2rem; font-size: .85rem; }
.hx-card p { margin: .15rem 0; }
.hx-card table { width: 100%; table-layout: fixed; border-collapse: collapse; font-size: .75rem; margin: .2rem 0; }
.hx-card th, .hx-card td { border: 1px solid #e3e3e3; padding: .1rem .25rem; overflow-wrap: anywhere; text-align: left; }
.hx-card td[data-value] { text-align: right; font-variant-numeric: tabular-nums; }
.hx-badge { display: inline-block; padding: 0 .4rem; border-radius: 3px; color: #fff; text-shadow: 0 0 2px #000; }
.hx-attn { margin-top: .8rem; }
.hx-attn svg { display: block; width: 100%; max-width: 520px; height: auto; }
.hx-attn line.hx-gold { stroke: #d62728; stroke-dasharray: 4 3; }
.hx-note { color: #555; font-size: .8rem; }
`;

function h(tag, attrs = {}, ...children) {
  const ns = ["svg", "line", "text", "g", "rect"].includes(tag) ? "http://www.w3.org/2000/svg" : null;
  const el = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, v);
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c);
  return el;
}

function fmt(x, d = 3) {
  return x === null || x === undefined ? "—" : Number(x).toFixed(d);
}

function numCell(x) {
  return h("td", x === null || x === undefined ? {} : { "data-value": String(x) }, fmt(x));
}

function mix(a, b, t) {
  const p = (s) => [1, 3, 5].map((i) => parseInt(s.slice(i, i + 2), 16));
  const [x, y] = [p(a), p(b)];
  return "rgb(" + x.map((v, i) => Math.round(v + (y[i] - v) * t)).join(",") + ")";
}

function ramp(t) {
  const u = Math.max(0, Math.min(1, t)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(u));
  return mix(STOPS[i], STOPS[i + 1], u - i);
}

function decode(b64) {
  const raw = atob(b64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

// ---------------------------------------------------------------- colour-by choices

function colourChoices(data) {
  const out = [{ id: "role", text: "Role" }];
  data.relations.forEach((r, i) =>
    out.push({ id: "rel:" + i, text: `held-out accuracy: ${r.analysis} ${r.label} [${r.measure}]`, values: r.heldout }));
  data.scores.forEach((s, i) =>
    out.push({ id: "score:" + i, text: scoreName(s), values: s.values }));
  return out;
}

function scoreName(s) {
  return [s.table, s.label, s.column].filter((x) => x !== undefined && x !== "").join(": ") +
    (s.measure ? ` [${s.measure}]` : "");
}

// ---------------------------------------------------------------- the grid

function buildGrid(data, size) {
  const H = data.n_heads;
  const grid = h("div", { class: "hx-grid", role: "grid", "aria-label": "heads: rows are layers, columns heads" });
  const every = size < 16 ? Math.ceil(16 / size) : 1;
  const box = (w) => `width:${w}px; height:${size}px`;
  const lab = (text, w = size) => h("span", { class: "hx-lab", style: box(w) }, text);
  const header = h("div", { class: "hx-row", role: "row" }, lab("L\\H", 28));
  for (let c = 0; c < H; c++) header.append(lab(c % every ? "" : String(c)));
  grid.append(header);
  const cells = [];
  data.layers.forEach((layer, r) => {
    const row = h("div", { class: "hx-row", role: "row" }, lab(String(layer), 28));
    for (let c = 0; c < H; c++) {
      const key = `${layer}-${c}`;
      const cell = h("div", {
        class: "hx-cell", role: "gridcell", tabindex: "-1", "data-head": key,
        "data-index": String(r * H + c), "aria-selected": "false", title: key, style: box(size),
      });
      cells.push(cell);
      row.append(cell);
    }
    grid.append(row);
  });
  return { grid, cells };
}

function paint(data, cells, choice, legend) {
  legend.textContent = "";
  if (choice.id === "role") {
    const roles = data.roles;
    cells.forEach((cell, i) => {
      cell.style.background = roles.colors[roles.role[i]] || "#eee";
      cell.title = `${data.heads[i]}: ${roles.role[i] || "—"}`;
    });
    for (const [role, color] of Object.entries(roles.colors))
      legend.append(h("span", { class: "hx-badge", style: `background:${color}; margin-right:.3rem` }, role));
    return;
  }
  const vals = choice.values.filter((v) => v !== null);
  const lo = Math.min(...vals), hi = Math.max(...vals);
  cells.forEach((cell, i) => {
    const v = choice.values[i];
    cell.style.background = v === null ? "#eee" : ramp(hi > lo ? (v - lo) / (hi - lo) : 0.5);
    cell.title = `${data.heads[i]}: ${fmt(v)}`;
  });
  legend.append(`${fmt(lo)} `, h("span", { class: "hx-badge", style: `background:linear-gradient(90deg,${STOPS.join(",")}); width:6em` }, "\u00a0"), ` ${fmt(hi)} (grey: no value)`);
}

// ---------------------------------------------------------------- the card

function relationRows(data, i) {
  const rows = data.relations
    .map((r, k) => ({ r, k, v: r.heldout[i] }))
    .filter((x) => x.v !== null && x.v !== undefined && x.r.measure === (data.measures[0] || x.r.measure));
  rows.sort((a, b) => b.v - a.v);
  return rows.slice(0, TOP_RELATIONS);
}

function intervalText(r, i) {
  const named = r.intervals.filter((x) => x.head === i);
  if (!named.length) return "—";
  return named.map((x) => `${x.selection}${x.fold ? " fold " + x.fold : ""}: ${fmt(x.accuracy)} [${fmt(x.low)}, ${fmt(x.high)}]`).join("; ");
}

function relationsTable(data, i) {
  const rows = relationRows(data, i);
  if (!rows.length) return h("p", { class: "hx-note" }, "No relation scores for this head.");
  const body = rows.map(({ r, k }) => h("tr", { "data-relation": String(k), "data-label": r.label, "data-analysis": r.analysis },
    h("td", {}, `${r.analysis}: ${r.label}`),
    h("td", {}, r.direction[i] === null ? "—" : r.directions[r.direction[i]]),
    numCell(r.heldout[i]), numCell(r.accuracy[i]),
    h("td", {}, intervalText(r, i)),
    h("td", {}, r.baseline_variant), numCell(r.baseline[i])));
  return h("table", { class: "hx-relations" },
    h("thead", {}, h("tr", {}, ["Relation", "Direction", "Held-out acc.", "In-sample acc.", "Interval (best-heads table)", "Baseline", "Baseline held-out"].map((t) => h("th", {}, t)))),
    h("tbody", {}, body));
}

function scoreTables(data, i) {
  const byTable = new Map();
  data.scores.forEach((s, k) => {
    if (s.values[i] === null) return;
    if (!byTable.has(s.table)) byTable.set(s.table, new Map());
    const rowKey = [s.label, s.column].filter((x) => x !== undefined && x !== "").join(": ");
    const rows = byTable.get(s.table);
    if (!rows.has(rowKey)) rows.set(rowKey, {});
    rows.get(rowKey)[s.measure || ""] = { k, v: s.values[i] };
  });
  const out = [];
  for (const [table, rows] of byTable) {
    const measures = [...new Set([...rows.values()].flatMap((r) => Object.keys(r)))];
    out.push(h("h4", {}, table));
    out.push(h("table", { "data-score-table": table },
      h("thead", {}, h("tr", {}, h("th", {}, "score"), measures.map((m) => h("th", {}, m || "value")))),
      h("tbody", {}, [...rows].map(([name, per]) => h("tr", {}, h("td", {}, name),
        measures.map((m) => per[m] ? numCell(per[m].v) : h("td", {}, "—")))))));
  }
  return out;
}

function analysisLines(data, i) {
  const out = [];
  for (const c of data.cards || []) {
    const lines = c.lines[i] || [];
    if (!lines.length) continue;
    out.push(h("h4", {}, c.title));
    for (const line of lines) out.push(h("p", { "data-card-line": c.analysis }, line));
  }
  return out;
}

function card(data, i) {
  const roles = data.roles;
  const role = roles.role[i] || "—";
  return [
    h("h3", {}, `Head ${data.heads[i]} `, h("span", { class: "hx-badge", style: `background:${roles.colors[role] || "#999"}` }, role)),
    h("p", { "data-field": "detail" }, h("b", {}, "Role: "), role, roles.detail[i] ? ` (${roles.detail[i]})` : ""),
    h("p", { "data-field": "evidence" }, h("b", {}, "Evidence: "), roles.evidence[i] || "—"),
    h("p", { "data-field": "all_roles" }, h("b", {}, "All rules met: "), roles.all[i] || "—"),
    h("h4", {}, "Best relations by held-out accuracy"),
    relationsTable(data, i),
    ...analysisLines(data, i),
    ...scoreTables(data, i),
  ];
}

// ---------------------------------------------------------------- attention lines

function attentionView(data, att, cells, i, sentence, label) {
  const s = att.sentences[sentence];
  const n = s.words.length;
  let start = 0;
  for (let k = 0; k < sentence; k++) start += att.sentences[k].words.length ** 2;
  const base = i * att.cells_per_head + start;
  const rowH = 18, W = 460, top = 16;
  const svg = h("svg", { viewBox: `0 0 ${W} ${top + n * rowH + 6}`, "data-head": data.heads[i], "data-sentence": String(sentence), "data-min-weight": String(MIN_LINE), role: "img", "aria-label": `attention of head ${data.heads[i]}` });
  svg.append(h("text", { x: "10", y: "11", "font-size": "10", fill: "#555" }, "from"), h("text", { x: String(W - 10), y: "11", "font-size": "10", fill: "#555", "text-anchor": "end" }, "to"));
  const y = (k) => top + k * rowH + rowH / 2;
  const x0 = 150, x1 = W - 150;
  const lines = h("g", {});
  for (let a = 0; a < n; a++) for (let b = 0; b < n; b++) {
    const v = cells[base + a * n + b];
    if (v < MIN_LINE) continue;
    lines.append(h("line", { x1: x0, y1: y(a), x2: x1, y2: y(b), stroke: "#1f77b4", "stroke-width": "2", "stroke-opacity": (v / att.scale).toFixed(3), "data-from": String(a), "data-to": String(b), "data-weight": String(v) }));
  }
  svg.append(lines);
  if (label && s.heads) {
    const rel = data.relations.find((r) => r.label === label);
    const dir = rel && rel.direction[i] !== null ? rel.directions[rel.direction[i]] : "dep->head";
    s.heads.forEach((head, dep) => {
      if (head < 0 || !s.deprels || (label !== "ALL" ? s.deprels[dep] !== label : ["root", "punct"].includes(s.deprels[dep]))) return;
      const [a, b] = dir.startsWith("head") ? [head, dep] : [dep, head];
      svg.append(h("line", { class: "hx-gold", x1: x0, y1: y(a), x2: x1, y2: y(b), "stroke-width": "1.5", "data-gold": `${dep}-${head}` }));
    });
  }
  s.words.forEach((w, k) => {
    svg.append(h("text", { x: String(x0 - 6), y: String(y(k) + 4), "text-anchor": "end", "font-size": "12" }, w));
    svg.append(h("text", { x: String(x1 + 6), y: String(y(k) + 4), "font-size": "12" }, w));
  });
  return svg;
}

function labelsOf(att, sentence) {
  const s = att.sentences[sentence];
  return s.deprels ? [...new Set(s.deprels.filter((d, k) => s.heads[k] >= 0))] : [];
}

function attentionPanel(data, state) {
  const att = data.attention;
  const panel = h("div", { class: "hx-attn" });
  if (!att || !att.sentences.length) {
    panel.append(h("p", { class: "hx-note" }, "No stored attention in these results (head_attention.npz absent: example pictures were off or no sentence was drawn)."));
    return { panel, draw() {} };
  }
  const cells = decode(att.cells);
  const sentSel = h("select", { class: "hx-sentence", "aria-label": "example sentence" },
    att.sentences.map((s, k) => h("option", { value: String(k) }, `${k + 1}: ${s.words.slice(0, 8).join(" ")}${s.words.length > 8 ? " …" : ""}`)));
  const relSel = h("select", { class: "hx-gold-label", "aria-label": "relation whose gold arcs are marked" });
  const figure = h("div", {});
  const fillLabels = () => {
    const keep = relSel.value;
    relSel.replaceChildren(h("option", { value: "" }, "(none)"), h("option", { value: "ALL" }, "ALL"),
      ...labelsOf(att, Number(sentSel.value)).map((l) => h("option", { value: l }, l)));
    if ([...relSel.options].some((o) => o.value === keep)) relSel.value = keep;
  };
  const draw = () => {
    if (state.index === null) return;
    figure.replaceChildren(attentionView(data, att, cells, state.index, Number(sentSel.value), relSel.value));
  };
  sentSel.addEventListener("change", () => { fillLabels(); draw(); });
  relSel.addEventListener("change", draw);
  fillLabels();
  panel.append(
    h("div", { class: "hx-controls" }, h("label", {}, "Sentence ", sentSel), h("label", {}, "Gold arcs of ", relSel)),
    h("p", { class: "hx-note" }, "Word-level attention of the selected head (lines from each word, left, to the words it attends to, right; opacity = weight, stored as uint8 / 255). Dashed red: gold arcs of the chosen relation."),
    figure);
  const chooseLabel = (i) => {
    const best = relationRows(data, i).map((x) => x.r.label).find((l) => [...relSel.options].some((o) => o.value === l));
    if (best) relSel.value = best;
  };
  return { panel, draw, chooseLabel };
}

// ---------------------------------------------------------------- mount

export function mount(root, data, opts = {}) {
  root.replaceChildren();
  root.classList.add("hx");
  root.append(h("style", {}, CSS));
  const size = Math.max(9, Math.min(26, Math.floor(420 / Math.max(1, data.n_heads))));
  const { grid, cells } = buildGrid(data, size);
  const choices = colourChoices(data);
  const colourSel = h("select", { class: "hx-colour", "aria-label": "colour the grid by" },
    choices.map((c, k) => h("option", { value: String(k) }, c.text)));
  const legend = h("span", { class: "hx-legend" });
  const cardEl = h("div", { class: "hx-card", "data-card-head": "", "aria-live": "polite" },
    h("p", { class: "hx-note" }, "Select a head (click, or arrow keys then Enter) to see its card."));
  const state = { index: null, focus: 0 };
  const attn = attentionPanel(data, state);
  root.append(
    h("div", { class: "hx-controls" }, h("label", {}, "Colour by ", colourSel), legend),
    h("div", { class: "hx-body" }, grid, cardEl),
    attn.panel);
  paint(data, cells, choices[0], legend);
  colourSel.addEventListener("change", () => paint(data, cells, choices[Number(colourSel.value)], legend));
  const focusCell = (k) => {
    cells[state.focus].setAttribute("tabindex", "-1");
    state.focus = k;
    cells[k].setAttribute("tabindex", "0");
    cells[k].focus();
  };
  const select = (k, notify = true) => {
    if (k === null || k < 0 || k >= cells.length) return;
    if (state.index !== null) cells[state.index].setAttribute("aria-selected", "false");
    state.index = k;
    cells[k].setAttribute("aria-selected", "true");
    cells[state.focus].setAttribute("tabindex", "-1");
    state.focus = k;
    cells[k].setAttribute("tabindex", "0");
    cardEl.setAttribute("data-card-head", data.heads[k]);
    cardEl.replaceChildren(...card(data, k));
    if (attn.chooseLabel) attn.chooseLabel(k);
    attn.draw();
    if (notify && opts.onSelect) opts.onSelect(data.heads[k]);
  };
  cells[0].setAttribute("tabindex", "0");
  grid.addEventListener("click", (e) => {
    const cell = e.target.closest("[data-head]");
    if (cell) { select(Number(cell.dataset.index)); focusCell(Number(cell.dataset.index)); }
  });
  grid.addEventListener("keydown", (e) => {
    const H = data.n_heads, n = cells.length, k = state.focus;
    const moves = { ArrowRight: k + 1, ArrowLeft: k - 1, ArrowDown: k + H, ArrowUp: k - H, Home: k - (k % H), End: k - (k % H) + H - 1 };
    if (e.key in moves) {
      e.preventDefault();
      const to = moves[e.key];
      if (to >= 0 && to < n) focusCell(to);
    } else if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      select(k);
    }
  });
  const byKey = (key) => data.heads.indexOf(key);
  const api = {
    select: (key) => select(byKey(key), false),
    focus: (key) => focusCell(byKey(key)),
    highlight: (key) => {
      cells.forEach((c) => c.classList.remove("hx-match"));
      const k = byKey(key);
      if (k >= 0) cells[k].classList.add("hx-match");
    },
  };
  if (opts.head) api.select(opts.head);
  return api;
}

// ---------------------------------------------------------------- anywidget

function render({ model, el }) {
  const api = mount(el, model.get("data"), {
    head: model.get("head") || null,
    onSelect: (key) => { model.set("head", key); model.save_changes(); },
  });
  model.on("change:head", () => api.select(model.get("head")));
}

export default { render };
