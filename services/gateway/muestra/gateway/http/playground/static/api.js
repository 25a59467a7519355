// The gateway's public HTTP API, as the page uses it: the API key, errors in words, and SSE streams.

const KEY_NAME = "muestra.apiKey";
let key = sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME) || "";
const keyListeners = [];

export function apiKey() {
  return key;
}

export function setApiKey(value, remember) {
  key = value;
  sessionStorage.setItem(KEY_NAME, value);
  if (remember) localStorage.setItem(KEY_NAME, value);
  else localStorage.removeItem(KEY_NAME);
}

export function forgetApiKey() {
  key = "";
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
}

// Called with the API's message when a request is refused for its key (401).
export function onKeyNeeded(listener) {
  keyListeners.push(listener);
}

export class ApiError extends Error {
  constructor(status, message, param) {
    super(message);
    this.status = status;
    this.param = param || null;
  }
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`.trim();
  let param = null;
  try {
    const body = await response.json();
    const error = body.error || body;
    if (error && typeof error.message === "string") message = error.message;
    else if (typeof body.detail === "string") message = body.detail;
    param = (error && error.param) || null;
  } catch {
    // not JSON: keep the status line
  }
  if (response.status === 401) for (const listener of keyListeners) listener(message);
  return new ApiError(response.status, message, param);
}

function networkError(error) {
  if (error.name === "AbortError") return error;
  return new ApiError(0, `the gateway did not answer (${error.message}); is it still running?`);
}

// fetch, with the key; an ApiError in words for a refused request or a gateway that did not answer.
async function send(path, init) {
  let response;
  try {
    response = await fetch(path, { ...init, headers: headers(init.body !== undefined) });
  } catch (error) {
    throw networkError(error);
  }
  if (!response.ok) throw await failure(response);
  return response;
}

export async function getJSON(path, signal) {
  return (await send(path, { signal })).json();
}

export async function postJSON(path, body) {
  return (await send(path, { method: "POST", body: JSON.stringify(body) })).json();
}

// POST a streaming request and call onEvent(json) for each server-sent event, in order.
// Resolves when the stream ends; rejects with ApiError for an HTTP error or an error event.
export async function postStream(path, body, onEvent, signal) {
  const response = await send(path, { method: "POST", body: JSON.stringify(body), signal });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (error) {
      throw networkError(error);
    }
    if (chunk.done) break;
    buffer += chunk.value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = block
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) throw new ApiError(500, event.error.message || "the stream ended with an error", event.error.param);
      onEvent(event);
    }
  }
}

export function describe(error) {
  if (error instanceof ApiError) {
    const where = error.status ? `HTTP ${error.status}` : "Network";
    return `${where}: ${error.message}`;
  }
  return String(error && error.message ? error.message : error);
}

// A seed the user can read back: 32 bits from the browser's generator.
export function randomSeed() {
  return crypto.getRandomValues(new Uint32Array(1))[0];
}

// The seed for the next request: the one typed in `field`; else a fresh random one, written into the field so
// that it can be read back. A seed drawn so is drawn again next time, unless `same` ("Same seed every time").
export function nextSeed(field, same) {
  const value = field.value.trim();
  const typed = value !== "" && value !== field.dataset.drawn;
  if (!typed && !(same && value !== "")) {
    field.value = String(randomSeed());
    field.dataset.drawn = field.value;
  }
  return Number(field.value);
}
