// Status: models, replicas and their health, the prefix cache's hit rate, requests running and waiting.

import { describe, getJSON } from "./api.js";
import { element } from "./ui.js";

const $ = (id) => document.getElementById(id);
let timer = null;

function cell(row, text, className) {
  row.append(element("td", text, className));
}

function render(status) {
  const cache = status.prefix_cache || {};
  const rate =
    !cache.enabled
      ? "prefix cache off"
      : cache.hit_rate === null || cache.hit_rate === undefined
        ? "prefix cache on, no prompts yet"
        : `prefix cache: ${(cache.hit_rate * 100).toFixed(1)}% of prompt tokens from the cache (${cache.hit_tokens} of ${cache.query_tokens})`;
  const requests = status.requests || {};
  $("status-summary").textContent = [
    `requests running ${requests.running ?? 0}, waiting ${requests.waiting ?? 0}`,
    rate,
    status.uptime_s !== undefined ? `up ${Math.round(status.uptime_s)} s` : null,
  ]
    .filter(Boolean)
    .join(" · ");
  const blocks = (status.models || []).map((model) => {
    const box = element("div");
    const title = element("h3", `${model.name} (${model.kind})`);
    box.append(title);
    if (model.context_length) box.append(element("p", `context ${model.context_length} tokens`, "stats"));
    const wrap = element("div", null, "table-wrap");
    const table = element("table");
    const caption = element("caption", `Replicas of ${model.name}`, "visually-hidden");
    const head = element("tr");
    const text = model.kind === "text";
    for (const name of ["Replica", "Health", ...(text ? ["Running", "Waiting", "Rows"] : [])]) {
      const th = element("th", name);
      th.scope = "col";
      head.append(th);
    }
    const thead = element("thead");
    thead.append(head);
    const tbody = element("tbody");
    for (const replica of model.replicas || []) {
      const row = element("tr");
      cell(row, replica.address);
      cell(row, replica.healthy ? "healthy" : "not answering", replica.healthy ? "ok" : "bad");
      if (text) {
        cell(row, String(replica.requests_running ?? 0));
        cell(row, String(replica.requests_waiting ?? 0));
        cell(row, String(replica.rows_running ?? 0));
      }
      tbody.append(row);
    }
    table.append(caption, thead, tbody);
    wrap.append(table);
    box.append(wrap);
    return box;
  });
  $("status-models").replaceChildren(...blocks);
}

async function refresh() {
  try {
    render(await getJSON("/v1/status"));
  } catch (error) {
    $("status-summary").textContent = `Status unavailable: ${describe(error)}`;
  }
}

export function showStatus(visible) {
  clearInterval(timer);
  timer = null;
  if (!visible) return;
  refresh();
  timer = setInterval(refresh, 2000);
}
