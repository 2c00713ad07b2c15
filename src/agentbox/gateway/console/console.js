// The agentbox web console: a vanilla ES module over the gateway's /v1 API.
//
// Two rules hold everywhere below:
// - The operator token lives in the `token` variable only: never in localStorage,
//   sessionStorage, a cookie or a URL. Every call sends it as `Authorization: Bearer`.
// - Server data (audit records, command summaries, ids) is attacker-influenced: it goes
//   into the page with `textContent` only, never as markup.

const POLL_MS = {
  sandboxes: 3000, approvals: 2000, audit: 1500, usage: 10000, providers: 10000,
};
const EVENTS_RETRY_MS = 3000;
const AUDIT_FIRST_LOAD = 50;
const AUDIT_MAX_ROWS = 200;
const DETAIL_MAX_CHARS = 400;

let token = null;
// Bumped at each login and logout: loops and streams of an older session stop.
let generation = 0;
const timers = new Set();
let eventsAbort = null;
let auditSeq = null;
const pokes = new Map();

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function $(id) {
  return document.getElementById(id);
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function announce(message) {
  $("announce").textContent = message;
}

function authHeaders() {
  return { Authorization: `Bearer ${token}` };
}

async function api(method, path, body) {
  if (token === null) throw new ApiError(0, "unauthenticated", "not logged in");
  const mine = generation;
  const init = {
    method,
    headers: authHeaders(),
    cache: "no-store",
    credentials: "omit",
    redirect: "error",
  };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, "unreachable", `the gateway did not answer (${e.message})`);
  }
  const text = await response.text();
  // An answer to a session that has since logged out must not reach the page.
  if (mine !== generation) throw new ApiError(0, "stale", "the session ended");
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = data && typeof data === "object" ? data.error : null;
    throw new ApiError(
      response.status,
      (error && error.code) || `http_${response.status}`,
      (error && error.message) || `HTTP ${response.status}`,
    );
  }
  return data;
}

// ---- formatting ------------------------------------------------------------------------

function ago(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

function bytes(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) return value ? String(value) : "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let n = value;
  let unit = 0;
  while (n >= 1024 && unit < units.length - 1) {
    n /= 1024;
    unit += 1;
  }
  return `${Number.isInteger(n) ? n : n.toFixed(1)} ${units[unit]}`;
}

function plain(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function clip(text) {
  return text.length > DETAIL_MAX_CHARS ? `${text.slice(0, DETAIL_MAX_CHARS)}…` : text;
}

function stateClass(state) {
  return `state state-${String(state).replace(/[^a-z_]/g, "")}`;
}

// ---- keyed tables: rows are updated in place, so focus survives a refresh ---------------

const rowMaps = new WeakMap();

function syncRows(tbody, items, key, build, update, emptyText) {
  let rows = rowMaps.get(tbody);
  if (!rows) {
    rows = new Map();
    rowMaps.set(tbody, rows);
  }
  const seen = new Set();
  let previous = null;
  for (const item of items) {
    const id = key(item);
    seen.add(id);
    let row = rows.get(id);
    if (!row) {
      row = build(item);
      rows.set(id, row);
    }
    update(row, item);
    const expected = previous ? previous.nextSibling : tbody.firstChild;
    if (row !== expected) tbody.insertBefore(row, expected);
    previous = row;
  }
  for (const [id, row] of rows) {
    if (!seen.has(id)) {
      row.remove();
      rows.delete(id);
    }
  }
  let empty = tbody.querySelector("tr.empty");
  if (items.length === 0 && !empty) {
    empty = el("tr", null, "empty");
    const cell = el("td", emptyText);
    cell.colSpan = tbody.closest("table").tHead.rows[0].cells.length;
    empty.append(cell);
    tbody.append(empty);
  } else if (items.length > 0 && empty) {
    empty.remove();
  }
}

function clearTable(tbody) {
  tbody.replaceChildren();
  rowMaps.delete(tbody);
}

// After an action, put focus back somewhere sensible if its button went away.
function keepFocus(row, fallback) {
  const active = document.activeElement;
  if (active && active !== document.body && document.contains(active) && !active.disabled) {
    return;
  }
  const next = row && document.contains(row) ? row.querySelector("button:not(:disabled)") : null;
  (next || fallback).focus();
}

// ---- sandboxes -------------------------------------------------------------------------

const ACTIONS = [
  { name: "pause", label: "Pause", when: ["running"], done: "paused" },
  { name: "resume", label: "Resume", when: ["paused", "stopped"], done: "resumed" },
  { name: "stop", label: "Stop", when: ["running", "paused"], done: "stopped" },
  { name: "destroy", label: "Destroy", when: null, done: "destroyed" },
];
const busy = new Set();

function buildSandboxRow(sandbox) {
  const row = el("tr");
  row.dataset.id = sandbox.id;
  const head = el("th", sandbox.id, "mono");
  head.scope = "row";
  row.append(head);
  const state = el("td");
  state.append(el("span"));
  row.append(state, el("td"), el("td"), el("td"), el("td"), el("td"));
  const actions = el("td", null, "actions");
  for (const action of ACTIONS) {
    const button = el("button", action.label, action.name === "destroy" ? "danger" : "");
    button.type = "button";
    button.dataset.action = action.name;
    button.setAttribute("aria-label", `${action.label} sandbox ${sandbox.id}`);
    button.addEventListener("click", () => sandboxAction(sandbox.id, action, row));
    actions.append(button);
  }
  row.append(actions);
  return row;
}

function updateSandboxRow(row, sandbox) {
  const now = Date.now() / 1000;
  const cells = row.cells;
  const badge = cells[1].firstChild;
  badge.textContent = plain(sandbox.state);
  badge.className = stateClass(sandbox.state);
  cells[2].textContent = plain(sandbox.template);
  cells[3].textContent = plain(sandbox.project);
  cells[4].textContent = typeof sandbox.created_at === "number" ? ago(now - sandbox.created_at) : "—";
  cells[5].textContent = bytes(sandbox.memory);
  const usage = sandbox.usage;
  cells[6].textContent = usage
    ? `${bytes(usage.memory_bytes)} memory, ${Number(usage.cpu_seconds).toFixed(1)} s CPU`
    : "—";
  for (const button of cells[7].querySelectorAll("button")) {
    const action = ACTIONS.find((a) => a.name === button.dataset.action);
    const allowed = action.when === null || action.when.includes(sandbox.state);
    button.disabled = busy.has(sandbox.id) || !allowed;
  }
}

// A list endpoint's records ordered by created_at, newest or oldest first.
async function listByAge(path, newestFirst) {
  const list = await api("GET", path);
  const items = Array.isArray(list) ? list : [];
  const sign = newestFirst ? -1 : 1;
  return items.sort((a, b) => sign * ((a.created_at || 0) - (b.created_at || 0)));
}

async function refreshSandboxes() {
  const sandboxes = await listByAge("/v1/sandboxes", true);
  syncRows($("sandboxes-rows"), sandboxes, (s) => s.id, buildSandboxRow, updateSandboxRow,
    "No sandboxes.");
  const counts = {};
  for (const s of sandboxes) counts[s.state] = (counts[s.state] || 0) + 1;
  const summary = Object.entries(counts).map(([state, n]) => `${n} ${state}`).join(", ");
  const count = sandboxes.length === 1 ? "1 sandbox" : `${sandboxes.length} sandboxes`;
  $("sandboxes-status").textContent = sandboxes.length ? `${count}: ${summary}.` : "No sandboxes.";
}

async function sandboxAction(id, action, row) {
  if (action.name === "destroy" && !(await confirmDestroy(id))) return;
  busy.add(id);
  for (const button of row.querySelectorAll("button")) button.disabled = true;
  try {
    if (action.name === "destroy") {
      await api("DELETE", `/v1/sandboxes/${encodeURIComponent(id)}`);
    } else {
      await api("POST", `/v1/sandboxes/${encodeURIComponent(id)}/${action.name}`);
    }
    announce(`Sandbox ${id} ${action.done}.`);
  } catch (e) {
    if (!handleAuthError(e)) {
      $("sandboxes-status").textContent = `Could not ${action.name} ${id}: ${e.message}`;
      announce(`Could not ${action.name} sandbox ${id}.`);
    }
  } finally {
    busy.delete(id);
  }
  await poke("sandboxes");
  keepFocus(row, $("sandboxes-title"));
}

function confirmDestroy(id) {
  const dialog = $("confirm-dialog");
  $("confirm-text").textContent =
    `Destroy sandbox ${id}? Its processes end and its files are removed; this cannot be undone.`;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "confirm"), {
      once: true,
    });
    dialog.returnValue = "";
    dialog.showModal();
    $("confirm-cancel").focus(); // the safe choice is the default one
  });
}

// ---- approvals -------------------------------------------------------------------------

function buildApprovalRow(approval) {
  const row = el("tr");
  row.dataset.id = approval.id;
  const head = el("th", null, "mono command");
  head.scope = "row";
  row.append(head, el("td", null, "mono"), el("td"), el("td"), el("td"), el("td"));
  const actions = el("td", null, "actions");
  // A new egress name (network mode ask) is approved for the held connections only, for
  // the sandbox's life, or always (the project's allowlist); a command only once.
  const choices = approval.tool === "egress"
    ? [["approve", "once", "Approve once"], ["approve", "sandbox", "Approve for this sandbox"],
       ["approve", "always", "Approve always"], ["deny", "once", "Deny"]]
    : [["approve", "once", "Approve"], ["deny", "once", "Deny"]];
  for (const [verdict, scope, label] of choices) {
    const button = el("button", label, verdict === "deny" ? "danger" : "primary");
    button.type = "button";
    button.dataset.verdict = verdict;
    button.setAttribute("aria-label", `${label}: approval ${approval.id}`);
    button.addEventListener("click", () => decide(approval.id, verdict, row, scope));
    actions.append(button);
  }
  row.append(actions);
  return row;
}

function updateApprovalRow(row, approval) {
  const cells = row.cells;
  cells[0].textContent = plain(approval.summary);
  cells[1].textContent = plain(approval.sandbox);
  cells[2].textContent = plain(approval.tool);
  cells[3].textContent = plain(approval.rule);
  cells[4].textContent = plain(approval.requested_by);
  cells[5].textContent =
    typeof approval.deadline === "number" ? ago(approval.deadline - Date.now() / 1000) : "—";
}

async function refreshApprovals() {
  const pending = await listByAge("/v1/approvals?status=pending", false);
  syncRows($("approvals-rows"), pending, (a) => a.id, buildApprovalRow, updateApprovalRow,
    "Nothing waits for a decision.");
  // Commands and new egress names (network mode ask) wait in the one queue.
  const text = pending.length === 1 ? "1 request waits for a decision." :
    `${pending.length} requests wait for a decision.`;
  // Assigned only when it changes: a live region re-reads every assignment.
  if ($("approvals-status").textContent !== text) $("approvals-status").textContent = text;
  const badge = $("approvals-badge");
  badge.textContent = String(pending.length);
  badge.hidden = pending.length === 0;
}

async function decide(id, verdict, row, scope) {
  for (const button of row.querySelectorAll("button")) button.disabled = true;
  try {
    await api("POST", `/v1/approvals/${encodeURIComponent(id)}/${verdict}?scope=${scope}`);
    announce(`${verdict === "approve" ? "Approved" : "Denied"} ${id}.`);
  } catch (e) {
    if (!handleAuthError(e)) {
      announce(`Could not ${verdict} ${id}: ${e.message}`);
      for (const button of row.querySelectorAll("button")) button.disabled = false;
    }
  }
  await poke("approvals");
  keepFocus(null, $("approvals-title"));
}

// ---- audit tail ------------------------------------------------------------------------

const AUDIT_SHOWN = new Set(["v", "seq", "ts", "prev", "hash", "decision", "actor", "sandbox",
  "tool", "session", "args_hash", "error"]);

function auditDetails(record) {
  const parts = [];
  if (record.error) parts.push(String(record.error));
  for (const [key, value] of Object.entries(record)) {
    if (AUDIT_SHOWN.has(key) || value === null || value === undefined) continue;
    parts.push(`${key}=${plain(value)}`);
  }
  return clip(parts.join(" · "));
}

function auditRow(record) {
  const row = el("tr");
  const seq = el("th", plain(record.seq), "num");
  seq.scope = "row";
  const time = el("time", record.ts ? new Date(record.ts).toLocaleTimeString() : "—");
  if (record.ts) time.dateTime = String(record.ts);
  const when = el("td");
  when.append(time);
  const decision = el("td");
  decision.append(el("span", plain(record.decision), stateClass(record.decision)));
  row.append(seq, when, decision, el("td", plain(record.actor)),
    el("td", plain(record.sandbox), "mono"), el("td", plain(record.tool)),
    el("td", auditDetails(record), "details"));
  return row;
}

async function refreshAudit() {
  if (!$("audit-follow").checked && auditSeq !== null) return;
  const query = auditSeq === null ? `limit=${AUDIT_FIRST_LOAD}` :
    `since_seq=${auditSeq}&limit=${AUDIT_MAX_ROWS}`;
  const records = await api("GET", `/v1/audit?${query}`);
  if (!Array.isArray(records)) return;
  const tbody = $("audit-rows");
  tbody.querySelector("tr.empty")?.remove();
  for (const record of records) {  // oldest first: each goes on top of the previous
    tbody.prepend(auditRow(record));
    if (typeof record.seq === "number") auditSeq = Math.max(auditSeq ?? 0, record.seq);
  }
  while (tbody.rows.length > AUDIT_MAX_ROWS) tbody.lastChild.remove();
  if (tbody.rows.length === 0) {
    const empty = el("tr", null, "empty");
    const cell = el("td", "No audit records yet.");
    cell.colSpan = 7;
    empty.append(cell);
    tbody.append(empty);
  }
  if (records.length || auditSeq === null) {
    $("audit-status").textContent = auditSeq === null ? "No audit records yet." :
      `Showing the latest ${tbody.rows.length} records; newest is #${auditSeq}.`;
  }
  if (auditSeq === null) auditSeq = 0;
}

// ---- usage and providers (served once the provider pool is configured) ------------------

function dataTable(items) {
  const columns = [];
  for (const item of items) {
    for (const key of Object.keys(item)) if (!columns.includes(key)) columns.push(key);
  }
  const table = el("table");
  const head = el("tr");
  for (const column of columns) {
    const th = el("th", column.replace(/_/g, " "));
    th.scope = "col";
    head.append(th);
  }
  table.createTHead().append(head);
  const body = table.createTBody();
  for (const item of items) {
    const row = el("tr");
    columns.forEach((column, i) => {
      const cell = el(i === 0 ? "th" : "td", plain(item[column]));
      if (i === 0) cell.scope = "row";
      row.append(cell);
    });
    body.append(row);
  }
  const wrap = el("div", null, "table-wrap");
  wrap.append(table);
  return wrap;
}

function isRecordList(value) {
  return Array.isArray(value) && value.length > 0 &&
    value.every((v) => v && typeof v === "object" && !Array.isArray(v));
}

// Whatever shape the endpoint answers with: lists of records become tables, the rest a
// list of name/value pairs.
function renderData(container, data) {
  const parts = [];
  if (isRecordList(data)) {
    parts.push(dataTable(data));
  } else if (data && typeof data === "object" && !Array.isArray(data)) {
    const pairs = el("dl", null, "pairs");
    for (const [key, value] of Object.entries(data)) {
      if (isRecordList(value)) {
        parts.push(el("h3", key.replace(/_/g, " ")), dataTable(value));
      } else {
        pairs.append(el("dt", key.replace(/_/g, " ")), el("dd", plain(value)));
      }
    }
    if (pairs.childElementCount) parts.unshift(pairs);
  } else if (Array.isArray(data) && data.length === 0) {
    parts.push(el("p", "Nothing to show yet."));
  } else {
    parts.push(el("p", plain(data)));
  }
  container.replaceChildren(...parts);
}

async function refreshOptional(name, path, what, empty) {
  const status = $(`${name}-status`);
  const body = $(`${name}-body`);
  let data;
  try {
    data = await api("GET", path);
  } catch (e) {
    if (e.status === 404 || e.status === 405 || e.status === 501) {
      body.replaceChildren();
      status.textContent = `Not configured: this gateway does not report ${what} (${path}).`;
      return;
    }
    throw e;
  }
  if (Array.isArray(data) && data.length === 0) {
    body.replaceChildren();
    status.textContent = empty;
    return;
  }
  status.textContent = "";
  renderData(body, data);
}

// ---- polling, the lifecycle stream, errors -------------------------------------------------

const SECTIONS = {
  sandboxes: refreshSandboxes,
  approvals: refreshApprovals,
  audit: refreshAudit,
  usage: () => refreshOptional("usage", "/v1/usage", "usage and budgets",
    "No model usage today (UTC) and no budgets configured."),
  providers: () => refreshOptional("providers", "/v1/providers", "provider health",
    "No model providers configured (the providers section of the gateway config)."),
};

function handleAuthError(e) {
  if (e instanceof ApiError && e.code === "stale") return true; // nothing left to update
  if (e instanceof ApiError && e.status === 401) {
    logout(`The gateway no longer accepts the token (${e.message}). Log in again.`);
    return true;
  }
  return false;
}

async function runSection(name) {
  try {
    await SECTIONS[name]();
  } catch (e) {
    if (!handleAuthError(e)) $(`${name}-status`).textContent = `Could not load: ${e.message}`;
  }
}

// Each section polls on its own, one request at a time; a poke (after an action, or a
// lifecycle event) runs it now, or again right after the run under way.
function poll(name) {
  const mine = generation;
  let timer = null;
  let running = null;
  const run = () => {
    if (mine !== generation) return Promise.resolve();
    if (running) return running.then(run);
    clearTimeout(timer);
    timers.delete(timer);
    running = runSection(name).then(() => {
      running = null;
      if (mine !== generation) return;
      timer = setTimeout(run, POLL_MS[name]);
      timers.add(timer);
    });
    return running;
  };
  pokes.set(name, run);
  run();
}

async function poke(name) {
  const run = pokes.get(name);
  if (run) await run();
}

function delay(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}

// Lifecycle events (SSE) read with fetch, since EventSource cannot send a bearer header:
// any event refreshes the sandbox table at once instead of at the next poll.
async function followLifecycle() {
  const mine = generation;
  const controller = new AbortController();
  eventsAbort = controller;
  while (mine === generation && !controller.signal.aborted) {
    try {
      const response = await fetch("/v1/events", {
        headers: authHeaders(),
        cache: "no-store",
        credentials: "omit",
        signal: controller.signal,
      });
      if (response.status === 401) {
        handleAuthError(new ApiError(401, "unauthenticated", "the token was refused"));
        return;
      }
      if (!response.ok || !response.body) return; // the polls alone keep the table fresh
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          if (/^event: lifecycle$/m.test(block)) poke("sandboxes");
        }
      }
    } catch (e) {
      if (controller.signal.aborted) return;
    }
    await delay(EVENTS_RETRY_MS, controller.signal);
  }
}

// ---- login and logout --------------------------------------------------------------------

function loginError(e) {
  if (e.status === 401) {
    return "The gateway rejected that token (unknown, revoked or expired). Check that you " +
      "pasted the whole operator token and try again.";
  }
  if (e.status === 403) {
    return "That token is not the operator token (a sandbox session token cannot use the console).";
  }
  return `Could not log in: ${e.message}`;
}

async function login(event) {
  event.preventDefault();
  const input = $("token");
  const candidate = input.value.trim();
  input.value = "";
  const error = $("login-error");
  error.hidden = true;
  error.textContent = "";
  if (!candidate) {
    error.textContent = "Paste the operator token first.";
    error.hidden = false;
    input.focus();
    return;
  }
  token = candidate;
  try {
    await api("GET", "/v1/approvals?status=pending"); // an operator-only route
  } catch (e) {
    token = null;
    error.textContent = loginError(e);
    error.hidden = false;
    input.focus();
    return;
  }
  generation += 1;
  auditSeq = null;
  $("login").hidden = true;
  $("console").hidden = false;
  $("nav").hidden = false;
  $("logout").hidden = false;
  for (const name of Object.keys(SECTIONS)) poll(name);
  followLifecycle();
  announce("Logged in.");
  $("sandboxes-title").focus();
}

function logout(reason) {
  token = null;
  generation += 1;
  for (const timer of timers) clearTimeout(timer);
  timers.clear();
  pokes.clear();
  eventsAbort?.abort();
  eventsAbort = null;
  auditSeq = null;
  busy.clear();
  for (const id of ["sandboxes-rows", "approvals-rows", "audit-rows"]) clearTable($(id));
  for (const id of ["usage-body", "providers-body"]) $(id).replaceChildren();
  for (const name of Object.keys(SECTIONS)) $(`${name}-status`).textContent = "";
  $("approvals-badge").hidden = true;
  const dialog = $("confirm-dialog");
  if (dialog.open) dialog.close("cancel");
  $("console").hidden = true;
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  const error = $("login-error");
  error.textContent = reason || "";
  error.hidden = !reason;
  announce(reason || "Logged out; the token is forgotten.");
  $("token").focus();
}

function start() {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", () => logout());
  $("confirm-ok").addEventListener("click", () => $("confirm-dialog").close("confirm"));
  $("confirm-cancel").addEventListener("click", () => $("confirm-dialog").close("cancel"));
  $("audit-follow").addEventListener("change", () => {
    if ($("audit-follow").checked) poke("audit");
  });
  $("token").focus();
}

start();
