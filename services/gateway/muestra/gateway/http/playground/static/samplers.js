// The sampler-chain editor, built from each sampler's JSON Schema (GET /v1/samplers), so that a
// third-party plugin's parameters appear with no code here; and the same request as curl, Python, gRPC.

import { apiKey } from "./api.js";

const $ = (id) => document.getElementById(id);
let known = new Map(); // name -> sampler listing
let steps = []; // [{id, name, li}]
let nextId = 1;
let changed = () => {};
let modelChain = []; // the text model's default chain, from its /v1/models card (default_samplers)
let edited = false; // whether the user changed the chain since it was the model's

export function onChainChange(listener) {
  changed = listener;
}

export function setSamplers(listing) {
  known = new Map(listing.map((s) => [s.name, s]));
  const select = $("chain-add-name");
  select.replaceChildren(
    ...listing.map((s) => {
      const option = document.createElement("option");
      option.value = s.name;
      option.textContent = s.name; // where it comes from is in the line below the list
      return option;
    }),
  );
  describeChoice();
  render();
}

// The text model's own chain (its generation_config.json, as the API lists it); shown unless the user changed it.
export function setModelChain(specs, force = false) {
  modelChain = specs || [];
  if (edited && !force) return;
  edited = false;
  steps = modelChain.map((spec) => ({ id: nextId++, name: spec.name, values: { ...(spec.params || {}) } }));
  render();
}

const KINDS = { processor: "changes the scores", selector: "picks the token", search: "searches for the tokens" };

function describeChoice() {
  const s = known.get($("chain-add-name").value);
  if (!s) {
    $("chain-about").textContent = "";
    return;
  }
  const about = [KINDS[s.kind], s.distribution && `from ${s.distribution}`].filter(Boolean).join(", ");
  $("chain-about").textContent = `${s.name}${about ? ` (${about})` : ""}: ${s.description || "no description"}`;
}

function picksToken(name) {
  const s = known.get(name);
  return Boolean(s && s.kind && s.kind !== "processor");
}

// A processor goes before the step that picks the token; a new selector or search takes that step's place.
function addStep(name, values = {}) {
  const step = { id: nextId++, name, values };
  const last = steps.findLastIndex((s) => picksToken(s.name));
  if (last < 0) steps.push(step);
  else if (picksToken(name)) steps.splice(last, 1, step);
  else steps.splice(last, 0, step);
  edited = true;
  render();
  return step;
}

function move(index, by) {
  const to = index + by;
  if (to < 0 || to >= steps.length) return;
  const [step] = steps.splice(index, 1);
  steps.splice(to, 0, step);
  edited = true;
  render(step.id, by < 0 ? "up" : "down");
}

function remove(index) {
  steps.splice(index, 1);
  edited = true;
  render();
}

// The current values of each step's inputs, so that a re-render keeps what the user typed.
function capture() {
  for (const step of steps) {
    if (!step.inputs) continue;
    step.values = {};
    for (const [name, input] of Object.entries(step.inputs)) {
      const value = valueOf(input);
      if (value !== undefined) step.values[name] = value;
    }
  }
}

function options(schema) {
  if (Array.isArray(schema.enum)) return schema.enum;
  const parts = schema.oneOf || schema.anyOf;
  if (!Array.isArray(parts)) return null;
  const values = [];
  for (const part of parts) {
    if ("const" in part) values.push(part.const);
    else if (Array.isArray(part.enum)) values.push(...part.enum);
    else if (part.type === "boolean") values.push(false, true);
    else return null;
  }
  return values;
}

function field(step, name, schema) {
  const id = `step-${step.id}-${name}`;
  const wrap = document.createElement("div");
  const label = document.createElement("label");
  label.htmlFor = id;
  label.textContent = name;
  let input;
  const choices = options(schema);
  const value = name in step.values ? step.values[name] : schema.default;
  if (choices) {
    input = document.createElement("select");
    for (const choice of choices) {
      const option = document.createElement("option");
      option.value = JSON.stringify(choice);
      option.textContent = String(choice);
      input.append(option);
    }
    input.value = JSON.stringify(value === undefined ? choices[0] : value);
    input.dataset.kind = "json";
  } else if (schema.type === "number" || schema.type === "integer") {
    input = document.createElement("input");
    input.type = "number";
    input.step = schema.type === "integer" ? "1" : "any";
    const low = schema.minimum ?? schema.exclusiveMinimum;
    const high = schema.maximum ?? schema.exclusiveMaximum;
    if (low !== undefined) input.min = String(low);
    if (high !== undefined) input.max = String(high);
    input.value = value === undefined ? "" : String(value);
    input.dataset.kind = schema.type;
  } else if (schema.type === "boolean") {
    input = document.createElement("input");
    input.type = "checkbox";
    input.checked = Boolean(value);
    label.className = "inline";
    label.textContent = "";
    label.append(input, ` ${name}`);
    input.id = id;
    input.dataset.kind = "boolean";
  } else if (schema.type === "string") {
    input = document.createElement("input");
    input.type = "text";
    input.value = value ?? "";
    input.dataset.kind = "string";
  } else {
    input = document.createElement("textarea");
    input.rows = 2;
    input.value = typeof value === "string" ? value : JSON.stringify(value ?? {});
    input.dataset.kind = "json";
  }
  input.id = id;
  input.name = name;
  if (schema.description) {
    const hint = document.createElement("span");
    hint.className = "hint";
    hint.id = `${id}-hint`;
    hint.textContent = ` ${schema.description}`;
    label.append(hint);
    input.setAttribute("aria-describedby", hint.id);
  }
  input.addEventListener("input", () => {
    edited = true;
    changed();
  });
  input.addEventListener("change", () => changed());
  wrap.append(label);
  if (input.type !== "checkbox") wrap.append(input);
  return [wrap, input];
}

let dragged = null;

function render(focusId, direction) {
  capture();
  const list = $("chain-steps");
  list.replaceChildren();
  steps.forEach((step, index) => {
    const sampler = known.get(step.name);
    const li = document.createElement("li");
    li.className = "step";
    li.dataset.name = step.name;
    li.dataset.id = String(step.id);
    const head = document.createElement("div");
    head.className = "step-head";
    const title = document.createElement("strong");
    title.textContent = `${index + 1}. ${step.name}`;
    title.draggable = true;
    title.title = "Drag to reorder";
    const buttons = [
      ["↑", `Move ${step.name} up`, () => move(index, -1), index === 0, "up"],
      ["↓", `Move ${step.name} down`, () => move(index, 1), index === steps.length - 1, "down"],
      ["×", `Remove ${step.name}`, () => remove(index), false, "remove"],
    ].map(([text, label, action, disabled, role]) => {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = text;
      b.setAttribute("aria-label", label);
      b.dataset.action = role;
      b.disabled = disabled;
      b.addEventListener("click", action);
      return b;
    });
    head.append(title, ...buttons);
    li.append(head);
    step.inputs = {};
    const properties = (sampler && sampler.parameters && sampler.parameters.properties) || {};
    for (const [name, schema] of Object.entries(properties)) {
      const [wrap, input] = field(step, name, schema);
      step.inputs[name] = input;
      li.append(wrap);
    }
    if (!sampler) {
      const note = document.createElement("p");
      note.className = "hint";
      note.textContent = "This gateway does not list this sampler.";
      li.append(note);
    }
    title.addEventListener("dragstart", (event) => {
      dragged = index;
      li.classList.add("dragging");
      event.dataTransfer.effectAllowed = "move";
      event.dataTransfer.setData("text/plain", String(index));
    });
    title.addEventListener("dragend", () => li.classList.remove("dragging"));
    li.addEventListener("dragover", (event) => {
      if (dragged === null) return;
      event.preventDefault();
      li.classList.add("over");
    });
    li.addEventListener("dragleave", () => li.classList.remove("over"));
    li.addEventListener("drop", (event) => {
      event.preventDefault();
      if (dragged === null || dragged === index) return;
      capture();
      const [moved] = steps.splice(dragged, 1);
      steps.splice(index, 0, moved);
      dragged = null;
      edited = true;
      render();
    });
    list.append(li);
    if (step.id === focusId) {
      const again = li.querySelector(`button[data-action="${direction}"]:not(:disabled)`) || li.querySelector("button");
      requestAnimationFrame(() => again.focus());
    }
  });
  changed();
}

function valueOf(input) {
  const kind = input.dataset.kind;
  if (kind === "boolean") return input.checked;
  const raw = input.value.trim();
  if (raw === "") return undefined;
  if (kind === "number" || kind === "integer") {
    const number = Number(raw);
    return Number.isFinite(number) ? number : raw; // the API names what is wrong with it
  }
  if (kind === "json") {
    try {
      return JSON.parse(raw);
    } catch {
      return raw;
    }
  }
  return raw;
}

// The chain as the API's `samplers` field takes it.
export function chain() {
  return steps.map((step) => {
    const params = {};
    for (const [name, input] of Object.entries(step.inputs || {})) {
      const value = valueOf(input);
      if (value !== undefined) params[name] = value;
    }
    return { name: step.name, params };
  });
}

export function initChainEditor() {
  $("chain-add-name").addEventListener("change", describeChoice);
  $("chain-add").addEventListener("click", () => {
    const name = $("chain-add-name").value;
    if (!name) return;
    const step = addStep(name);
    const added = [...$("chain-steps").children].find((li) => li.dataset.id === String(step.id));
    const first = added && added.querySelector("input, select, textarea, button");
    if (first) first.focus();
  });
  $("chain-reset").addEventListener("click", () => setModelChain(modelChain, true));
}

// ---------------------------------------------------------------------------------------------
// The equivalent request.

function shellQuote(text) {
  return `'${text.replaceAll("'", "'\\''")}'`;
}

function py(value, indent = "") {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") return String(value);
  if (typeof value === "string") return JSON.stringify(value);
  const inner = `${indent}    `;
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    return `[\n${value.map((v) => inner + py(v, inner)).join(",\n")},\n${indent}]`;
  }
  const entries = Object.entries(value);
  if (!entries.length) return "{}";
  return `{\n${entries.map(([k, v]) => `${inner}${JSON.stringify(k)}: ${py(v, inner)}`).join(",\n")},\n${indent}}`;
}

// OpenAI's own parameters of each endpoint; everything else goes in the client's extra_body.
const OPENAI_FIELDS = {
  "/v1/chat/completions": ["model", "messages", "max_tokens", "seed", "stream", "stream_options", "logprobs", "top_logprobs", "n", "stop"],
  "/v1/completions": ["model", "prompt", "max_tokens", "seed", "stream", "stream_options", "logprobs", "n", "stop", "echo"],
};

let grpcPort = null; // the gateway's own gRPC port, from GET /v1/status (null: not known yet, or --port 0)

export function setGrpcPort(port) {
  grpcPort = port || null;
}

export function snippets(path, body) {
  const origin = window.location.origin;
  const auth = apiKey() ? ` \\\n  -H "Authorization: Bearer $MUESTRA_API_KEY"` : "";
  const curl = `curl -N ${origin}${path} \\\n  -H 'Content-Type: application/json'${auth} \\\n  -d ${shellQuote(JSON.stringify(body, null, 1))}`;

  const chat = path === "/v1/chat/completions";
  const own = OPENAI_FIELDS[path];
  const args = [];
  const extra = {};
  for (const [k, v] of Object.entries(body)) {
    if (own.includes(k)) args.push(`    ${k}=${py(v, "    ")},`);
    else extra[k] = v;
  }
  if (Object.keys(extra).length) args.push(`    extra_body=${py(extra, "    ")},`);
  const call = chat ? "client.chat.completions.create" : "client.completions.create";
  const piece = chat ? "chunk.choices[0].delta.content" : "chunk.choices[0].text";
  const python = [
    "import os",
    "from openai import OpenAI",
    "",
    `client = OpenAI(base_url="${origin}/v1", api_key=os.environ.get("MUESTRA_API_KEY", "none"))`,
    `stream = ${call}(`,
    ...args,
    ")",
    "for chunk in stream:",
    `    if chunk.choices:`,
    `        print(${piece} or "", end="", flush=True)`,
    "print()",
  ].join("\n");

  const request = { model: body.model || "" };
  if (chat) request.messages = { messages: body.messages.map((m) => ({ role: m.role, content: m.content })) };
  else request.prompt = body.prompt;
  if (body.max_tokens) request.max_tokens = body.max_tokens;
  if (body.seed !== undefined) request.seed = String(body.seed);
  if (body.samplers && body.samplers.length) request.samplers = body.samplers;
  if (body.ignore_eos) request.ignore_eos = true;
  if (body.logprobs) {
    request.logprobs = true;
    request.top_logprobs = chat ? body.top_logprobs || 0 : body.logprobs;
  }
  const grpcAuth = apiKey() ? ` \\\n  -H "authorization: Bearer $MUESTRA_API_KEY"` : "";
  // The gateway that served this page, on its gRPC port; unknown, the line says where to find it.
  const address = `${window.location.hostname}:${grpcPort ?? "GRPC_PORT"}`;
  const grpc = [
    ...(grpcPort ? [] : ["# GRPC_PORT: the gateway's gRPC port (its log says 'serving muestra.v1.Gateway on host:port')."]),
    `grpcurl -plaintext${grpcAuth} \\\n  -d ${shellQuote(JSON.stringify(request))} \\\n  ${address} muestra.v1.Gateway/Generate`,
  ].join("\n");
  return { curl, python, grpc, grpcRequest: request };
}
