// What every view shares: the message line for errors (in words, never only in the console).

const $ = (id) => document.getElementById(id);

export function showError(text) {
  $("alert-text").textContent = text;
  $("alert").hidden = false;
}

export function clearError() {
  $("alert").hidden = true;
  $("alert-text").textContent = "";
}

export function element(tag, text, className) {
  const el = document.createElement(tag);
  if (text !== undefined && text !== null) el.textContent = text;
  if (className) el.className = className;
  return el;
}
