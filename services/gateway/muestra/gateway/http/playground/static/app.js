// The playground's entry: views, the API key, and what the page loads from the API at start.

import { describe, forgetApiKey, getJSON, onKeyNeeded, setApiKey } from "./api.js";
import { initImages, setSchedulers } from "./images.js";
import { initChainEditor, setGrpcPort, setModelChain, setSamplers } from "./samplers.js";
import { showStatus } from "./status.js";
import { initText, refreshEquivalent, setContextLength } from "./text.js";
import { clearError, element, showError } from "./ui.js";

const $ = (id) => document.getElementById(id);
const VIEWS = ["chat", "complete", "images", "status"];

function select(view, focus) {
  clearError(); // an error belongs to the view that caused it
  for (const name of VIEWS) {
    const on = name === view;
    const tab = $(`tab-${name}`);
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $(`view-${name}`).hidden = !on;
  }
  $("text-layout").hidden = !(view === "chat" || view === "complete");
  if (focus) $(`tab-${view}`).focus();
  showStatus(view === "status");
  if (view === "chat" || view === "complete") refreshEquivalent();
  if (window.location.hash !== `#${view}`) history.replaceState(null, "", `#${view}`);
}

function initTabs() {
  for (const name of VIEWS) {
    const tab = $(`tab-${name}`);
    tab.addEventListener("click", () => select(name));
    tab.addEventListener("keydown", (event) => {
      const at = VIEWS.indexOf(name);
      const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: VIEWS.length - 1 }[event.key];
      if (to === undefined) return;
      event.preventDefault();
      select(VIEWS[(to + VIEWS.length) % VIEWS.length], true);
    });
  }
  const start = window.location.hash.slice(1);
  select(VIEWS.includes(start) ? start : "chat");
}

function fill(selectId, names) {
  const chosen = $(selectId).value;
  $(selectId).replaceChildren(
    ...names.map((name) => {
      const option = element("option", name);
      option.value = name;
      return option;
    }),
  );
  if (names.includes(chosen)) $(selectId).value = chosen;
}

let keyRefused = false;
let textCards = new Map(); // text model id -> its /v1/models card

function showModel() {
  const card = textCards.get($("text-model").value);
  setModelChain(card ? card.default_samplers : []);
  setContextLength(card ? card.max_model_len : 0);
}

function askForKey(message) {
  keyRefused = true;
  $("key-why").textContent = `${message}. The page sends the key as the API does: Authorization: Bearer <key>.`;
  $("key-panel").hidden = false;
  $("key-input").focus();
}

async function load() {
  keyRefused = false;
  const [models, samplers, schedulers, status] = await Promise.allSettled([
    getJSON("/v1/models"),
    getJSON("/v1/samplers"),
    getJSON("/v1/schedulers"),
    getJSON("/v1/status"),
  ]);
  if (keyRefused) return;
  if (models.status === "fulfilled") {
    const cards = models.value.data;
    textCards = new Map(cards.filter((m) => m.kind === "text").map((m) => [m.id, m]));
    fill("text-model", [...textCards.keys()]);
    fill("image-model", cards.filter((m) => m.kind === "image").map((m) => m.id));
  }
  if (samplers.status === "fulfilled") setSamplers(samplers.value.data);
  if (status.status === "fulfilled") setGrpcPort(status.value.grpc_port);
  showModel();
  if (schedulers.status === "fulfilled") setSchedulers(schedulers.value.data);
  const failed = [models, samplers, schedulers].filter((r) => r.status === "rejected");
  if (failed.length) showError(`The gateway did not give what the page needs: ${describe(failed[0].reason)}`);
  else {
    clearError();
    $("key-panel").hidden = true;
  }
  refreshEquivalent();
}

function initKey() {
  onKeyNeeded(askForKey);
  $("key-open").addEventListener("click", () => {
    $("key-panel").hidden = !$("key-panel").hidden;
    if (!$("key-panel").hidden) $("key-input").focus();
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    setApiKey($("key-input").value.trim(), $("key-remember").checked);
    $("key-input").value = "";
    load();
  });
  $("key-forget").addEventListener("click", () => {
    forgetApiKey();
    $("key-input").value = "";
    load();
  });
  $("alert-close").addEventListener("click", clearError);
  $("text-model").addEventListener("change", showModel);
  // The user acting on a form (typing, choosing) is done with the last error.
  for (const form of ["chat-form", "complete-form", "image-form", "text-settings"]) $(form).addEventListener("input", clearError);
}

initTabs();
initKey();
initChainEditor();
initText();
initImages();
load();
