// xcc dashboard: draws the document of /api/events (Server-Sent Events) into the page.
//
// Every string in the document comes from the registries, and names there are chosen by other
// clusters: they reach the page only as text nodes (createTextNode / textContent) or attribute
// values set with setAttribute, never as HTML.
"use strict";

(function () {
  const statusLine = document.getElementById("status");
  const pauseButton = document.getElementById("pause");
  let paused = false;
  let latest = null;

  // An element with attributes and children (strings become text nodes).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined && value !== false) {
        node.setAttribute(name, value === true ? "" : String(value));
      }
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "string" || typeof child === "number"
        ? document.createTextNode(String(child)) : child);
    }
    return node;
  }

  function ago(now, ms) {
    if (ms === null || ms === undefined) return "never";
    const s = Math.max(0, Math.round((now - ms) / 1000));
    if (s < 120) return s + " s ago";
    if (s < 7200) return Math.round(s / 60) + " min ago";
    if (s < 172800) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " days ago";
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "–";
    return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(2) + " s";
  }

  // A state word with its colour class (the word says it; the colour only repeats it).
  function badge(word) {
    const w = String(word || "").toLowerCase();
    let kind = "neutral";
    if (["live", "connected", "granted", "owner", "resolver"].includes(w)) kind = "ok";
    else if (["connecting", "backoff", "pending", "stopped"].includes(w)) kind = "warn";
    else if (["error", "failed", "denied", "notfound", "unavailable"].includes(w)) kind = "bad";
    return el("span", { class: "badge " + kind }, String(word || "–"));
  }

  // A table of rows, or a sentence saying there are none; wide tables scroll on their own.
  function table(caption, list, headers, cells, rowKey) {
    const section = el("section", { class: "part" }, el("h3", null, caption));
    if (!list || list.total === 0) {
      section.appendChild(el("p", { class: "none" }, "None."));
      return section;
    }
    const body = el("tbody", null, list.rows.map((row) => {
      const tr = el("tr", null, cells(row).map((c) => el("td", null, c)));
      if (rowKey) tr.setAttribute("data-row", rowKey(row));
      return tr;
    }));
    const t = el("table", null,
      el("thead", null, el("tr", null, headers.map((h) => el("th", { scope: "col" }, h)))),
      body);
    section.appendChild(el("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": caption, "data-key": "scroll:" + caption }, t));
    if (list.total > list.rows.length) {
      section.appendChild(el("p", { class: "more" }, "Showing " + list.rows.length + " of " + list.total + "."));
    }
    return section;
  }

  function list(items) {
    return (items || []).join(", ") || "–";
  }

  function services(now, caption, svcs, withOwner) {
    const headers = withOwner
      ? ["FQDN", "Owner", "Namespace/name", "From", "Endpoints", "Allowed", "Changed"]
      : ["FQDN", "Namespace/name", "Endpoints", "Allowed", "Changed"];
    return table(caption, svcs, headers, (s) => {
      const allowed = s.allowed.length ? s.allowed.join(", ") : "every cluster";
      const common = [s.fqdn, s.namespace + "/" + s.name];
      return withOwner
        ? [s.fqdn, s.owner, s.namespace + "/" + s.name, s.source, list(s.endpoints), allowed, ago(now, s.changedAt)]
        : [...common, list(s.endpoints), allowed, ago(now, s.changedAt)];
    }, (s) => s.fqdn);
  }

  function registry(doc, r, index) {
    const now = doc.now;
    const title = r.cluster || r.addr;
    const section = el("section", { id: "r" + index, class: "registry", "data-cluster": r.cluster, "aria-labelledby": "r" + index + "-title" });
    section.appendChild(el("h2", { id: "r" + index + "-title" }, title, " ", badge(r.status)));
    const facts = el("dl", { class: "facts" },
      el("dt", null, "Admin API"), el("dd", null, r.addr),
      el("dt", null, "Parent"), el("dd", null, r.parent ? [r.parent, " ", badge(r.parentState)] : "none (a root)"),
      el("dt", null, "Subtree"), el("dd", null, list(r.subtree)),
      el("dt", null, "Read"), el("dd", null, r.readAgoMs === null ? "not yet" : ago(now, now - r.readAgoMs)));
    if (r.error) {
      facts.append(el("dt", null, "Error"), el("dd", { class: "error" }, r.error));
    }
    if (r.overflows) {
      facts.append(el("dt", null, "Queue overflows"), el("dd", null, String(r.overflows)));
    }
    if (r.heldNames) {
      facts.append(el("dt", null, "Names held for absent owners"), el("dd", null, String(r.heldNames)));
    }
    section.appendChild(facts);
    section.appendChild(table("Refusals", r.refused,
      ["Kind", "Entry", "Failed check", "Cedar policies", "Code", "Refused by", "Reason", "When"],
      (x) => [x.kind, x.entry, x.check || "–", list(x.policies), x.code, x.refusedBy, x.reason, ago(now, x.at)],
      (x) => x.entry));
    section.appendChild(table("Imports requested through the tree", r.requested,
      ["Service", "As workload", "State", "Owner", "Reason", "Endpoints"],
      (x) => [x.target, x.as || "–", badge(x.state), x.owner || "–", x.reason || "–", list(x.endpoints)],
      (x) => x.target));
    section.appendChild(services(now, "Exports", r.exports, false));
    section.appendChild(services(now, "Imports and services from below", r.imports, true));
    section.appendChild(table("Peers", r.peers,
      ["Kind", "Name", "Identity", "State", "Records", "Last sync", "NACKs", "Reconnects", "Last error"],
      (p) => [p.kind, p.name, p.identity, badge(p.state), String(p.records), ago(now, p.lastSync), String(p.nacks), String(p.reconnects), p.lastError || "–"],
      (p) => p.name));
    section.appendChild(table("Children", r.children,
      ["Cluster", "Subtree", "Services", "Queued routes", "Connected"],
      (c) => [c.cluster, list(c.subtree), String(c.services), String(c.queuedRoutes), ago(now, c.connectedSince)],
      (c) => c.cluster));
    section.appendChild(table("Grants", r.grants,
      ["Role", "Service", "Caller", "Decided by", "Applied", "Since"],
      (g) => [badge(g.role), g.target, g.caller, g.resolver, list(g.applied), ago(now, g.since)],
      (g) => g.target + " " + g.caller));
    const prop = { total: r.propagation.length, rows: r.propagation };
    section.appendChild(table("Propagation latency (exporter's change until this registry's catalog had it)", prop,
      ["From", "Last", "Median", "Max", "Window", "Observed", "Clock skew"],
      (p) => [p.source, duration(p.lastMs), duration(p.medianMs), duration(p.maxMs), String(p.window), String(p.count), String(p.skewed)],
      (p) => p.source));
    return section;
  }

  // What a registry refuses or was refused: its parent's refusals and its denied imports.
  function refusals(r) {
    return r.refused.total + r.requested.rows.filter((x) => x.state === "Denied").length;
  }

  function treeNode(node, sections, registries) {
    const index = sections.get(node.cluster);
    const label = index === undefined
      ? el("span", { class: "cluster" }, node.cluster)
      : el("a", { href: "#r" + index, "data-key": "tree:" + node.cluster }, node.cluster);
    const li = el("li", { "data-cluster": node.cluster }, label);
    if (node.link) li.append(" ", badge(node.link));
    if (node.inferred) li.append(" ", el("span", { class: "note" }, "(somewhere below)"));
    if (index === undefined) {
      li.append(" ", el("span", { class: "note" }, "not read by this dashboard"));
    } else {
      const n = refusals(registries[index]);
      if (n > 0) li.append(" ", el("span", { class: "badge bad" }, n === 1 ? "1 refusal" : n + " refusals"));
    }
    if (node.children.length) {
      li.appendChild(el("ul", null, node.children.map((c) => treeNode(c, sections, registries))));
    }
    return li;
  }

  // Focus and scroll positions survive a redraw: elements that can hold focus carry data-key.
  function keyed(root) {
    const map = new Map();
    for (const node of root.querySelectorAll("[data-key]")) map.set(node.getAttribute("data-key"), node);
    return map;
  }

  function render(doc) {
    const focused = document.activeElement && document.activeElement.getAttribute("data-key");
    const scrolls = new Map([...keyed(document)].map(([k, n]) => [k, n.scrollLeft]));
    const sections = new Map();
    doc.registries.forEach((r, i) => { if (r.cluster && !sections.has(r.cluster)) sections.set(r.cluster, i); });
    document.getElementById("tree").replaceChildren(doc.tree.length
      ? el("ul", { class: "tree" }, doc.tree.map((n) => treeNode(n, sections, doc.registries)))
      : el("p", null, "No registry read yet."));
    document.getElementById("nav").replaceChildren(...doc.registries.map((r, i) =>
      el("li", null, el("a", { href: "#r" + i, "data-key": "nav:" + i }, r.cluster || r.addr), " ", badge(r.status))));
    document.getElementById("registries").replaceChildren(...doc.registries.map((r, i) => registry(doc, r, i)));
    const now = keyed(document);
    for (const [k, left] of scrolls) if (now.has(k)) now.get(k).scrollLeft = left;
    if (focused && now.has(focused)) now.get(focused).focus({ preventScroll: true });
    const live = doc.registries.filter((r) => r.status === "live").length;
    statusLine.textContent = (paused ? "Paused. " : "Live. ") + live + " of " + doc.registries.length +
      " registries read; updated " + new Date(doc.now).toLocaleTimeString() + ".";
    document.body.setAttribute("data-updated", String(doc.now));
  }

  pauseButton.addEventListener("click", () => {
    paused = !paused;
    pauseButton.setAttribute("aria-pressed", String(paused));
    pauseButton.textContent = paused ? "Resume updates" : "Pause updates";
    if (!paused && latest) render(latest);
    else if (paused) statusLine.textContent = "Paused: the page shows the last update until you resume.";
  });

  const events = new EventSource("/api/events");
  events.addEventListener("state", (e) => {
    let doc;
    try {
      doc = JSON.parse(e.data);
    } catch (err) {
      statusLine.textContent = "The dashboard sent a document this page cannot read.";
      return;
    }
    latest = doc;
    if (!paused) render(doc);
  });
  events.addEventListener("error", () => {
    statusLine.textContent = "Lost the dashboard's event stream; reconnecting…";
  });
})();
