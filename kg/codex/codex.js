/* The codex page's picture: the graph of entities and relationships (Cytoscape.js), a
 * slider that shows the world as of an earlier chapter (turn), filters by kind, a tooltip
 * with a relationship's type and history on hover, and the whole story with quotes on click.
 * An edge is drawn with its short caption (at most 40 characters, cut in kg/codex/models.py);
 * the tooltip and the panel give its full label.
 * Data comes from the JSON element #codex-data; text is always set with textContent. */
(function () {
  "use strict";
  var raw = JSON.parse(document.getElementById("codex-data").textContent);
  var graph = raw.graph;
  var unit = graph.axis;
  var COLORS = {
    Character: "#4e79a7", Location: "#59a14f", Item: "#f28e2b", Event: "#e15759",
    Faction: "#b07aa1", Lore: "#9c755f", Concept: "#9aa4ae", Trait: "#edc948"
  };
  var DEAD = { dead: true, deceased: true };
  var nodesById = {};
  var edgesById = {};
  graph.nodes.forEach(function (n) { nodesById[n.id] = n; });
  graph.edges.forEach(function (e) { edgesById[e.id] = e; });

  function when(n) {
    if (raw.kind === "novel") { return n === 0 ? "story bible" : "chapter " + n; }
    return graph.labels[String(n)] || "committed " + unit + " #" + n;
  }
  function statusAt(node, k) {
    var found = null;
    (node.statuses || []).forEach(function (s) {
      if (s.start <= k && (s.end === null || k <= s.end)) { found = s.status; }
    });
    return found;
  }
  /* "active", "ended" or null (not stated yet) as of k */
  function edgeState(edge, k) {
    var state = null;
    edge.spans.forEach(function (span) {
      if (span[0] <= k) {
        if (span[1] === null || k < span[1]) { state = "active"; } else if (state === null) { state = "ended"; }
      }
    });
    return state;
  }
  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) { node.textContent = text; }
    if (cls) { node.className = cls; }
    return node;
  }

  var elements = [];
  graph.nodes.forEach(function (n) {
    elements.push({ group: "nodes", data: { id: n.id, name: n.name, kind: n.kind, label: n.name,
      color: COLORS[n.kind] || "#9aa4ae" }, classes: n.flagged ? "flagged" : "" });
  });
  graph.edges.forEach(function (e) {
    /* the canvas draws the short caption; the tooltip and the side panel name the full label */
    elements.push({ group: "edges", data: { id: e.id, source: e.source, target: e.target, label: e.caption } });
  });
  var many = graph.nodes.length > 250;
  var cy = cytoscape({
    container: document.getElementById("cy"),
    elements: elements,
    minZoom: 0.1,
    maxZoom: 4,
    style: [
      { selector: "node", style: {
        "background-color": "data(color)", "label": "data(label)", "font-size": 11, "color": "#1f2328",
        "text-valign": "bottom", "text-margin-y": 4, "width": 18, "height": 18,
        "text-outline-color": "#fff", "text-outline-width": 2 } },
      { selector: "node[kind = 'Character']", style: { "width": 26, "height": 26, "font-size": 13, "font-weight": "bold" } },
      { selector: "node[kind = 'Location']", style: { "shape": "round-rectangle" } },
      { selector: "node[kind = 'Item']", style: { "shape": "diamond" } },
      { selector: "node.dead", style: { "background-color": "#8c959f", "border-width": 2, "border-color": "#1f2328" } },
      { selector: "node.flagged", style: { "border-width": 3, "border-color": "#b42318" } },
      { selector: "edge", style: {
        "width": 2, "line-color": "#9aa4ae", "target-arrow-color": "#9aa4ae", "target-arrow-shape": "triangle",
        "curve-style": "bezier", "font-size": 9, "color": "#3d4650", "text-rotation": "autorotate",
        "text-background-color": "#fff", "text-background-opacity": 0.85, "text-background-padding": 1 } },
      { selector: "edge.labelled", style: { "label": "data(label)" } },
      { selector: "edge.ended", style: { "line-style": "dashed", "opacity": 0.45 } },
      { selector: ".off", style: { "display": "none" } },
      { selector: ":selected", style: { "line-color": "#8c4a2f", "target-arrow-color": "#8c4a2f", "border-width": 3,
        "border-color": "#8c4a2f", "width": 3 } }
    ],
    layout: { name: "circle", animate: false }
  });
  if (cy.nodes().length > 1) {
    cy.layout(many
      ? { name: "concentric", animate: false, minNodeSpacing: 8,
          concentric: function (n) { return n.degree(); }, levelWidth: function () { return 2; } }
      : { name: "cose", animate: false, randomize: false, nodeDimensionsIncludeLabels: true,
          nodeRepulsion: function () { return 200000; }, nodeOverlap: 20, idealEdgeLength: function () { return 110; },
          gravity: 1, numIter: 2000, componentSpacing: 60 }).run();
  }

  var slider = document.getElementById("asof-slider");
  var sliderLabel = document.getElementById("asof-label");
  var labelsBox = document.getElementById("edge-labels");
  var hiddenKinds = {};
  labelsBox.checked = graph.edges.length <= 60;

  function apply() {
    var k = parseInt(slider.value, 10);
    sliderLabel.textContent = when(k);
    cy.batch(function () {
      cy.nodes().forEach(function (node) {
        var n = nodesById[node.id()];
        var shown = (n.first === null || n.first <= k) && !hiddenKinds[n.kind];
        node.toggleClass("off", !shown);
        var status = statusAt(n, k);
        var dead = status !== null && DEAD[status.toLowerCase()] === true;
        node.toggleClass("dead", dead);
        node.data("label", dead ? n.name + " \u2020" : n.name);
      });
      cy.edges().forEach(function (edge) {
        var e = edgesById[edge.id()];
        var state = edgeState(e, k);
        var shown = state !== null && !edge.source().hasClass("off") && !edge.target().hasClass("off");
        edge.toggleClass("off", !shown);
        edge.toggleClass("ended", state === "ended");
        edge.toggleClass("labelled", labelsBox.checked);
      });
    });
  }

  var filters = document.getElementById("kind-filters");
  var kinds = {};
  graph.nodes.forEach(function (n) { kinds[n.kind] = (kinds[n.kind] || 0) + 1; });
  Object.keys(kinds).sort().forEach(function (kind) {
    var label = el("label");
    var box = el("input");
    box.type = "checkbox";
    box.checked = true;
    box.addEventListener("change", function () { hiddenKinds[kind] = !box.checked; apply(); });
    var swatch = el("span", null, "swatch");
    swatch.style.background = COLORS[kind] || "#9aa4ae";
    label.appendChild(box);
    label.appendChild(swatch);
    label.appendChild(document.createTextNode(kind + " (" + kinds[kind] + ")"));
    filters.appendChild(label);
  });
  slider.addEventListener("input", apply);
  labelsBox.addEventListener("change", apply);

  /* hover: the type and the latest history */
  var tip = document.getElementById("tip");
  function edgeTitle(e) {
    return nodesById[e.source].name + " \u2014 " + e.label + " \u2192 " + nodesById[e.target].name;
  }
  function fillTip(target) {
    tip.textContent = "";
    if (target.isEdge()) {
      var e = edgesById[target.id()];
      tip.appendChild(el("strong", edgeTitle(e)));
      var k = parseInt(slider.value, 10);
      var lines = e.events.filter(function (ev) { return ev.at === null || ev.at <= k; });
      var recent = lines.slice(-5);
      if (lines.length > recent.length) { tip.appendChild(el("div", "\u2026 " + (lines.length - recent.length) + " earlier")); }
      recent.forEach(function (ev) {
        var row = el("div", ev.where + ": " + ev.what + " ");
        if (ev.quote) { row.appendChild(el("q", ev.quote)); }
        tip.appendChild(row);
      });
      if (e.ended_by && edgeState(e, k) === "ended") { tip.appendChild(el("div", "ended: " + e.ended_by)); }
    } else {
      var n = nodesById[target.id()];
      tip.appendChild(el("strong", n.name));
      tip.appendChild(el("div", n.kind + (n.first !== null ? ", first in " + when(n.first) : "")));
    }
  }
  cy.on("mouseover", "node, edge", function (evt) {
    fillTip(evt.target);
    tip.hidden = false;
  });
  cy.on("mousemove", function (evt) {
    if (!tip.hidden && evt.originalEvent) {
      tip.style.left = (evt.originalEvent.clientX + 14) + "px";
      tip.style.top = (evt.originalEvent.clientY + 14) + "px";
    }
  });
  cy.on("mouseout", "node, edge", function () { tip.hidden = true; });

  /* click: the whole story in the side panel */
  var details = document.getElementById("details");
  function showEdge(e) {
    details.textContent = "";
    details.appendChild(el("h3", edgeTitle(e)));
    var k = parseInt(slider.value, 10);
    var state = edgeState(e, k);
    details.appendChild(el("p", state === "ended" ? "Ended" + (e.ended_by ? ": " + e.ended_by : "") + "." :
      "Active as of " + when(k) + (e.weight !== null && raw.kind === "dialogue" ? ", weight " + e.weight.toFixed(2) : "") + "."));
    var list = el("ol");
    e.events.forEach(function (ev) {
      var item = el("li", ev.where + ": " + ev.what + " ");
      if (ev.quote) { item.appendChild(el("q", ev.quote)); }
      list.appendChild(item);
    });
    details.appendChild(list);
  }
  function showNode(n) {
    details.textContent = "";
    details.appendChild(el("h3", n.name));
    var k = parseInt(slider.value, 10);
    var status = statusAt(n, k);
    details.appendChild(el("p", n.kind + (status ? ", " + status : "") + (n.first !== null ? ", first in " + when(n.first) : "")));
    var link = el("a", "Open its card, with every fact and quote");
    link.href = "#" + n.anchor;
    details.appendChild(link);
    var list = el("ul");
    graph.edges.forEach(function (e) {
      if ((e.source === n.id || e.target === n.id) && edgeState(e, k) !== null) {
        var item = el("li", edgeTitle(e) + (edgeState(e, k) === "ended" ? " (ended)" : ""));
        list.appendChild(item);
      }
    });
    details.appendChild(list);
  }
  cy.on("tap", "edge", function (evt) { showEdge(edgesById[evt.target.id()]); });
  cy.on("tap", "node", function (evt) { showNode(nodesById[evt.target.id()]); });

  function fit() {
    cy.fit(cy.elements(":visible"), 24);
    if (cy.zoom() > 1.6) { cy.zoom(1.6); cy.center(cy.elements(":visible")); }
  }
  document.getElementById("fit").addEventListener("click", fit);
  apply();
  fit();
  window.codex = { cy: cy, apply: apply, edgeState: edgeState, data: raw };
  document.documentElement.setAttribute("data-codex-ready", "true");
})();
