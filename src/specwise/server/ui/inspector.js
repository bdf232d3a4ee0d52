/*
 * specwise trace inspector: the page logic (vanilla ES2020, no modules, no build step).
 *
 * Views are chosen by the URL hash: #live, #run, #request/<id>, #requests?config=&category=&prompt_id=,
 * #bench, #compare?a=&b=. Data comes from /ui/api/... as JSON, and streams are server-sent events
 * read with fetch() so that the API key (sessionStorage "specwise.key") can travel in a header.
 * Generated text is drawn as one HTML string of token spans; a single shared tooltip (#tip)
 * explains a token on hover or tap, looking its round up in the rounds kept in memory.
 */
"use strict";

const KEY_STORAGE = "specwise.key";
const K_CHOICES = [0, 1, 2, 3, 4, 6, 8];
const ROUNDS_PER_PAGE = 200;
const CHUNK_TOKENS = 300;

const VIEWS = {
  live: { title: "Live", modes: ["live"], nav: ["live"], render: renderLive },
  run: { title: "Run", modes: ["live"], nav: ["live"], render: renderRun },
  bench: { title: "Bench", modes: ["bench"], nav: ["bench"], render: renderBench },
  requests: { title: "Requests", modes: ["live", "trace", "bench"], nav: ["trace", "bench"], render: renderRequests },
  request: { title: "Request", modes: ["live", "trace", "bench"], nav: [], render: renderRequest },
  compare: { title: "Compare", modes: ["live", "trace", "bench"], nav: [], render: renderCompare },
};
const DEFAULT_VIEW = { live: "live", trace: "requests", bench: "bench" };

const app = { info: null, controller: null };
const run = { el: null, session: null };
const tip = { pinned: null, marked: [] };

/* ---------- small helpers ---------- */

const $ = (selector, root = document) => root.querySelector(selector);
const enc = encodeURIComponent;
const HTML_ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

function esc(value) {
  return String(value).replace(/[&<>"']/g, (c) => HTML_ESCAPES[c]);
}

function fmt(x, digits = 2) {
  return x == null || !Number.isFinite(Number(x)) ? "—" : Number(x).toFixed(digits);
}

function pct(x) {
  return x == null ? "—" : `${(100 * x).toFixed(1)}%`;
}

function fmtProb(p) {
  if (p == null) return "—";
  return p === 0 || p >= 0.001 ? p.toFixed(4) : p.toExponential(2);
}

function perSecond(tokensPerMs, digits = 1) {
  return tokensPerMs == null ? "—" : `${fmt(tokensPerMs * 1000, digits)} tok/s`;
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

function ratio(num, den) {
  return den ? num / den : null;
}

/** A piece of text with its whitespace made visible, for the tooltip and the rounds table. */
function pieceHtml(piece) {
  if (piece == null) return '<code class="piece">?</code>';
  let shown = piece === "" ? "∅" : piece.replace(/\n/g, "⏎").replace(/\t/g, "⇥");
  if (!shown.trim()) shown = shown.replace(/ /g, "␣"); // a token of spaces only
  return `<code class="piece">${esc(shown)}</code>`;
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

/* ---------- errors and the API key ---------- */

class AuthNeeded extends Error {}

function showError(err) {
  if (err && err.name === "AbortError") return;
  const bar = $("#error");
  bar.textContent = err instanceof Error ? err.message : String(err);
  bar.hidden = false;
}

function clearError() {
  $("#error").hidden = true;
  $("#error").textContent = "";
}

function showKeyForm() {
  $("#key-form").hidden = false;
  $("#key-input").focus();
}

function onKeySubmit(event) {
  event.preventDefault();
  sessionStorage.setItem(KEY_STORAGE, $("#key-input").value.trim());
  $("#key-input").value = "";
  $("#key-form").hidden = true;
  clearError();
  if (app.info) route();
  else boot();
}

/* ---------- HTTP ---------- */

function authHeaders(headers = {}) {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
}

async function errorMessage(res) {
  try {
    const body = await res.json();
    return (body && body.error && body.error.message) || `${res.status} ${res.statusText}`;
  } catch {
    return `${res.status} ${res.statusText}`;
  }
}

/** fetch() with the key; a 401 opens the key form, any other failure throws the server's message. */
async function request(path, { method = "GET", body, signal } = {}) {
  const init = { method, signal, headers: authHeaders() };
  if (body !== undefined) {
    init.headers = authHeaders({ "Content-Type": "application/json" });
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (res.status === 401) {
    showKeyForm();
    throw new AuthNeeded(await errorMessage(res));
  }
  if (!res.ok) throw new Error(await errorMessage(res));
  return res;
}

async function getJSON(path, options) {
  return (await request(path, options)).json();
}

/** Reads a server-sent event stream (lines "data: {json}", events split by a blank line). */
async function readEvents(path, signal, onMessage) {
  const res = await request(path, { signal });
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = /\r?\n\r?\n/.exec(buffer))) {
      const block = buffer.slice(0, end.index);
      buffer = buffer.slice(end.index + end[0].length);
      const data = block.split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) onMessage(JSON.parse(data));
    }
  }
}

/* ---------- routing ---------- */

function allowed(name) {
  const view = VIEWS[name];
  if (!view || !view.modes.includes(app.info.mode)) return false;
  return name !== "run" || !app.info.read_only;
}

function defaultView() {
  return DEFAULT_VIEW[app.info.mode] || "requests";
}

function parseHash() {
  const raw = location.hash.replace(/^#/, "");
  const cut = raw.indexOf("?");
  const head = cut < 0 ? raw : raw.slice(0, cut);
  const query = cut < 0 ? "" : raw.slice(cut + 1);
  const slash = head.indexOf("/");
  const name = (slash < 0 ? head : head.slice(0, slash)) || defaultView();
  let arg = slash < 0 ? null : head.slice(slash + 1);
  try {
    arg = arg == null ? null : decodeURIComponent(arg);
  } catch {
    /* a hand-typed id that is not valid percent-encoding: use it as written */
  }
  return { name, arg, params: new URLSearchParams(query) };
}

function route() {
  if (!app.info) return;
  hideTip();
  clearError();
  if (app.controller) app.controller.abort();
  app.controller = new AbortController();
  const signal = app.controller.signal;

  let where = parseHash();
  if (!allowed(where.name)) {
    const known = VIEWS[where.name];
    history.replaceState(null, "", `#${defaultView()}`);
    showError(known ? `The ${known.title} view is not available in ${app.info.mode} mode.`
      : `Unknown view "#${where.name}".`);
    where = parseHash();
  }
  markNav(where.name);
  const view = $("#view");
  view.replaceChildren();
  Promise.resolve(VIEWS[where.name].render(view, where, signal))
    .catch((err) => { if (!signal.aborted) showError(err); });
}

/* ---------- header ---------- */

function renderHeader() {
  const { info } = app;
  $("#model").textContent = info.model;
  $("#mode").textContent = info.read_only ? `${info.mode} · read only` : info.mode;
  $("#source").textContent = info.source || "";
  $("#nav").innerHTML = Object.entries(VIEWS)
    .filter(([name, view]) => view.nav.includes(info.mode) && allowed(name))
    .map(([name, view]) => `<a href="#${name}" data-view="${name}">${view.title}</a>`)
    .join("");
  document.title = `specwise · ${info.model}`;
}

function markNav(name) {
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.view === name);
  }
}

/* ---------- figures ---------- */

/** Summary figures, from the server's summary where it has them, else from the rounds. */
function figures(rounds, summary) {
  const s = summary || {};
  const total = (key) => rounds.reduce((acc, r) => acc + (r[key] || 0), 0);
  const emitted = total("emitted");
  const ms = total("draft_ms") + total("verify_ms") + total("overhead_ms");
  const first = rounds.find((r) => r.emitted > 0);
  const pick = (key, fallback) => (key in s ? s[key] : fallback);
  const goodput = pick("goodput_tokens_per_ms", ratio(emitted, ms));
  return {
    rounds: pick("rounds", rounds.length),
    emitted: pick("emitted", emitted),
    acceptance: pick("acceptance_rate", ratio(total("accepted"), total("proposed"))),
    tau: pick("mean_accepted_length", ratio(emitted, rounds.length)),
    tokensPerS: goodput == null ? null : goodput * 1000,
    ttft: pick("ttft_ms", first ? first.t_ms : null),
  };
}

function checkHtml(check) {
  if (check.match) return '<span class="fig check check-ok">check: match</span>';
  const nearTie = check.near_tie == null ? "—" : check.near_tie ? "yes" : "no";
  return `<span class="fig check check-bad">check: diverges at token ${esc(check.position)}`
    + ` · top-2 gap ${fmt(check.top2_gap, 3)} · near-tie ${nearTie}</span>`;
}

function figuresHtml(rounds, summary, check) {
  const f = figures(rounds, summary);
  const items = [
    ["rounds", f.rounds],
    ["emitted", f.emitted],
    ["acceptance", pct(f.acceptance)],
    ["τ mean accepted length", fmt(f.tau)],
    ["tokens/s", fmt(f.tokensPerS, 1)],
    ["TTFT", f.ttft == null ? "—" : `${fmt(f.ttft, 0)} ms`],
  ];
  const html = items.map(([k, v]) => `<span class="fig"><span class="fig-k">${k}</span> <span class="fig-v">${v}</span></span>`);
  if (check) html.push(checkHtml(check));
  return html.join("");
}

/* ---------- tokens ---------- */

function drafterClass(name) {
  const n = name.toLowerCase();
  if (n.startsWith("ngram")) return "drafter-ngram";
  if (n.startsWith("suffix")) return "drafter-suffix";
  if (n.includes("draft") || n.includes("model")) return "drafter-model";
  return "drafter-other";
}

function indexRounds(rounds) {
  return new Map(rounds.map((r) => [r.round, r]));
}

/**
 * A whole request's tokens as one HTML string, cut into <div class="chunk"> blocks after a token
 * that ends a line (so the text flows exactly as one block would): the browser skips the layout
 * of chunks that are off screen (content-visibility), which keeps long requests fast to open.
 * Tokens numbered `divergeFrom` and after get the class "diverged".
 */
function textHtml(rounds, divergeFrom = null) {
  return `<div class="chunk">${tokenSpans(rounds, divergeFrom, 0, true).join("")}</div>`;
}

/** The token spans, or the request's final text (uncoloured) when it has no rounds recorded. */
function requestTextHtml(req, divergeFrom) {
  const rounds = req.rounds || [];
  if (rounds.length || req.text == null) return textHtml(rounds, divergeFrom);
  return `<span class="untraced" title="No rounds were recorded for this request">${esc(req.text)}</span>`;
}

/** One streamed round's token spans, numbered from `start`. */
function roundHtml(round, start) {
  return tokenSpans([round], null, start, false).join("");
}

/** One span per token: class tok tok-ORIGIN (+ drafter, round-start, ...), data-round/-i/-n. */
function tokenSpans(rounds, divergeFrom, start, chunked) {
  const parts = [];
  let n = start;
  let inChunk = 0;
  for (const r of rounds) {
    const drafter = r.drafter ? ` data-drafter="${esc(r.drafter)}"` : "";
    const drafterCls = r.drafter ? ` ${drafterClass(r.drafter)}` : "";
    const startCls = r.detail && r.detail.params_changed ? " round-start params-changed" : " round-start";
    for (let i = 0; i < r.tokens.length; i++, n++) {
      const origin = (r.origins && r.origins[i]) || "plain";
      const text = r.pieces ? r.pieces[i] || "" : `${r.tokens[i]} `;
      let cls = `tok tok-${esc(origin)}`;
      let attrs = "";
      if (origin === "accepted" && r.drafter) {
        cls += drafterCls;
        attrs = drafter;
      }
      if (i === 0) cls += startCls;
      if (divergeFrom != null && n >= divergeFrom) cls += " diverged";
      if (text.includes("\n")) cls += " tok-nl";
      else if (text === "") cls += " tok-empty";
      parts.push(`<span class="${cls}" data-round="${r.round}" data-i="${i}" data-n="${n}"${attrs}>${esc(text)}</span>`);
      inChunk++;
      if (chunked && inChunk >= CHUNK_TOKENS && text.endsWith("\n")) {
        parts.push('</div><div class="chunk">');
        inChunk = 0;
      }
    }
  }
  return parts;
}

function legendHtml(drafters, withDiverged = false) {
  const names = [...new Set(drafters.filter(Boolean))];
  const keys = names.map((d) => `<span class="key key-${drafterClass(d).slice(8)}">accepted · ${esc(d)}</span>`);
  keys.push(
    '<span class="key key-recovered">recovered</span>',
    '<span class="key key-bonus">bonus</span>',
    '<span class="key key-plain">plain</span>',
    '<span class="key key-round">round start</span>',
    '<span class="key key-params">sampling changed</span>',
  );
  if (withDiverged) keys.push('<span class="key key-diverged">diverged</span>');
  return keys.join("");
}

function roundDrafters(rounds) {
  return rounds.map((r) => r.drafter);
}

/* ---------- tooltip ---------- */

/** One listener set per text container; `lookup(roundNumber)` finds the round in memory. */
function attachTip(container, lookup) {
  container.addEventListener("mouseover", (event) => {
    const tok = event.target.closest(".tok");
    if (tok && !tip.pinned) showTip(tok, lookup);
  });
  container.addEventListener("mouseout", (event) => {
    const tok = event.target.closest(".tok");
    if (tok && !tip.pinned && !tok.contains(event.relatedTarget)) hideTip();
  });
  container.addEventListener("click", (event) => {
    const tok = event.target.closest(".tok");
    if (!tok) return;
    if (tip.pinned === tok) {
      hideTip();
      return;
    }
    showTip(tok, lookup);
    pinTip(tok);
  });
}

function showTip(tok, lookup) {
  const round = lookup(Number(tok.dataset.round));
  if (!round) return;
  hideTip();
  const el = $("#tip");
  el.innerHTML = tipHtml(round, Number(tok.dataset.i), tok.dataset.n);
  el.hidden = false;
  markRound(tok);
  placeTip(el, tok.getBoundingClientRect());
}

function pinTip(tok) {
  tip.pinned = tok;
  $("#tip").classList.add("pinned");
}

function hideTip() {
  tip.pinned = null;
  $("#tip").classList.remove("pinned");
  $("#tip").hidden = true;
  for (const el of tip.marked) el.classList.remove("round-hl", "tok-active");
  tip.marked = [];
}

/** Outlines the tokens of `tok`'s round (a round spans at most two neighbouring chunks). */
function markRound(tok) {
  const box = tok.parentElement;
  const boxes = box.classList.contains("chunk") ? [box.previousElementSibling, box, box.nextElementSibling] : [box];
  const selector = `.tok[data-round="${tok.dataset.round}"]`;
  tip.marked = boxes.filter(Boolean).flatMap((b) => [...b.querySelectorAll(selector)]);
  for (const el of tip.marked) el.classList.add("round-hl");
  tok.classList.add("tok-active");
}

/** Below the token if it fits, else above; always inside the viewport. */
function placeTip(el, rect) {
  const margin = 8;
  const w = el.offsetWidth;
  const h = el.offsetHeight;
  let top = rect.bottom + 6;
  if (top + h > innerHeight - margin) top = rect.top - h - 6;
  top = Math.max(margin, Math.min(top, innerHeight - h - margin));
  const left = Math.max(margin, Math.min(rect.left, innerWidth - w - margin));
  el.style.top = `${top}px`;
  el.style.left = `${left}px`;
}

/** A click outside tokens, the tooltip and the rounds table unpins the tooltip. */
function onDocumentClick(event) {
  if (tip.pinned && !event.target.closest(".tok, #tip, tr[data-round]")) hideTip();
}

/** A pinned tooltip follows its token while it stays on screen; any other tooltip goes away. */
function onScroll(event) {
  if (event.target instanceof Element && event.target.closest("#tip")) return;
  const rect = tip.pinned && tip.pinned.isConnected ? tip.pinned.getBoundingClientRect() : null;
  if (rect && rect.bottom > 0 && rect.top < innerHeight) placeTip($("#tip"), rect);
  else hideTip();
}

function tipRow(label, value) {
  return `<tr><th>${label}</th><td>${value}</td></tr>`;
}

function draftHtml(r) {
  const d = r.detail;
  if (!d) return r.proposed ? `${r.proposed} proposed, ${r.accepted} accepted` : "nothing drafted";
  const pieces = d.draft_pieces || (d.draft || []).map(String);
  if (!pieces.length) return "nothing drafted";
  const tree = d.parents != null;
  const rej = r.rejection_position;
  const kept = rej == null ? r.accepted : rej;
  const items = pieces.map((piece, j) => {
    let cls = "";
    if (!tree) cls = j < kept ? "draft-ok" : j === rej ? "draft-rej" : "draft-skip";
    return `<span class="draft-tok ${cls}">${pieceHtml(piece)}</span>`;
  });
  const note = `${tree ? "tree · " : ""}${r.proposed} proposed, ${r.accepted} accepted`;
  return `${items.join(" ")} <span class="muted">(${note})</span>`;
}

function paramsText(params) {
  if (!params) return "";
  return `temperature ${params.temperature}, top-p ${params.top_p}, top-k ${params.top_k}, min-p ${params.min_p}`;
}

function probabilitiesHtml(d, pos, piece) {
  const pLabel = d.p_kind === "softmax" ? "p (softmax; greedy takes the argmax)" : "p (warped)";
  const lines = [`<tr><th></th><th>token</th><th>${pLabel}</th><th>q (drafter)</th></tr>`,
    `<tr><th>emitted</th><td>${pieceHtml(piece)}</td><td class="num">${fmtProb(pos.p)}</td><td class="num">${fmtProb(pos.q)}</td></tr>`];
  if (pos.proposed != null) {
    lines.push(`<tr><th>proposed</th><td>${pieceHtml(pos.proposed_piece)}</td>`
      + `<td class="num">${fmtProb(pos.p_proposed)}</td><td class="num">${fmtProb(pos.q_proposed)}</td></tr>`);
  }
  return `<table class="tip-probs">${lines.join("")}</table>`;
}

function topHtml(pos) {
  const rows = (pos.top || []).map(([id, piece, prob]) => {
    const cls = id === pos.token ? ' class="is-emitted"' : id === pos.proposed ? ' class="is-proposed"' : "";
    const bar = `<span class="bar" style="width:${Math.round(prob * 80)}px"></span>`;
    return `<tr${cls}><td>${pieceHtml(piece)}</td><td class="num">${fmtProb(prob)}</td><td>${bar}</td></tr>`;
  });
  return `<table class="tip-top">${rows.join("")}</table>`;
}

function tipHtml(r, i, n) {
  const origin = (r.origins && r.origins[i]) || "plain";
  const d = r.detail;
  const pos = d && d.positions ? d.positions[i] : null;
  const piece = r.pieces ? r.pieces[i] : null;
  const keyCls = origin === "accepted" && r.drafter ? drafterClass(r.drafter).slice(8) : esc(origin);
  const out = [`<div class="tip-head">Round ${esc(r.round)} · ${esc(r.drafter || "plain")} · `
    + `<span class="key key-${keyCls}">${esc(origin)}</span></div>`];
  if (r.acceptance) {
    out.push(`<div class="tip-warn">LOSSY acceptance rule ${esc(r.acceptance)}: this round's tokens are not a sample of the target's distribution</div>`);
  }
  if (d && d.params_changed) {
    out.push(`<div class="tip-warn">Sampling parameters changed in this round: ${esc(paramsText(d.params))}</div>`);
  }
  const rows = [
    tipRow("token", `${pieceHtml(piece)} <span class="muted">id ${esc(r.tokens[i])} · #${esc(n)}</span>`),
    tipRow("origin", esc(origin)),
    tipRow("drafter", esc(r.drafter || "plain")),
    tipRow("draft", draftHtml(r)),
    tipRow("rejected at", r.rejection_position == null ? "none" : `position ${esc(r.rejection_position)}`),
  ];
  if (pos) rows.push(tipRow("gap", `${fmt(pos.gap, 3)} <span class="muted">top-2 logit gap</span>`));
  rows.push(
    tipRow("time", `draft ${fmt(r.draft_ms)} ms · verify ${fmt(r.verify_ms)} ms · batch ${esc(r.batch_size)}`),
    tipRow("decision", r.decision == null ? "—" : esc(r.decision)),
    tipRow("goodput", `expected ${perSecond(r.expected_goodput)} vs plain ${perSecond(r.plain_goodput)}`),
  );
  if (d && d.params && !d.params_changed) rows.push(tipRow("sampling", esc(paramsText(d.params))));
  out.push(`<table class="tip-table">${rows.join("")}</table>`);
  if (pos) {
    out.push(probabilitiesHtml(d, pos, piece));
    out.push(`<div class="tip-sub">top-5 of p</div>${topHtml(pos)}`);
  } else {
    out.push('<div class="muted">No per-token detail was recorded for this round.</div>');
  }
  return out.join("");
}

/* ---------- request lists ---------- */

const COLUMNS = {
  id: { title: "id", cell: (r) => `<a href="#request/${enc(r.id)}">${esc(r.id)}</a>` },
  label: { title: "label", cell: (r) => esc(r.label || "") },
  config: { title: "config", field: "config", cell: (r) => esc(r.config || "") },
  category: { title: "category", field: "category", cell: (r) => esc(r.category || "") },
  prompt_id: { title: "prompt", field: "prompt_id", cell: (r) => esc(r.prompt_id || "") },
  state: { title: "state", cell: (r) => `<span class="state state-${esc(r.state)}">${esc(r.state)}</span>` },
  rounds: { title: "rounds", num: true, cell: (r) => esc(r.rounds) },
  emitted: { title: "emitted", num: true, cell: (r) => esc(r.emitted) },
  acceptance: { title: "acceptance", num: true, cell: (r) => pct(r.acceptance_rate) },
  tau: { title: "τ", num: true, cell: (r) => fmt(r.mean_accepted_length) },
  tokens_per_s: { title: "tokens/s", num: true, cell: (r) => fmt(r.tokens_per_s, 1) },
  source: { title: "source", cell: (r) => esc(r.source || "") },
};
const LIVE_COLUMNS = ["id", "label", "state", "rounds", "emitted", "acceptance", "tau", "tokens_per_s", "source"];
const LIST_COLUMNS = ["id", "label", "config", "category", "prompt_id", "state", "rounds", "emitted",
  "acceptance", "tau", "tokens_per_s"];

/** The named columns, leaving out those with a `field` that no row fills. */
function columnsFor(names, rows) {
  return names.map((name) => COLUMNS[name]).filter((c) => !c.field || rows.some((r) => r[c.field] != null));
}

function tbodyHtml(rows, cols) {
  if (!rows.length) return `<tbody><tr class="empty"><td colspan="${cols.length}">No requests.</td></tr></tbody>`;
  const lines = rows.map((r) => `<tr data-id="${esc(r.id)}">`
    + cols.map((c) => `<td${c.num ? ' class="num"' : ""}>${c.cell(r)}</td>`).join("") + "</tr>");
  return `<tbody>${lines.join("")}</tbody>`;
}

function tableHtml(id, rows, cols) {
  const head = cols.map((c) => `<th${c.num ? ' class="num"' : ""}>${c.title}</th>`).join("");
  return `<table id="${id}" class="list-table"><thead><tr>${head}</tr></thead>${tbodyHtml(rows, cols)}</table>`;
}

function openRowOnClick(table) {
  table.addEventListener("click", (event) => {
    const row = event.target.closest("tr[data-id]");
    if (row && !event.target.closest("a")) location.hash = `#request/${enc(row.dataset.id)}`;
  });
}

/* ---------- #live ---------- */

function renderLive(view, where, signal) {
  const cols = LIVE_COLUMNS.map((name) => COLUMNS[name]);
  view.innerHTML = '<h1>Requests on this server</h1><p id="live-note" class="muted">Connecting…</p>'
    + tableHtml("live-table", [], cols);
  openRowOnClick($("#live-table", view));
  followLive(view, cols, signal);
}

function updateLive(view, rows, cols) {
  $("#live-table", view).tBodies[0].outerHTML = tbodyHtml(rows, cols);
  $("#live-note", view).textContent = `${plural(rows.length, "request")} · updated ${new Date().toLocaleTimeString()}`;
}

/** Follows /ui/api/live until the view is left, reconnecting after a pause when the stream drops. */
async function followLive(view, cols, signal) {
  while (!signal.aborted) {
    try {
      await readEvents("/ui/api/live", signal, (msg) => updateLive(view, msg.requests, cols));
    } catch (err) {
      if (signal.aborted) return;
      showError(err);
      if (err instanceof AuthNeeded) return;
    }
    await sleep(2000, signal);
  }
}

/* ---------- #requests ---------- */

function filtersHtml(params) {
  const chips = [...params].map(([k, v]) => `<span class="chip">${esc(k)} = ${esc(v)}</span>`);
  if (!chips.length) return "";
  return `<p class="filters">${chips.join("")} <a href="#requests">clear filters</a></p>`;
}

async function renderRequests(view, where, signal) {
  const params = new URLSearchParams();
  for (const key of ["config", "category", "prompt_id"]) {
    if (where.params.get(key)) params.set(key, where.params.get(key));
  }
  const head = `<h1>Requests</h1>${filtersHtml(params)}`;
  view.innerHTML = `${head}<p class="muted">Loading…</p>`;
  const query = params.toString();
  const { requests } = await getJSON(`/ui/api/requests${query ? `?${query}` : ""}`, { signal });
  view.innerHTML = head + tableHtml("requests-table", requests, columnsFor(LIST_COLUMNS, requests));
  openRowOnClick($("#requests-table", view));
}

/* ---------- #request/<id> ---------- */

function roundsPageHtml(rounds, page) {
  const pages = Math.ceil(rounds.length / ROUNDS_PER_PAGE);
  const slice = rounds.slice(page * ROUNDS_PER_PAGE, (page + 1) * ROUNDS_PER_PAGE);
  const pager = pages > 1 ? `<div class="pager">
      <button type="button" data-page="${page - 1}"${page === 0 ? " disabled" : ""}>‹ previous</button>
      page ${page + 1} of ${pages}
      <button type="button" data-page="${page + 1}"${page + 1 >= pages ? " disabled" : ""}>next ›</button></div>` : "";
  const head = ["round", "drafter", "proposed", "accepted", "rejected at", "bonus", "emitted", "draft ms",
    "verify ms", "overhead ms", "batch", "k max", "expected tok/s", "plain tok/s", "decision", "text"];
  const rows = slice.map((r) => `<tr data-round="${r.round}">`
    + [r.round, esc(r.drafter || "plain"), r.proposed, r.accepted, r.rejection_position ?? "—", r.bonus ? "yes" : "",
      r.emitted, fmt(r.draft_ms), fmt(r.verify_ms), fmt(r.overhead_ms), r.batch_size, r.k_max ?? "—",
      fmt(r.expected_goodput == null ? null : r.expected_goodput * 1000, 1),
      fmt(r.plain_goodput == null ? null : r.plain_goodput * 1000, 1), esc(r.decision || ""),
      r.pieces ? r.pieces.map(pieceHtml).join("") : esc(r.tokens.join(" "))]
      .map((v) => `<td>${v}</td>`).join("") + "</tr>");
  return `${pager}<div class="table-scroll"><table class="rounds-table">`
    + `<thead><tr>${head.map((h) => `<th>${h}</th>`).join("")}</tr></thead><tbody>${rows.join("")}</tbody></table></div>`;
}

/** The rounds table is drawn only when its <details> is opened, one page at a time. */
function setupRoundsTable(details, rounds, text, lookup) {
  const body = $(".rounds-body", details);
  let page = 0;
  const draw = () => { body.innerHTML = roundsPageHtml(rounds, page); };
  details.addEventListener("toggle", () => { if (details.open && !body.firstChild) draw(); });
  body.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-page]");
    if (button) {
      page = Number(button.dataset.page);
      draw();
      return;
    }
    const row = event.target.closest("tr[data-round]");
    const tok = row && $(`.tok[data-round="${row.dataset.round}"]`, text);
    if (!tok) return;
    tok.scrollIntoView({ block: "center", inline: "nearest" });
    showTip(tok, lookup);
    pinTip(tok);
  });
}

function requestHeadHtml(req) {
  const bits = [`<span class="state state-${esc(req.state)}">${esc(req.state)}</span>`];
  const lossy = (req.rounds || []).find((r) => r.acceptance);
  if (lossy) bits.push(`<span class="lossy">LOSSY: ${esc(lossy.acceptance)}, not the target's distribution</span>`);
  if (req.finish_reason) bits.push(`finish: ${esc(req.finish_reason)}`);
  bits.push(`id <code>${esc(req.id)}</code>`);
  return `<h1>${esc(req.label || req.id)}</h1><p class="req-meta">${bits.join(" · ")}</p>`;
}

async function renderRequest(view, where, signal) {
  if (!where.arg) throw new Error("No request id in the address.");
  view.innerHTML = '<p class="muted">Loading…</p>';
  const req = await getJSON(`/ui/api/requests/${enc(where.arg)}`, { signal });
  const rounds = req.rounds || [];
  const diverge = req.check && !req.check.match ? req.check.position : null;
  view.innerHTML = requestHeadHtml(req)
    + (req.prompt == null ? "" : `<details class="prompt"><summary>Prompt</summary><pre>${esc(req.prompt)}</pre></details>`)
    + `<div id="summary" class="figures">${figuresHtml(rounds, req.summary, req.check)}</div>`
    + `<div class="legend">${legendHtml(roundDrafters(rounds), diverge != null)}</div>`
    + `<div id="text" class="text">${requestTextHtml(req, diverge)}</div>`
    + (req.text == null ? "" : `<details class="final-box"><summary>Final text</summary><pre id="final-text" class="final-text">${esc(req.text)}</pre></details>`)
    + `<details id="rounds-details" class="rounds-details"><summary>Rounds (${rounds.length})</summary><div class="rounds-body"></div></details>`;
  const byRound = indexRounds(rounds);
  const lookup = (n) => byRound.get(n);
  const text = $("#text", view);
  attachTip(text, lookup);
  setupRoundsTable($("#rounds-details", view), rounds, text, lookup);
}

/* ---------- #run (live mode) ---------- */

const runEl = (selector) => run.el.querySelector(selector);

function kOptionsHtml() {
  const { info } = app;
  const values = [...(info.auto ? ["auto"] : []), ...K_CHOICES];
  if (info.default_k != null && !values.map(String).includes(String(info.default_k))) values.push(info.default_k);
  return values.map((v) => `<option value="${esc(v)}"${String(v) === String(info.default_k) ? " selected" : ""}>${esc(v)}</option>`).join("");
}

function drafterOptionsHtml() {
  return '<option value="">engine default</option>'
    + app.info.drafters.map((d) => `<option value="${esc(d)}">${esc(d)}</option>`).join("");
}

function buildRunView() {
  run.el = $("#run-template").content.firstElementChild.cloneNode(true);
  for (const id of ["#k", "#step-k"]) runEl(id).innerHTML = kOptionsHtml();
  for (const id of ["#drafter", "#step-drafter"]) runEl(id).innerHTML = drafterOptionsHtml();
  runEl(".legend").innerHTML = legendHtml(app.info.drafters);
  runEl("#run-form").addEventListener("submit", (event) => {
    event.preventDefault();
    guarded(startSession)();
  });
  runEl("#step").addEventListener("click", guarded(stepSession));
  runEl("#run-to-end").addEventListener("click", guarded(runToEnd));
  runEl("#cancel").addEventListener("click", guarded(cancelSession));
  attachTip(runEl("#text"), (n) => run.session && run.session.byRound.get(n));
}

/** The run view is built once and kept, so a session goes on while other views are shown. */
function renderRun(view) {
  if (!run.el) buildRunView();
  view.replaceChildren(run.el);
}

function guarded(action) {
  return () => action().catch(showError);
}

function readNumber(selector, label, integer = false) {
  const raw = runEl(selector).value.trim();
  const value = Number(raw);
  if (raw === "" || !Number.isFinite(value) || (integer && !Number.isInteger(value))) {
    throw new Error(`${label}: enter ${integer ? "a whole number" : "a number"}.`);
  }
  return value;
}

function parseK(value) {
  return value === "auto" ? "auto" : Number(value);
}

function readRunForm() {
  const prompt = runEl("#prompt").value;
  if (!prompt.trim()) throw new Error("Write a prompt first.");
  return {
    prompt,
    chat: runEl("#chat").checked,
    max_tokens: readNumber("#max-tokens", "max tokens", true),
    temperature: readNumber("#temperature", "temperature"),
    top_p: readNumber("#top-p", "top-p"),
    top_k: readNumber("#top-k", "top-k", true),
    min_p: readNumber("#min-p", "min-p"),
    seed: runEl("#seed").value.trim() === "" ? null : readNumber("#seed", "seed", true),
    k: parseK(runEl("#k").value),
    drafter: runEl("#drafter").value || null,
    acceptance: runEl("#acceptance").value,
    paused: runEl("#paused").checked,
  };
}

function readStepFields() {
  return {
    k: parseK(runEl("#step-k").value),
    drafter: runEl("#step-drafter").value || null,
    temperature: readNumber("#step-temperature", "step temperature"),
    top_p: readNumber("#step-top-p", "step top-p"),
  };
}

function fillStepFields(settings) {
  runEl("#step-k").value = String(settings.k);
  runEl("#step-drafter").value = settings.drafter || "";
  runEl("#step-temperature").value = String(settings.temperature);
  runEl("#step-top-p").value = String(settings.top_p);
}

function resetRunOutput() {
  runEl("#text").innerHTML = "";
  runEl("#final-text").textContent = "";
  runEl("#final-box").hidden = true;
  hideTip();
}

async function startSession() {
  const body = readRunForm();
  const start = runEl("#start");
  start.disabled = true;
  try {
    if (run.session && run.session.state === "active") {
      run.session.state = "cancelled";
      run.session.stream.abort(); // closing the stream cancels the session
      drawSession();
    }
    const { id } = await getJSON("/ui/api/sessions", { method: "POST", body });
    const settings = { k: body.k, drafter: body.drafter, temperature: body.temperature, top_p: body.top_p };
    run.session = {
      id, settings, rounds: [], byRound: new Map(), tokens: 0, summary: null, finish: null, message: null,
      paused: body.paused, stepping: false, state: "active", stream: new AbortController(),
    };
    resetRunOutput();
    fillStepFields(settings);
    drawSession();
    followSession(run.session);
  } finally {
    start.disabled = false;
  }
}

async function followSession(s) {
  try {
    await readEvents(`/ui/api/sessions/${enc(s.id)}/events`, s.stream.signal, (event) => onSessionEvent(s, event));
    if (s.state === "active") endSession(s, "error", "The event stream ended before the request finished.");
  } catch (err) {
    if (!s.stream.signal.aborted) endSession(s, "error", err.message);
  }
}

function endSession(s, state, message) {
  s.state = state;
  s.message = message;
  if (message) showError(message);
  if (s === run.session) drawSession();
}

function onSessionEvent(s, event) {
  if (s !== run.session) return;
  if (event.type === "round") {
    addRound(s, event.round);
  } else if (event.type === "done") {
    s.state = "done";
    s.finish = event.finish_reason;
    s.summary = event.summary || null;
    runEl("#final-text").textContent = event.text;
    runEl("#final-box").hidden = false;
  } else if (event.type === "error") {
    endSession(s, "error", event.message);
    return;
  }
  drawSession();
}

function addRound(s, round) {
  s.rounds.push(round);
  s.byRound.set(round.round, round);
  runEl("#text").insertAdjacentHTML("beforeend", roundHtml(round, s.tokens));
  s.tokens += round.tokens.length;
  s.stepping = false;
}

function statusText(s) {
  const n = plural(s.rounds.length, "round");
  if (s.state === "done") return `done (${s.finish}) — ${n}`;
  if (s.state === "cancelled") return `cancelled — ${n}`;
  if (s.state === "error") return `error: ${s.message}`;
  if (s.stepping) return `stepping — ${n}`;
  return s.paused ? `paused — ${n}` : `running — ${n}`;
}

function drawSession() {
  const s = run.session;
  const active = s.state === "active";
  runEl("#status").textContent = statusText(s);
  runEl("#status").dataset.state = s.state;
  runEl("#step-controls").hidden = !active;
  runEl("#step").disabled = !active || !s.paused || s.stepping;
  runEl("#run-to-end").disabled = !active || !s.paused;
  runEl("#cancel").disabled = !active;
  runEl("#summary").innerHTML = figuresHtml(s.rounds, s.summary);
}

/** Sends the step settings that differ from the previous step's (k and drafter included). */
async function stepSession() {
  const s = run.session;
  if (!s || s.state !== "active" || !s.paused || s.stepping) return;
  const now = readStepFields();
  const body = {};
  for (const key of Object.keys(now)) if (now[key] !== s.settings[key]) body[key] = now[key];
  s.stepping = true;
  drawSession();
  try {
    await getJSON(`/ui/api/sessions/${enc(s.id)}/step`, { method: "POST", body });
    s.settings = now;
  } catch (err) {
    s.stepping = false;
    drawSession();
    throw err;
  }
}

async function runToEnd() {
  const s = run.session;
  if (!s || s.state !== "active") return;
  await getJSON(`/ui/api/sessions/${enc(s.id)}/run`, { method: "POST" });
  s.paused = false;
  s.stepping = false;
  drawSession();
}

async function cancelSession() {
  const s = run.session;
  if (!s || s.state !== "active") return;
  await getJSON(`/ui/api/sessions/${enc(s.id)}`, { method: "DELETE" });
  if (s.state !== "active") return;
  s.state = "cancelled";
  s.stream.abort();
  drawSession();
}

/* ---------- #bench ---------- */

const BENCH_COLUMNS = [
  ["speedup (median, 95% CI)", (f) => (f.speedup_median == null ? "—" : `${fmt(f.speedup_median)}×`
    + (f.speedup_ci95 ? ` <span class="muted">[${fmt(f.speedup_ci95[0])}, ${fmt(f.speedup_ci95[1])}]</span>` : ""))],
  ["acceptance", (f) => pct(f.acceptance_rate)],
  ["τ", (f) => fmt(f.mean_accepted_length)],
  ["continuation tok/s", (f) => fmt(f.continuation_tokens_per_s, 1)],
  ["TTFT ms", (f) => fmt(f.ttft_ms, 0)],
  ["greedy match", (f) => pct(f.greedy_match_rate)],
  ["requests", (f) => (f.requests == null ? "—" : esc(f.requests))],
];

function benchLink(config, category) {
  const query = `config=${enc(config)}`;
  return category === "all" ? `#requests?${query}` : `#requests?${query}&category=${enc(category)}`;
}

function splitConfig(config) {
  const cut = config.lastIndexOf(" | ");
  return cut < 0 ? [config, ""] : [config.slice(0, cut), config.slice(cut + 3)];
}

/**
 * category -> sampling -> spec -> {config, f}: the figures given, plus every config given in
 * every category (with no figures) so that each config can be opened even when the summary has
 * no figures for it.
 */
function benchGrid(figures, configs, categoryList) {
  const grid = new Map();
  const put = (category, sampling, spec, config, f) => {
    if (!grid.has(category)) grid.set(category, new Map());
    const bySampling = grid.get(category);
    if (!bySampling.has(sampling)) bySampling.set(sampling, new Map());
    const bySpec = bySampling.get(sampling);
    if (!bySpec.has(spec)) bySpec.set(spec, { config, f });
  };
  for (const [category, bySampling] of Object.entries(figures || {})) {
    for (const [sampling, bySpec] of Object.entries(bySampling)) {
      for (const [spec, f] of Object.entries(bySpec)) put(category, sampling, spec, `${spec} | ${sampling}`, f);
    }
  }
  const categories = categoryList && categoryList.length ? categoryList : ["all"];
  for (const config of configs) {
    const [spec, sampling] = splitConfig(config);
    for (const category of categories) put(category, sampling, spec, config, {});
  }
  return grid;
}

function benchTableHtml(category, sampling, specs) {
  const head = ["spec", ...BENCH_COLUMNS.map(([title]) => title)]
    .map((t, j) => `<th${j ? ' class="num"' : ""}>${t}</th>`).join("");
  const rows = [...specs].map(([spec, { config, f }]) => {
    const href = esc(benchLink(config, category));
    const cells = [esc(spec), ...BENCH_COLUMNS.map(([, cell]) => cell(f))]
      .map((v, j) => `<td${j ? ' class="num"' : ""}><a href="${href}">${v}</a></td>`).join("");
    return `<tr data-config="${esc(config)}">${cells}</tr>`;
  });
  const title = sampling ? `${category} · ${sampling}` : category;
  return `<h2>${esc(title)}</h2><table class="bench-table" data-category="${esc(category)}"`
    + ` data-sampling="${esc(sampling)}"><thead><tr>${head}</tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

/** The exact configurations' tables, then, apart, those of lossy acceptance rules. */
function benchTablesHtml(bench) {
  const isLossy = (config) => config.includes(" (lossy: ");
  const configs = bench.configs || [];
  const tablesOf = (grid) => {
    const tables = [];
    for (const [category, bySampling] of grid) {
      for (const [sampling, specs] of bySampling) tables.push(benchTableHtml(category, sampling, specs));
    }
    return tables.join("");
  };
  const exact = tablesOf(benchGrid(bench.figures, configs.filter((c) => !isLossy(c)), bench.categories));
  const lossyConfigs = configs.filter(isLossy);
  if (!lossyConfigs.length) return exact;
  return exact + '<h2 class="lossy-head"><span class="lossy">Lossy acceptance rules: NOT the target\'s distribution</span></h2>'
    + tablesOf(benchGrid(bench.lossy, lossyConfigs, bench.categories));
}

const PICKER_HTML = `<section id="compare-picker" class="compare-picker">
  <h2>Compare two configs on one prompt</h2>
  <label>prompt <select id="pick-prompt"><option value="">loading…</option></select></label>
  <label>A <select id="pick-a"></select></label>
  <label>B <select id="pick-b"></select></label>
  <button id="pick-go" type="button" disabled>Compare</button>
</section>`;

async function renderBench(view, where, signal) {
  view.innerHTML = '<p class="muted">Loading…</p>';
  const bench = await getJSON("/ui/api/bench", { signal });
  const plots = bench.plots || [];
  view.innerHTML = "<h1>Bench</h1>"
    + (bench.run ? `<details class="run-info"><summary>Run</summary><pre>${esc(JSON.stringify(bench.run, null, 2))}</pre></details>` : "")
    + benchTablesHtml(bench) + PICKER_HTML
    + `<div class="plots">${plots.map((name) => `<figure><img alt="${esc(name)}" data-plot="${esc(name)}"><figcaption>${esc(name)}</figcaption></figure>`).join("")}</div>`;
  loadPlots(view, signal);
  await setupPicker(view, signal);
}

/** <img> cannot send the key, so each plot is fetched with it and shown from a blob URL. */
function loadPlots(view, signal) {
  for (const img of view.querySelectorAll("img[data-plot]")) {
    request(`/ui/api/bench/plots/${enc(img.dataset.plot)}`, { signal })
      .then((res) => res.blob())
      .then((blob) => {
        const url = URL.createObjectURL(blob);
        signal.addEventListener("abort", () => URL.revokeObjectURL(url), { once: true });
        img.src = url;
      })
      .catch((err) => { if (!signal.aborted) showError(err); });
  }
}

async function setupPicker(view, signal) {
  const prompt = $("#pick-prompt", view);
  const { requests } = await getJSON("/ui/api/requests", { signal });
  const ids = [...new Set(requests.map((r) => r.prompt_id).filter((p) => p != null))].sort();
  prompt.innerHTML = '<option value="">choose a prompt…</option>'
    + ids.map((p) => `<option value="${esc(p)}">${esc(p)}</option>`).join("");
  prompt.addEventListener("change", () => fillPickerRuns(view, prompt.value, signal).catch(showError));
  $("#pick-go", view).addEventListener("click", () => {
    location.hash = `#compare?a=${enc($("#pick-a", view).value)}&b=${enc($("#pick-b", view).value)}`;
  });
}

async function fillPickerRuns(view, promptId, signal) {
  const [a, b, go] = [$("#pick-a", view), $("#pick-b", view), $("#pick-go", view)];
  a.innerHTML = b.innerHTML = "";
  go.disabled = true;
  if (!promptId) return;
  const { requests } = await getJSON(`/ui/api/requests?prompt_id=${enc(promptId)}`, { signal });
  const repeated = new Set(requests.map((r) => r.config).filter((c, j, all) => all.indexOf(c) !== j));
  const options = requests.map((r) => {
    const name = r.config || r.id;
    return `<option value="${esc(r.id)}">${esc(repeated.has(r.config) ? `${name} · ${r.id}` : name)}</option>`;
  }).join("");
  a.innerHTML = b.innerHTML = options;
  const other = requests.findIndex((r) => r.config !== (requests[0] && requests[0].config));
  b.selectedIndex = other > 0 ? other : Math.min(1, requests.length - 1);
  go.disabled = requests.length < 2;
}

/* ---------- #compare ---------- */

function divergenceText(d) {
  if (!d || d.position == null) return "identical";
  const nearTie = d.near_tie == null ? "unknown" : d.near_tie ? "yes" : "no";
  return `differ from token ${d.position}; top-2 gap ${fmt(d.gap, 3)} (near-tie: ${nearTie})`;
}

function compareColumnHtml(side, req, position) {
  const rounds = req.rounds || [];
  return `<div class="compare-col" data-side="${side}">
    <h2>${side.toUpperCase()} · <a href="#request/${enc(req.id)}">${esc(req.label || req.id)}</a></h2>
    <div class="figures">${figuresHtml(rounds, req.summary, req.check)}</div>
    <div class="text compare-text">${requestTextHtml(req, position)}</div></div>`;
}

/** Hovering token #n in one column outlines token #n in the other. */
function linkPeers(grid) {
  let peers = [];
  grid.addEventListener("mouseover", (event) => {
    const tok = event.target.closest(".tok");
    for (const el of peers) el.classList.remove("tok-peer");
    peers = tok ? [...grid.querySelectorAll(`.tok[data-n="${tok.dataset.n}"]`)].filter((el) => el !== tok) : [];
    for (const el of peers) el.classList.add("tok-peer");
  });
}

async function renderCompare(view, where, signal) {
  const a = where.params.get("a");
  const b = where.params.get("b");
  if (!a || !b) {
    view.innerHTML = '<h1>Compare</h1><p class="muted">Pick two requests to compare (in the Bench view), or open #compare?a=ID&amp;b=ID.</p>';
    return;
  }
  view.innerHTML = '<p class="muted">Loading…</p>';
  const cmp = await getJSON(`/ui/api/compare?a=${enc(a)}&b=${enc(b)}`, { signal });
  const position = cmp.divergence ? cmp.divergence.position : null;
  const drafters = roundDrafters([...(cmp.a.rounds || []), ...(cmp.b.rounds || [])]);
  view.innerHTML = `<h1>Compare</h1><p id="compare-header" class="compare-header${position == null ? "" : " differs"}">`
    + `${esc(divergenceText(cmp.divergence))}</p><div class="legend">${legendHtml(drafters, true)}</div>`
    + `<div class="compare-grid">${compareColumnHtml("a", cmp.a, position)}${compareColumnHtml("b", cmp.b, position)}</div>`;
  for (const [side, req] of [["a", cmp.a], ["b", cmp.b]]) {
    const byRound = indexRounds(req.rounds || []);
    attachTip($(`.compare-col[data-side="${side}"] .compare-text`, view), (n) => byRound.get(n));
  }
  linkPeers($(".compare-grid", view));
}

/* ---------- start ---------- */

async function boot() {
  try {
    app.info = await getJSON("/ui/api/info");
  } catch (err) {
    showError(err);
    return;
  }
  renderHeader();
  route();
}

function init() {
  $("#error").addEventListener("click", clearError);
  $("#key-form").addEventListener("submit", onKeySubmit);
  window.addEventListener("hashchange", route);
  document.addEventListener("click", onDocumentClick);
  document.addEventListener("keydown", (event) => { if (event.key === "Escape") hideTip(); });
  window.addEventListener("scroll", onScroll, { capture: true, passive: true });
  window.addEventListener("resize", hideTip);
  boot();
}

init();
