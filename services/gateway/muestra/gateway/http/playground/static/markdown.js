// A chat answer as Markdown: marked parses it, DOMPurify keeps only inert HTML (model output never runs as
// script or styles the page), highlight.js colours code blocks. The vendored files' versions: docs/playground.md.

import "./vendor/purify.min.js"; // a UMD build: it sets globalThis.DOMPurify
import hljs from "./vendor/highlight/core.min.js";
import bash from "./vendor/highlight/bash.min.js";
import javascript from "./vendor/highlight/javascript.min.js";
import json from "./vendor/highlight/json.min.js";
import python from "./vendor/highlight/python.min.js";
import { Marked } from "./vendor/marked.esm.js";

const { DOMPurify } = globalThis;
const marked = new Marked({ gfm: true, async: false });
for (const [name, grammar] of Object.entries({ bash, javascript, json, python })) hljs.registerLanguage(name, grammar);
hljs.registerAliases(["sh", "shell", "console"], { languageName: "bash" });
hljs.registerAliases(["js"], { languageName: "javascript" });
hljs.registerAliases(["py"], { languageName: "python" });

const SANITIZE = {
  USE_PROFILES: { html: true },
  // No images: a model has none to show, and a src would make the page fetch whatever path the model wrote.
  FORBID_TAGS: ["img", "style", "form", "input", "button", "textarea", "select", "dialog"],
  FORBID_ATTR: ["style"],
  RETURN_DOM_FRAGMENT: true,
};

// A link in an answer opens in a new tab, so that following it keeps the conversation.
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

// The answer's text as sanitized HTML nodes; code blocks with a language highlight.js knows are coloured.
export function markdownFragment(text) {
  const fragment = DOMPurify.sanitize(marked.parse(text), SANITIZE);
  for (const code of fragment.querySelectorAll("pre > code")) {
    const language = (code.className.match(/(?:^|\s)language-([\w-]+)/) || [])[1];
    if (!language || !hljs.getLanguage(language)) continue;
    // highlight() escapes the code it is given: its output holds only its own spans.
    code.innerHTML = hljs.highlight(code.textContent, { language, ignoreIllegals: true }).value;
    code.classList.add("hljs");
  }
  return fragment;
}
