// Images: the form, the live previews the diffusion service streams, and a gallery whose parameters
// (the PNG's A1111-style text) load back into the form.

import { describe, nextSeed, postStream } from "./api.js";
import { clearError, element, showError } from "./ui.js";

const $ = (id) => document.getElementById(id);
let controller = null;

function number(id) {
  const raw = $(id).value.trim();
  return raw === "" ? undefined : Number(raw);
}

export function imageBody() {
  const seed = nextSeed($("image-seed"), $("image-same-seed").checked);
  const body = {
    model: $("image-model").value || "",
    prompt: $("image-prompt").value,
    n: number("image-n") ?? 1,
    response_format: "b64_json",
    stream: true,
    seed,
  };
  const negative = $("image-negative").value;
  if (negative) body.negative_prompt = negative;
  const width = number("image-width");
  const height = number("image-height");
  if (width !== undefined || height !== undefined) body.size = `${width ?? height}x${height ?? width}`;
  const steps = number("image-steps");
  if (steps !== undefined) body.steps = steps;
  const guidance = number("image-guidance");
  if (guidance !== undefined) body.guidance_scale = guidance;
  if ($("image-scheduler").value) body.sampler = $("image-scheduler").value;
  // About ten previews per image whatever the step count (each is a small PNG of the latents).
  body.preview_every = Math.max(1, Math.round((steps || 20) / 10));
  return body;
}

// A1111's "parameters" text: the prompt, "Negative prompt: …", then "Key: value, Key: value".
export function parseParameters(text) {
  const lines = text.split("\n");
  const last = lines.pop() || "";
  const pairs = {};
  const pattern = /\s*([^:,]+):\s*("(?:\\.|[^"\\])*"|[^,]*)\s*(?:,|$)/gy;
  let match;
  while ((match = pattern.exec(last)) !== null && match[0]) {
    let value = match[2].trim();
    if (value.startsWith("\"")) {
      try {
        value = JSON.parse(value);
      } catch {
        // keep it quoted
      }
    }
    pairs[match[1].trim()] = value;
  }
  const negativeAt = lines.findIndex((line) => line.startsWith("Negative prompt: "));
  let negative = "";
  if (negativeAt >= 0) {
    negative = lines.slice(negativeAt).join("\n").slice("Negative prompt: ".length);
    lines.length = negativeAt;
  }
  return { prompt: lines.join("\n"), negative, pairs };
}

function loadParameters(text) {
  const { prompt, negative, pairs } = parseParameters(text);
  $("image-prompt").value = prompt;
  $("image-negative").value = negative;
  if (pairs.Steps) $("image-steps").value = pairs.Steps;
  if (pairs["CFG scale"]) $("image-guidance").value = pairs["CFG scale"];
  if (pairs.Seed) {
    $("image-seed").value = pairs.Seed;
    $("image-same-seed").checked = true;
  }
  if (pairs.Size) {
    const [w, h] = pairs.Size.split("x");
    $("image-width").value = w;
    $("image-height").value = h;
  }
  if (pairs.Sampler) {
    const known = [...$("image-scheduler").options].map((o) => o.value);
    $("image-scheduler").value = known.includes(pairs.Sampler) ? pairs.Sampler : "";
  }
  if (pairs.Model) {
    const known = [...$("image-model").options].map((o) => o.value);
    if (known.includes(pairs.Model)) $("image-model").value = pairs.Model;
  }
  $("image-n").value = "1";
  $("image-prompt").focus();
}

// A batch's images in order (image 1 first), the newest batch above the older ones.
function addToGallery(event, after) {
  const url = `data:image/png;base64,${event.b64_json}`;
  const figure = element("figure");
  const img = element("img");
  img.src = url;
  img.alt = `Image made from: ${(event.parameters || "").split("\n")[0] || "the prompt"}`;
  img.dataset.seed = String(event.seed ?? "");
  const caption = element("figcaption");
  const text = element("pre", event.parameters || `seed ${event.seed}`);
  const buttons = element("div", null, "buttons");
  const load = element("button", "Use these parameters");
  load.type = "button";
  load.addEventListener("click", () => loadParameters(event.parameters || ""));
  const save = element("a", "Download PNG");
  save.href = url;
  save.download = `muestra-${event.seed ?? "image"}.png`;
  buttons.append(load, save);
  caption.append(text, buttons);
  figure.append(img, caption);
  if (after) after.after(figure);
  else $("gallery").prepend(figure);
  $("gallery-empty").hidden = true;
  return figure;
}

// The bar and its label both count the whole batch's steps: "Step 37 of 80 · image 2 of 4".
function progress(event, images) {
  const total = event.total || 1;
  const index = event.image_index ?? 0;
  const done = index * total + (event.step || 0);
  $("image-progress").max = total * images;
  $("image-progress").value = done;
  const which = images > 1 ? ` · image ${index + 1} of ${images}` : "";
  $("image-progress-label").textContent = `Step ${done} of ${total * images}${which}`;
}

async function generate(event) {
  event.preventDefault();
  if (controller) return;
  if (!$("image-prompt").value.trim()) {
    showError("Write a prompt first.");
    $("image-prompt").focus();
    return;
  }
  clearError();
  const body = imageBody();
  controller = new AbortController();
  $("image-generate").disabled = true;
  $("image-stop").disabled = false;
  $("image-progress").value = 0;
  $("image-progress-label").textContent = "Waiting for the diffusion service…";
  const preview = $("image-preview");
  let done = 0;
  let last = null; // this batch's latest figure in the gallery
  try {
    await postStream(
      "/v1/images/generations",
      body,
      (e) => {
        if (e.type === "image_generation.partial_image") {
          progress(e, body.n);
          preview.src = `data:image/png;base64,${e.b64_json}`;
          preview.hidden = false;
        } else if (e.type === "muestra.image_generation.progress") {
          progress(e, body.n);
        } else if (e.type === "image_generation.completed") {
          done += 1;
          last = addToGallery(e, last);
        }
      },
      controller.signal,
    );
    $("image-progress-label").textContent = `Done: ${done} image${done === 1 ? "" : "s"}, seed ${body.seed}`;
    $("image-progress").value = $("image-progress").max;
  } catch (error) {
    if (error.name === "AbortError") {
      $("image-progress-label").textContent = `Stopped by you after ${done} image${done === 1 ? "" : "s"}`;
    } else {
      showError(describe(error));
      $("image-progress-label").textContent = `Error: ${describe(error)}`;
    }
  } finally {
    controller = null;
    preview.hidden = true;
    $("image-generate").disabled = false;
    $("image-stop").disabled = true;
  }
}

export function setSchedulers(listing) {
  const select = $("image-scheduler");
  const first = element("option", "the model's own");
  first.value = "";
  select.replaceChildren(
    first,
    ...listing.map((s) => {
      const option = element("option", s.name);
      option.value = s.name;
      return option;
    }),
  );
}

export function initImages() {
  $("image-form").addEventListener("submit", generate);
  $("image-stop").addEventListener("click", () => controller && controller.abort());
}
