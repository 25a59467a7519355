// Chat and raw completion: requests built from the settings, tokens streamed into the page as they come.

import { describe, nextSeed, postJSON, postStream } from "./api.js";
import { markdownFragment } from "./markdown.js";
import { chain, onChainChange, snippets } from "./samplers.js";
import { clearError, element, showError } from "./ui.js";

const $ = (id) => document.getElementById(id);
const history = []; // chat messages sent so far: {role, content}
let dropped = 0; // how many of the oldest messages in `history` requests leave out, to fit the context
let running = null; // {controller, view}
let eqKind = "curl";
let contextLength = 0; // the text model's max_model_len, from its /v1/models card (0: not known)

// An empty Max tokens means: until the model stops, within a quarter of the context (as fitContext keeps free).
export function setContextLength(length) {
  contextLength = length || 0;
  $("max-tokens").placeholder = contextLength ? String(Math.floor(contextLength / 4)) : "";
  refreshEquivalent();
}

// The max_tokens a request gets: the typed one, else a quarter of the context (undefined: the context is unknown).
function maxTokens(context = contextLength) {
  const typed = $("max-tokens").value.trim();
  if (typed !== "") return Number(typed);
  return context ? Math.floor(context / 4) : undefined;
}

function seed() {
  return nextSeed($("text-seed"), $("text-same-seed").checked);
}

function chatMessages() {
  const system = $("chat-system").value.trim();
  return [...(system ? [{ role: "system", content: system }] : []), ...history.slice(dropped)];
}

// Leave out the oldest turns until the conversation plus max_tokens fits the model's context, counted by the
// gateway's tokenizer (POST /tokenize). The system prompt and the last message stay. Returns a note, or "".
async function fitContext() {
  const before = dropped;
  let counted;
  let max;
  try {
    for (;;) {
      counted = await postJSON("/tokenize", { model: $("text-model").value || "", messages: chatMessages() });
      max = maxTokens(counted.max_model_len);
      const left = history.length - dropped;
      if (counted.count + max <= counted.max_model_len || left <= 1) break;
      dropped += Math.min(2, left - 1);
    }
  } catch {
    return ""; // the request itself says what is wrong
  }
  if (dropped === before) return "";
  return (
    `The oldest ${dropped} message${dropped === 1 ? "" : "s"} no longer fit the model's ` +
    `${counted.max_model_len}-token context with ${max} tokens to answer: the model sees the last ` +
    `${history.length - dropped}${$("chat-system").value.trim() ? " and the system prompt" : ""}.`
  );
}

// The body of the request the current settings make (seed: the one to use; none for the preview).
export function textBody(view, seedValue) {
  const chat = view === "chat";
  const body = { model: $("text-model").value || "" };
  if (chat) {
    body.messages = chatMessages();
    const pending = $("chat-input").value;
    if (seedValue === undefined && pending.trim()) body.messages = [...body.messages, { role: "user", content: pending }];
  } else {
    body.prompt = $("complete-prompt").value;
  }
  const max = maxTokens();
  if (max !== undefined) body.max_tokens = max;
  const fieldSeed = $("text-seed").value.trim();
  if (seedValue !== undefined) body.seed = seedValue;
  else if (fieldSeed !== "") body.seed = Number(fieldSeed);
  body.stream = true;
  body.stream_options = { include_usage: true };
  const samplers = chain();
  if (samplers.length) body.samplers = samplers;
  if ($("text-ignore-eos").checked) body.ignore_eos = true;
  if ($("text-logprobs").checked) {
    if (chat) {
      body.logprobs = true;
      body.top_logprobs = 5;
    } else {
      body.logprobs = 5;
    }
  }
  return body;
}

function currentView() {
  return $("view-complete").hidden ? "chat" : "complete";
}

const PATHS = { chat: "/v1/chat/completions", complete: "/v1/completions" };

export function refreshEquivalent() {
  const view = currentView();
  const made = snippets(PATHS[view], textBody(view));
  $("eq-code").textContent = made[eqKind];
}

function probabilityColour(p) {
  // High probability: no tint; low: warm. Readable in light and dark themes (alpha over the text's background).
  const alpha = Math.min(0.55, Math.max(0, 1 - p) * 0.6);
  return `rgba(230, 120, 20, ${alpha.toFixed(3)})`;
}

function tokenSpan(text, entries) {
  const span = document.createElement("span");
  span.className = "tok";
  span.textContent = text;
  if (entries && entries.length) {
    const joint = entries.reduce((sum, e) => sum + e.logprob, 0);
    const p = Math.exp(joint);
    span.style.backgroundColor = probabilityColour(p);
    span.dataset.p = p.toFixed(4);
    span.title = entries
      .map((e) => {
        const tops = (e.top || []).map((t) => `  ${JSON.stringify(t.token)} ${(Math.exp(t.logprob) * 100).toFixed(1)}%`);
        return [`${JSON.stringify(e.token)} ${(Math.exp(e.logprob) * 100).toFixed(1)}%`, ...tops].join("\n");
      })
      .join("\n");
  }
  return span;
}

function statsText(s) {
  const parts = [];
  if (s.tokens > 1 && s.last > s.first) parts.push(`${((s.tokens - 1) / ((s.last - s.first) / 1000)).toFixed(1)} tokens/s`);
  if (s.first) parts.push(`first token ${Math.round(s.first - s.start)} ms`);
  if (s.usage) {
    const cached = (s.usage.prompt_tokens_details && s.usage.prompt_tokens_details.cached_tokens) || 0;
    parts.push(`prompt ${s.usage.prompt_tokens} tokens (${cached} cached)`, `${s.usage.completion_tokens} generated`);
  }
  parts.push(`finish: ${s.finish || "—"}`, `seed ${s.seed}`);
  return parts.join(" · ");
}

function setRunning(view, on) {
  $(`${view}-stop`).disabled = !on;
  $(`${view}-send`).disabled = on;
  $(`${view}-regenerate`).disabled = on || !canRegenerate(view);
}

function canRegenerate(view) {
  if (view === "chat") return history.length > 0;
  return $("complete-out").childNodes.length > 0;
}

// Render `text` as Markdown into `el` at the next frame (at most once a frame while tokens stream in).
function renderLater(el, text) {
  el.pending = text;
  if (el.scheduled) return;
  el.scheduled = requestAnimationFrame(() => {
    el.scheduled = 0;
    const follow = atBottom(el);
    el.replaceChildren(markdownFragment(el.pending));
    if (follow) scrollToBottom(el);
  });
}

// Run one streamed request; `target` gets the text as it comes (one span per token), `rendered` (for chat
// answers) the same text as Markdown, `statsEl` the figures.
async function run(view, body, target, statsEl, rendered) {
  clearError();
  const controller = new AbortController();
  running = { controller, view };
  setRunning(view, true);
  const s = { start: performance.now(), first: 0, last: 0, tokens: 0, finish: "", usage: null, seed: body.seed };
  let text = "";
  statsEl.textContent = "waiting for the first token…";
  const chat = view === "chat";
  try {
    await postStream(
      PATHS[view],
      body,
      (event) => {
        if (event.usage) s.usage = event.usage;
        for (const choice of event.choices || []) {
          const piece = chat ? choice.delta && choice.delta.content : choice.text;
          let entries = null;
          if (chat && choice.logprobs && choice.logprobs.content) {
            entries = choice.logprobs.content.map((e) => ({
              token: e.token,
              logprob: e.logprob,
              top: e.top_logprobs || [],
            }));
          } else if (!chat && choice.logprobs && choice.logprobs.tokens) {
            entries = choice.logprobs.tokens.map((token, i) => ({
              token,
              logprob: choice.logprobs.token_logprobs[i],
              top: Object.entries(choice.logprobs.top_logprobs[i] || {}).map(([t, lp]) => ({ token: t, logprob: lp })),
            }));
          }
          if (piece) {
            const now = performance.now();
            if (!s.first) s.first = now;
            s.last = now;
            s.tokens += entries && entries.length ? entries.length : 1;
            text += piece;
            const follow = atBottom(target);
            target.append(tokenSpan(piece, entries));
            if (rendered) renderLater(rendered, text);
            if (follow) scrollToBottom(target);
          }
          if (choice.finish_reason) s.finish = choice.finish_reason;
        }
      },
      controller.signal,
    );
  } catch (error) {
    if (error.name === "AbortError") {
      s.finish = "stopped by you";
    } else {
      s.finish = "error";
      showError(describe(error));
      statsEl.textContent = `error: ${describe(error)}`;
      statsEl.dataset.finish = "error";
      return { text, error };
    }
  } finally {
    running = null;
    setRunning(view, false);
    $("chat-wait").hidden = true;
  }
  if (s.usage) s.tokens = s.usage.completion_tokens;
  statsEl.textContent = statsText(s);
  statsEl.dataset.finish = s.finish;
  statsEl.dataset.tokens = String(s.tokens);
  return { text, error: null };
}

// The chat log follows a streaming answer only while the reader is at its end: scrolling up to read stays put.
function scroller(el) {
  return el.closest("#chat-log");
}

function atBottom(el) {
  const log = scroller(el);
  return !!log && log.scrollHeight - log.scrollTop - log.clientHeight < 32;
}

function scrollToBottom(el) {
  const log = scroller(el);
  if (log) log.scrollTop = log.scrollHeight;
}

function messageElement(role) {
  const el = document.createElement("div");
  el.className = `message ${role}`;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role === "user" ? "You" : "Model";
  const text = document.createElement("div");
  text.className = "text";
  el.append(who, text);
  if (role === "assistant") {
    const rendered = document.createElement("div");
    rendered.className = "markdown";
    el.append(rendered);
    const stats = document.createElement("p");
    stats.className = "stats";
    el.append(stats);
  }
  $("chat-log").append(el);
  scrollToBottom(el);
  return el;
}

async function chatTurn() {
  const note = await fitContext();
  if (note) $("chat-log").append(element("p", note, "note"));
  const body = textBody("chat", seed());
  const el = messageElement("assistant");
  const result = await run("chat", body, el.querySelector(".text"), el.querySelector(".stats"), el.querySelector(".markdown"));
  if (result.error && !result.text) {
    el.querySelector(".text").textContent = "(no answer)";
    el.querySelector(".markdown").textContent = "(no answer)";
    el.dataset.failed = "true";
    return;
  }
  history.push({ role: "assistant", content: result.text });
  el.dataset.index = String(history.length - 1);
  $("chat-regenerate").disabled = false;
  refreshEquivalent();
}

async function sendChat(event) {
  event.preventDefault();
  if (running) {
    $("chat-wait").hidden = false; // the message stays in the box until the answer ends
    return;
  }
  const content = $("chat-input").value;
  if (!content.trim()) {
    showError("Write a message first.");
    $("chat-input").focus();
    return;
  }
  history.push({ role: "user", content });
  const el = messageElement("user");
  el.querySelector(".text").textContent = content;
  $("chat-input").value = "";
  await chatTurn();
}

async function regenerateChat() {
  if (running || !history.length) return;
  const log = $("chat-log");
  // Drop the last answer (and a failed one after it), then ask again for the same conversation.
  while (log.lastElementChild && !log.lastElementChild.classList.contains("user")) log.lastElementChild.remove();
  if (history[history.length - 1].role === "assistant") history.pop();
  await chatTurn();
}

async function complete(event) {
  if (event) event.preventDefault();
  if (running) return;
  const prompt = $("complete-prompt").value;
  if (!prompt) {
    showError("Write a prompt first.");
    $("complete-prompt").focus();
    return;
  }
  const out = $("complete-out");
  const head = document.createElement("span");
  head.className = "prompt";
  head.textContent = prompt;
  const generated = document.createElement("span");
  generated.className = "generated";
  out.replaceChildren(head, generated);
  await run("complete", textBody("complete", seed()), generated, $("complete-stats"));
  $("complete-regenerate").disabled = false;
}

function stop() {
  if (running) running.controller.abort();
}

export function initText() {
  $("chat-form").addEventListener("submit", sendChat);
  $("chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("chat-form").requestSubmit();
    }
  });
  $("chat-stop").addEventListener("click", stop);
  $("chat-regenerate").addEventListener("click", regenerateChat);
  $("chat-clear").addEventListener("click", () => {
    stop();
    history.length = 0;
    dropped = 0;
    $("chat-log").replaceChildren();
    $("chat-regenerate").disabled = true;
    refreshEquivalent();
  });
  $("complete-form").addEventListener("submit", complete);
  $("complete-stop").addEventListener("click", stop);
  $("complete-regenerate").addEventListener("click", () => complete());
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && running) stop();
  });

  for (const id of ["chat-system", "chat-input", "complete-prompt", "max-tokens", "text-seed", "text-model"]) {
    $(id).addEventListener("input", refreshEquivalent);
  }
  for (const id of ["text-ignore-eos", "text-logprobs", "text-same-seed"]) $(id).addEventListener("change", refreshEquivalent);
  // Token probabilities colour the raw tokens: with them on, answers show as raw text too.
  const showRaw = () => $("chat-log").classList.toggle("raw", $("text-raw").checked || $("text-logprobs").checked);
  for (const id of ["text-raw", "text-logprobs"]) $(id).addEventListener("change", showRaw);
  showRaw();
  onChainChange(refreshEquivalent);

  const kinds = { "eq-curl": "curl", "eq-python": "python", "eq-grpc": "grpc" };
  const tabs = Object.keys(kinds).map((id) => $(id));
  for (const tab of tabs) {
    tab.addEventListener("click", () => {
      eqKind = kinds[tab.id];
      for (const other of tabs) {
        other.setAttribute("aria-selected", String(other === tab));
        other.tabIndex = other === tab ? 0 : -1;
      }
      refreshEquivalent();
    });
  }
  $("eq-copy").addEventListener("click", async () => {
    const text = $("eq-code").textContent;
    try {
      await navigator.clipboard.writeText(text);
      $("eq-copy").textContent = "Copied";
    } catch {
      // No clipboard (plain http on another host): select the text so that Ctrl+C copies it.
      const range = document.createRange();
      range.selectNodeContents($("eq-code"));
      const selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      $("eq-copy").textContent = "Selected: press Ctrl+C";
    }
    setTimeout(() => ($("eq-copy").textContent = "Copy"), 2000);
  });
  refreshEquivalent();
}
