// The Arcane dashboard: plain JavaScript, no build step, nothing from elsewhere.
// Everything it calls is same-origin under /ui/api/ with the session cookie; text from
// the host is only ever set as textContent, never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "data") Object.assign(node.dataset, value);
    else if (key === "class") node.className = value;
    else node[key] = value;
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(child instanceof Node ? child : String(child));
    }
  }
  return node;
}

// ---- login: the one-time code travels in the fragment, never to the server's logs.

async function login() {
  const status = $("login-status");
  const fragment = new URLSearchParams(location.hash.slice(1));
  const code = fragment.get("code");
  if (!code) return;
  // Where to go once logged in: the dashboard, or the application's packaged web.
  // Only these two: the fragment never names an arbitrary place to send the browser.
  const next = fragment.get("next") === "app" ? "/ui/app/" : "/ui";
  // Out of the address bar and this history entry before anything else happens.
  history.replaceState(null, "", location.pathname);
  status.textContent = "Logging in…";
  status.dataset.state = "pending";
  try {
    const response = await fetch("/ui/session", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ code }),
    });
    if (response.status === 204) {
      location.replace(next);
      return;
    }
    const body = await response.json().catch(() => ({}));
    const message = (body.error && body.error.message) || `refused (HTTP ${response.status})`;
    status.textContent = `This link cannot log in: ${message}. Run “arcane open” for a new one.`;
    status.dataset.state = "refused";
  } catch (error) {
    status.textContent = `The host did not answer: ${error}`;
    status.dataset.state = "refused";
  }
}

// ---- the dashboard

const view = { models: [], pending: new Set(), rpcId: 0, logs: null, chat: null };

function sessionLost() {
  location.replace("/ui");
}

function notice(text) {
  const box = $("notice");
  box.textContent = text || "";
  box.hidden = !text;
}

async function rpc(method, parameters = {}) {
  view.rpcId += 1;
  const frame = { protocol: "arcane/1", type: "request", id: `ui-${view.rpcId}`, method, parameters };
  const response = await fetch("/ui/api/rpc", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(frame),
  });
  if (response.status === 401) {
    sessionLost();
    throw new Error("the session ended");
  }
  const answer = await response.json();
  if (!answer.ok) {
    const error = answer.error || {};
    throw new Error(`${error.message || `HTTP ${response.status}`} (${error.code || "error"})`);
  }
  return answer.result;
}

function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

function unloads(model) {
  if (model.state !== "ready") return "—";
  if (model.inFlight > 0) return "busy";
  if (model.keepAlive !== null && model.keepAlive < 0) return "never";
  return duration(model.unloadsIn);
}

// The model's waiting requests, with who they are from (key names) on hover.
function queued(model) {
  const byKey = Object.entries(model.queuedByKey ?? {}).map(([key, n]) => `${key}: ${n}`);
  const limit = model.maxQueue === undefined ? "" : ` (at most ${model.maxQueue}, ${model.parallel} at once)`;
  return el("td", { class: "num", title: `${byKey.join(", ") || "none waiting"}${limit}` }, model.queued ?? 0);
}

async function act(model, method) {
  view.pending.add(model);
  renderModels();
  notice("");
  try {
    await rpc(method, { model });
  } catch (error) {
    notice(`${method === "models.load" ? "Loading" : "Unloading"} ${model} failed: ${error.message}`);
  } finally {
    view.pending.delete(model);
    refreshModels();
  }
}

function renderModels() {
  const body = $("models");
  body.replaceChildren();
  if (view.models.length === 0) {
    body.append(el("tr", {}, el("td", { colSpan: 8, class: "muted" }, "no models")));
  }
  for (const m of view.models) {
    const busy = view.pending.has(m.id) || m.state === "starting" || m.state === "loading" || m.state === "stopping";
    const loaded = m.state === "ready";
    const button = el("button", {
      type: "button",
      disabled: busy || m.external,
      data: { action: loaded ? "unload" : "load", model: m.id },
      textContent: busy ? "…" : loaded ? "Unload" : "Load",
      title: m.external ? "an external server: Arcane neither starts nor stops it" : "",
    });
    button.addEventListener("click", () => act(m.id, loaded ? "models.unload" : "models.load"));
    const name = el("td", {}, el("strong", {}, m.id));
    if (m.aliases && m.aliases.length) name.append(el("span", { class: "muted" }, ` (${m.aliases.join(", ")})`));
    const state = el("td", {}, el("span", { class: "state", data: { state: m.state } }, m.state));
    if (m.lastError) state.append(el("div", { class: "error" }, m.lastError.message ?? JSON.stringify(m.lastError)));
    body.append(el("tr", { data: { model: m.id, state: m.state } },
      name, state,
      el("td", {}, m.device),
      el("td", { class: "num" }, bytes(m.memoryNeed)),
      el("td", { class: "num" }, bytes(m.residentBytes)),
      el("td", { class: "num" }, m.inFlight),
      queued(m),
      el("td", { class: "num" }, unloads(m)),
      el("td", {}, button)));
  }
}

function fillSelect(select, ids) {
  const current = select.value;
  const known = [...select.options].map((o) => o.value);
  if (known.join("\n") === ids.join("\n")) return;
  select.replaceChildren(...ids.map((id) => el("option", { value: id }, id)));
  if (ids.includes(current)) select.value = current;
}

async function refreshModels() {
  try {
    const result = await rpc("models.list");
    view.models = result.models || [];
    renderModels();
    const ids = view.models.map((m) => m.id);
    // The playground offers the models that chat (no voice, transcriber or embedder).
    fillSelect($("chat-model"), view.models.filter((m) => m.chat).map((m) => m.id));
    const before = $("logs-model").value;
    fillSelect($("logs-model"), ids);
    if ($("logs-model").value !== before || !view.logs) followLogs();
    renderDevices();
  } catch (error) {
    if (!String(error.message).includes("session")) notice(`Could not list the models: ${error.message}`);
  }
}

let devices = null;

async function refreshDevices() {
  try {
    devices = (await rpc("localai.devices")).devices || [];
  } catch (error) {
    devices = error;
  }
  renderDevices();
}

function renderDevices() {
  const body = $("devices");
  body.replaceChildren();
  if (devices === null) return;
  if (devices instanceof Error) {
    body.append(el("tr", {}, el("td", { colSpan: 3, class: "muted" }, `devices unavailable: ${devices.message}`)));
    return;
  }
  for (const d of devices) {
    const id = d.deviceId || d.kind;
    const mib = d.dedicatedMemoryMiB ?? d.memoryMiB;
    const need = view.models
      .filter((m) => m.device === id && m.state === "ready")
      .reduce((sum, m) => sum + (m.memoryNeed || 0), 0);
    const memory = el("td", { class: "num" }, mib ? bytes(mib * 1024 * 1024) : "—");
    if (need) memory.append(el("div", { class: "muted" }, `${bytes(need)} needed by loaded models`));
    body.append(el("tr", { data: { device: id } },
      el("td", {}, id, el("span", { class: "muted" }, d.present === false ? " (absent)" : "")),
      el("td", {}, d.name || d.kind),
      memory));
  }
}

// Prometheus text of the gateway: `arcane_requests_total{model="x"} 3`.
async function refreshUsage() {
  const body = $("usage");
  let text;
  try {
    const response = await fetch("/ui/api/metrics");
    if (response.status === 401) return sessionLost();
    if (!response.ok) {
      body.replaceChildren(el("tr", {}, el("td", { colSpan: 5, class: "muted" }, "metrics unavailable")));
      return;
    }
    text = await response.text();
  } catch (error) {
    return;
  }
  const rows = new Map();
  const pattern = /^arcane_(requests|request_errors|prompt_tokens|completion_tokens)_total\{model="((?:[^"\\]|\\.)*)"\} ([0-9.eE+]+)/;
  for (const line of text.split("\n")) {
    const match = pattern.exec(line);
    if (!match) continue;
    const row = rows.get(match[2]) || {};
    row[match[1]] = Number(match[3]);
    rows.set(match[2], row);
  }
  if (rows.size === 0) return;
  body.replaceChildren(...[...rows].map(([model, r]) => el("tr", { data: { model } },
    el("td", {}, model),
    el("td", { class: "num" }, r.requests || 0),
    el("td", { class: "num" }, r.request_errors || 0),
    el("td", { class: "num" }, r.prompt_tokens || 0),
    el("td", { class: "num" }, r.completion_tokens || 0))));
}

function summary(data) {
  if (data === null || data === undefined) return "";
  const text = JSON.stringify(data);
  return text.length > 160 ? `${text.slice(0, 160)}…` : text;
}

function connectEvents() {
  const badge = $("live");
  const list = $("events");
  let count = 0;
  const source = new EventSource("/ui/api/events");
  source.onopen = () => {
    badge.textContent = "live";
    badge.dataset.state = "live";
  };
  source.onerror = () => {
    badge.textContent = "disconnected";
    badge.dataset.state = "down";
  };
  source.onmessage = (message) => {
    let frame;
    try {
      frame = JSON.parse(message.data);
    } catch (error) {
      return;
    }
    if (frame.type !== "event") return;
    if (String(frame.event).startsWith("local-ai.model.")) refreshModels();
    // Engine output lines are logs, not events: shown only when asked for.
    const output = frame.event === "process.stdout" || frame.event === "process.stderr";
    if (output && !$("events-output").checked) return;
    count += 1;
    $("events-count").textContent = count;
    const time = (frame.time || "").slice(11, 23);
    list.prepend(el("li", { data: { event: frame.event } }, `${time} ${frame.event} `,
      el("span", { class: "muted" }, summary(frame.data))));
    while (list.children.length > 200) list.lastChild.remove();
  };
}

// Per-model logs: `GET /v1/logs?model=ID&follow=1&since=5m`, NDJSON lines
// `{"time","model","stream","line"}`; a host without it answers 404.
async function followLogs() {
  if (view.logs) view.logs.abort();
  const model = $("logs-model").value;
  const status = $("logs-status");
  const list = $("logs");
  list.replaceChildren();
  if (!model) return;
  const controller = new AbortController();
  view.logs = controller;
  status.textContent = "connecting…";
  status.dataset.state = "connecting";
  try {
    const query = new URLSearchParams({ model, follow: "1", since: "5m" });
    const response = await fetch(`/ui/api/logs?${query}`, { signal: controller.signal });
    if (response.status === 401) return sessionLost();
    if (!response.ok) {
      status.textContent = response.status === 404 ? "logs unavailable" : `logs unavailable (HTTP ${response.status})`;
      status.dataset.state = "unavailable";
      return;
    }
    status.textContent = "following";
    status.dataset.state = "following";
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      const lines = buffer.split("\n");
      buffer = lines.pop();
      for (const line of lines) {
        if (!line.trim()) continue;
        let entry;
        try {
          entry = JSON.parse(line);
        } catch (error) {
          continue;
        }
        const stick = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
        list.append(el("li", { class: entry.stream || "" },
          el("span", { class: "muted" }, `${(entry.time || "").slice(11, 23)} `), entry.line));
        while (list.children.length > 500) list.firstChild.remove();
        if (stick) list.scrollTop = list.scrollHeight;
      }
    }
    status.textContent = "ended";
    status.dataset.state = "ended";
  } catch (error) {
    if (controller.signal.aborted) return;
    status.textContent = `logs unavailable: ${error.message}`;
    status.dataset.state = "unavailable";
  }
}

async function chat(event) {
  event.preventDefault();
  const output = $("chat-output");
  const status = $("chat-status");
  const send = $("chat-send");
  const stop = $("chat-stop");
  const controller = new AbortController();
  view.chat = controller;
  output.textContent = "";
  status.textContent = "waiting for the model…";
  status.dataset.state = "waiting";
  send.disabled = true;
  stop.disabled = false;
  const body = {
    model: $("chat-model").value,
    stream: true,
    max_tokens: Number($("chat-max").value) || 128,
    messages: [{ role: "user", content: $("chat-prompt").value }],
    // The last chunk then reports the tokens, which the gateway counts.
    stream_options: { include_usage: true },
  };
  try {
    const response = await fetch("/ui/api/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (response.status === 401) return sessionLost();
    if (!response.ok) {
      const text = await response.text();
      let message = text;
      try {
        const parsed = JSON.parse(text);
        message = (parsed.error && parsed.error.message) || text;
      } catch (error) { /* not JSON: shown as it is */ }
      throw new Error(`HTTP ${response.status}: ${message}`);
    }
    status.textContent = "streaming";
    status.dataset.state = "streaming";
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      const lines = buffer.split("\n");
      buffer = lines.pop();
      for (const line of lines) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") continue;
        try {
          const chunk = JSON.parse(data);
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (delta && delta.content) output.textContent += delta.content;
        } catch (error) { /* a partial or foreign line */ }
      }
    }
    status.textContent = "done";
    status.dataset.state = "done";
  } catch (error) {
    status.textContent = controller.signal.aborted ? "stopped" : `failed: ${error.message}`;
    status.dataset.state = controller.signal.aborted ? "stopped" : "error";
  } finally {
    send.disabled = false;
    stop.disabled = true;
    view.chat = null;
    refreshModels();
    refreshUsage();
  }
}

async function logout() {
  await fetch("/ui/logout", { method: "POST" }).catch(() => null);
  location.replace("/ui");
}

function every(ms, task) {
  const run = async () => {
    await task();
    setTimeout(run, ms);
  };
  run();
}

function dashboard() {
  $("logout").addEventListener("click", logout);
  $("chat").addEventListener("submit", chat);
  $("chat-stop").addEventListener("click", () => view.chat && view.chat.abort());
  $("logs-model").addEventListener("change", followLogs);
  rpc("version.current")
    .then((v) => { $("host").textContent = `${v.name} ${v.version} · ${location.host}`; })
    .catch(() => { $("host").textContent = location.host; });
  connectEvents();
  refreshDevices();
  every(2000, refreshModels);
  every(5000, refreshUsage);
}

if (document.body.dataset.page === "login") login();
else dashboard();
