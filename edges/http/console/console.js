// The live console: plain DOM over the gateway's REST routes and one SSE stream.
// No build step, no framework: what the page shows is what /api/ answers.
"use strict";

const FEED_LIMIT = 200; // rows kept in each live list
const POLL_MS = 2000; // endpoints and dead letters are polled; messages and signals stream

const $ = (selector) => document.querySelector(selector);

function token() {
  return localStorage.getItem("relay-token") || "";
}

function notice(text, isError = false) {
  const el = $("#notice");
  el.textContent = text;
  el.className = isError ? "error" : "";
}

// Every REST call: JSON in and out; a Relay error becomes an Error with its code.
async function api(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = data.error || { code: "internal", message: response.statusText };
    if (response.status === 401) $("#token-form").hidden = false;
    throw Object.assign(new Error(`${error.code}: ${error.message}`), { code: error.code });
  }
  return data;
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (className) td.className = className;
  return td;
}

function time(ms) {
  if (!ms) return "";
  const d = new Date(ms);
  return `${d.toLocaleTimeString("en-GB")}.${String(d.getMilliseconds()).padStart(3, "0")}`;
}

function preview(payload) {
  const text = typeof payload === "string" ? payload : JSON.stringify(payload);
  return text.length > 120 ? `${text.slice(0, 117)}...` : text;
}

function prepend(list, item) {
  list.prepend(item);
  while (list.children.length > FEED_LIMIT) list.lastChild.remove();
}

// ------------------------------------------------------------------ endpoints

async function refreshEndpoints() {
  const { endpoints } = await api("GET", "/api/endpoints");
  const body = $("#endpoints tbody");
  body.replaceChildren();
  for (const e of endpoints) {
    const row = body.insertRow();
    row.dataset.subject = e.subject;
    cell(row, e.subject);
    cell(row, e.hash, "mono");
    cell(row, e.depth, "depth num");
    // Handed out and not answered yet; the age of the oldest in its tooltip.
    const claimed = cell(row, e.claimed ?? "", "claimed num");
    if (e.oldestClaimedAt) claimed.title = `the oldest handed out at ${time(e.oldestClaimedAt)}`;
    pressureCell(row, e.pressure);
    cell(row, e.breaker.state, `breaker ${e.breaker.state}`);
  }
}

// A mailbox's fill as a bar and a number. Any pressure above 0 gets at least a sliver
// of bar (min-width in console.css): 1 of 1,000 waiting is 0.1 %, which would be a
// fraction of a pixel, and the bar is there to say "something waits".
function pressureCell(row, ratio) {
  const percent = ratio * 100;
  const shown = percent > 0 && percent < 10 ? percent.toFixed(1) : Math.round(percent);
  const td = cell(row, "", "pressure num");
  const bar = document.createElement("span");
  bar.className = "bar";
  const fill = document.createElement("span");
  fill.style.width = `${Math.min(100, percent)}%`;
  if (percent > 0) bar.append(fill);
  td.append(bar, ` ${shown}%`);
}

// ------------------------------------------------------------------ live stream

function showMessage(message) {
  const li = document.createElement("li");
  li.dataset.id = message.id;
  li.tabIndex = 0;
  li.title = "show its trace";
  li.innerHTML =
    '<div><span class="when"></span> <span class="subject"></span> <span class="from"></span>' +
    ' <code class="id"></code></div><div class="payload"></div>';
  li.querySelector(".when").textContent = time(message.createdAt);
  li.querySelector(".id").textContent = message.id;
  li.querySelector(".subject").textContent = message.subject;
  li.querySelector(".from").textContent = `from ${message.from}`;
  li.querySelector(".payload").textContent = preview(message.payload);
  li.addEventListener("click", () => showTrace(message.id));
  prepend($("#messages"), li);
}

function showSignal(event, data) {
  const li = document.createElement("li");
  li.className = event === "relay_backpressure" ? "backpressure" : "";
  li.dataset.type = data.type;
  // A signal is sent on a subject (the router's backpressure warnings: the publisher's)
  // about an endpoint; say both when they differ.
  const about = data.endpointSubject || data.subject;
  const to = data.subject !== about ? ` (to ${data.subject})` : "";
  const extra = data.data ? ` ${JSON.stringify(data.data)}` : "";
  li.textContent = `${time(data.timestamp)} ${data.type} ${data.state} on ${about}${to}${extra}`;
  prepend($("#signals"), li);
}

// What the live lists watch: ?pattern=P in the page's address (default: everything),
// for an identity that may receive only some endpoints.
const PATTERN = new URLSearchParams(location.search).get("pattern") || ">";

function openStream() {
  const query = new URLSearchParams({ pattern: PATTERN, mode: "observe" });
  if (token()) query.set("token", token());
  const source = new EventSource(`/api/stream?${query}`);
  const state = $("#stream-state");
  source.onopen = () => {
    state.textContent = "live";
    state.className = "state on";
  };
  source.onerror = () => {
    state.textContent = "reconnecting";
    state.className = "state off";
  };
  source.addEventListener("relay_message", (e) => {
    showMessage(JSON.parse(e.data));
    refreshEndpoints().catch(() => {});
  });
  for (const name of ["relay_signal", "relay_backpressure"]) {
    source.addEventListener(name, (e) => showSignal(name, JSON.parse(e.data)));
  }
  source.addEventListener("relay_gap", () => notice("some messages were missed while away"));
  return source;
}

// ------------------------------------------------------------------ trace

async function showTrace(id) {
  $("#trace-id").value = id;
  const target = $("#trace");
  try {
    const trace = await api("GET", `/api/trace/${encodeURIComponent(id)}`);
    const table = document.createElement("table");
    table.dataset.id = trace.id;
    table.createTHead().innerHTML =
      "<tr><th>endpoint</th><th>state</th><th>stored</th><th>claimed</th>" +
      "<th>finished</th><th>reason</th></tr>";
    const body = table.createTBody();
    for (const c of trace.copies) {
      const row = body.insertRow();
      cell(row, c.endpointSubject || c.endpoint);
      cell(row, c.state, `copy-state ${c.state}`);
      cell(row, time(c.storedAt), "time");
      cell(row, time(c.claimedAt), "time");
      cell(row, time(c.finishedAt), "time");
      const reason = cell(row, c.reason);
      // The dead letters it was requeued from (an operator's requeue), oldest first.
      for (const r of c.requeues || []) {
        const text = `requeued ${time(r.requeuedAt)} after ${r.code}: ${r.reason}`;
        reason.append(line(text, "meta requeued"));
      }
    }
    const title = document.createElement("p");
    title.innerHTML = 'Message <code></code> <span class="meta"></span>';
    title.querySelector("code").textContent = trace.id;
    const first = trace.copies[0];
    if (first) {
      const meta = `from ${first.from}, created ${time(first.createdAt)}`;
      title.querySelector(".meta").textContent = meta;
    }
    target.replaceChildren(
      title,
      trace.copies.length ? table : "no copy found",
      conversation(first && first.parentId, trace.replies || []),
    );
  } catch (error) {
    target.textContent = error.message;
  }
}

// The conversation around a message: what it answers (its parentId) and what answers
// it, each a link to its own trace.
function conversation(parentId, replies) {
  const box = document.createElement("div");
  box.className = "conversation";
  const link = (id, text) => {
    const a = document.createElement("a");
    a.href = "#";
    a.className = "link";
    a.dataset.id = id;
    a.textContent = text;
    a.addEventListener("click", (e) => {
      e.preventDefault();
      showTrace(id);
    });
    return a;
  };
  if (parentId) {
    const p = document.createElement("p");
    p.className = "parent";
    p.append("in reply to ", link(parentId, parentId));
    box.append(p);
  }
  const seen = new Set();
  const answers = replies.filter((r) => !seen.has(r.id) && seen.add(r.id));
  if (answers.length) {
    const p = document.createElement("p");
    p.className = "replies";
    p.append(`${answers.length === 1 ? "reply" : "replies"}: `);
    answers.forEach((r, n) => {
      if (n) p.append(", ");
      p.append(link(r.id, `${r.id} from ${r.from}`));
    });
    box.append(p);
  }
  return box;
}

// ------------------------------------------------------------------ dead letters

async function refreshDeadLetters() {
  const { items } = await api("GET", "/api/dead-letters?limit=200");
  const body = $("#dead-letters tbody");
  body.replaceChildren();
  for (const d of items) {
    const row = body.insertRow();
    row.dataset.id = d.id;
    row.dataset.endpoint = d.endpoint;
    const id = line(d.id, "link");
    id.addEventListener("click", () => showTrace(d.id));
    cell(row, "", "mono").append(id, line(time(d.finishedAt), "meta time"));
    cell(row, d.endpointSubject || d.endpoint).append(line(`from ${d.from}`, "meta"));
    cell(row, d.code, "code");
    const reason = cell(row, "", "reason");
    reason.append(line(d.reason, "clamp"));
    reason.title = d.reason || "";
    const actions = row.insertCell();
    // Requeue: the same message back in line (a dead letter of a registered endpoint);
    // republish: a new message with a new id.
    if (d.endpointSubject) actions.append(button("Requeue", "requeue", () => requeue(d)));
    actions.append(
      button("Republish", "republish", () => republish(d)),
      button("Purge endpoint", "purge danger", () => purge(d.endpoint, d.endpointSubject)),
    );
  }
}

function line(text, className) {
  const div = document.createElement("div");
  div.className = className;
  div.textContent = text || "";
  return div;
}

function button(label, className, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.className = className;
  b.addEventListener("click", onClick);
  return b;
}

async function operator(action, done) {
  try {
    notice(done(await action()));
  } catch (error) {
    notice(error.message, true);
  }
  await refreshDeadLetters().catch(() => {});
  await refreshEndpoints().catch(() => {});
}

function purge(endpoint, subject) {
  const what = endpoint ? `the dead letters of ${subject || endpoint}` : "every dead letter";
  if (!confirm(`Purge ${what}? They are deleted for good.`)) return;
  const query = endpoint ? `?endpoint=${encodeURIComponent(endpoint)}` : "";
  return operator(
    () => api("DELETE", `/api/dead-letters${query}`),
    (r) => `purged ${r.purged} dead letter(s)`,
  );
}

function requeue(letter) {
  return operator(
    () => api("POST", `/api/dead-letters/${letter.id}/requeue`, { endpoint: letter.endpoint }),
    (r) => `requeued ${r.requeued.map((c) => c.id).join(", ")} to ${letter.endpointSubject}`,
  );
}

function republish(letter) {
  return operator(
    () => api("POST", `/api/dead-letters/${letter.id}/republish`, { endpoint: letter.endpoint }),
    (r) => `republished to ${r.subject} as ${r.result.messageId} (stored in ${r.result.deliveredTo})`,
  );
}

// ------------------------------------------------------------------ start

function start() {
  $("#pattern").textContent = PATTERN;
  $("#token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    localStorage.setItem("relay-token", $("#token").value.trim());
    location.reload();
  });
  $("#trace-form").addEventListener("submit", (e) => {
    e.preventDefault();
    showTrace($("#trace-id").value.trim());
  });
  $("#refresh-dead-letters").addEventListener("click", () => refreshDeadLetters());
  $("#purge-all").addEventListener("click", () => purge(null, null));
  const poll = () => {
    refreshEndpoints().catch((e) => notice(e.message, true));
    refreshDeadLetters().catch((e) => notice(e.message, true));
  };
  poll();
  setInterval(poll, POLL_MS);
  openStream();
}

start();
