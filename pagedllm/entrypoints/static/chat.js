// pagedllm chat page: plain JavaScript over the server's OpenAI endpoints (no build, no CDN).
// /v1/models fills the picker; /v1/chat/completions streams the answer (SSE over fetch);
// Stop aborts the fetch, which closes the connection, and the server aborts the request.
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];           // [{role, content}] of this chat (system prompt added per request)
let controller = null;        // AbortController of the running request
let apiKey = sessionStorage.getItem("pagedllm-api-key") || "";

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

function setStatus(text) { $("status").textContent = text || ""; }

function askForKey(message) {
  $("keybox").hidden = false;
  setStatus(message || "This server needs an API key.");
  $("apikey").focus();
}

async function loadModels() {
  let resp;
  try {
    resp = await fetch("/v1/models", { headers: headers() });
  } catch (err) {
    setStatus("cannot reach the server: " + err);
    return;
  }
  if (resp.status === 401) { askForKey(); return; }
  if (!resp.ok) { setStatus("GET /v1/models: HTTP " + resp.status); return; }
  const models = (await resp.json()).data || [];
  const select = $("model");
  select.replaceChildren(...models.map((m) => new Option(m.id, m.id)));
  $("keybox").hidden = true;
  setStatus("");
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("messages").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function numberField(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...history);
  const body = {
    model: $("model").value, messages, stream: true,
    stream_options: { include_usage: true },
    temperature: numberField("temperature"), top_p: numberField("top_p"),
    max_tokens: numberField("max_tokens"), seed: numberField("seed"),
  };
  const topK = numberField("top_k");
  if (topK) body.top_k = topK;
  return body;
}

// Yields the JSON payload of each `data:` event of an SSE body.
async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function showSpeed(tokens, firstAt, startedAt, done) {
  if (!firstAt) return;
  const secs = (performance.now() - firstAt) / 1000;
  const rate = tokens > 1 && secs > 0 ? ((tokens - 1) / secs).toFixed(1) : "-";
  const ttft = ((firstAt - startedAt) / 1000).toFixed(2);
  const count = `${tokens} token${tokens === 1 ? "" : "s"}`;
  $("speed").textContent = `${count}, ${rate} tokens/s, first token after ${ttft} s` +
    (done ? "" : " ...");
}

// Paints a streamed answer at most once per animation frame: text arriving between frames is
// appended to one text node in one go, so a fast engine (hundreds of tokens a second) costs the
// page one layout per frame, not one per token over an ever longer answer.
function streamView(out, startedAt) {
  const text = document.createTextNode("");
  out.appendChild(text);
  const view = { tokens: 0, firstAt: 0, pending: "", frame: 0 };
  const paint = () => {
    view.frame = 0;
    if (view.pending) {
      text.appendData(view.pending);
      view.pending = "";
      out.scrollIntoView({ block: "end" });
    }
    showSpeed(view.tokens, view.firstAt, startedAt, false);
  };
  view.add = (content) => {
    if (!view.firstAt) view.firstAt = performance.now();
    view.tokens += 1;
    view.pending += content;
    if (!view.frame) view.frame = requestAnimationFrame(paint);
  };
  view.finish = (done) => {
    if (view.frame) cancelAnimationFrame(view.frame);
    paint();
    showSpeed(view.tokens, view.firstAt, startedAt, done);
  };
  return view;
}

async function send(text) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const out = addMessage("assistant", "");
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const view = streamView(out, performance.now());
  let answer = "";
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody()),
      signal: controller.signal,
    });
    if (resp.status === 401) { askForKey("The API key was refused; enter it again."); }
    if (!resp.ok) {
      const err = await resp.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || "HTTP " + resp.status);
    }
    for await (const chunk of sseEvents(resp.body)) {
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        answer += delta.content;
        view.add(delta.content);
      }
      if (chunk.usage) view.tokens = chunk.usage.completion_tokens;
    }
    view.finish(true);
  } catch (err) {
    view.finish(false);
    if (err.name === "AbortError") {
      out.dataset.stopped = "true";
      $("speed").textContent = $("speed").textContent.replace(/ \.\.\.$/, "") + " (stopped)";
    } else {
      addMessage("error", String(err.message || err));
    }
  } finally {
    if (answer) history.push({ role: "assistant", content: answer });
    out.dataset.done = "true";
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", () => { if (controller) controller.abort(); });
$("clear").addEventListener("click", () => {
  history.length = 0;
  $("messages").replaceChildren();
  $("speed").textContent = "";
});
$("savekey").addEventListener("click", () => {
  apiKey = $("apikey").value.trim();
  sessionStorage.setItem("pagedllm-api-key", apiKey);
  loadModels();
});
loadModels();
