"""The AUTOMATIC1111 API (/sdapi/v1/*) with a plain HTTP client: A1111's shapes, pixels equal bare diffusers."""

from __future__ import annotations

import base64
import io
import json
import re
import socket
import threading
import time

import httpx2 as httpx
import numpy as np
import pytest
from diffusers import DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler
from PIL import Image

from tests.diffusion.client import cancellations, next_cancellation
from tests.diffusion.test_img2img import encode, random_image, square_mask
from tests.fixtures.diffusion_models import generation_running

PROMPT = "a photo of a cat sitting on a red chair"

# Field names and JSON types of A1111's responses, from its API documentation (modules/api/models.py and
# Processed.js() in modules/processing.py). None stands for JSON null.
NUMBER = (int, float)
OPTIONAL_STR = (str, type(None))
GENERATION = {"images": list, "parameters": dict, "info": str}
INFO = {
    "prompt": str, "all_prompts": list, "negative_prompt": str, "all_negative_prompts": list, "seed": int,
    "all_seeds": list, "subseed": int, "all_subseeds": list, "subseed_strength": NUMBER, "width": int,
    "height": int, "sampler_name": str, "cfg_scale": (*NUMBER, type(None)), "steps": int, "batch_size": int,
    "restore_faces": bool, "face_restoration_model": OPTIONAL_STR, "sd_model_name": str,
    "sd_model_hash": OPTIONAL_STR, "sd_vae_name": OPTIONAL_STR, "sd_vae_hash": OPTIONAL_STR,
    "seed_resize_from_w": int, "seed_resize_from_h": int, "denoising_strength": (*NUMBER, type(None)),
    "extra_generation_params": dict, "index_of_first_image": int, "infotexts": list, "styles": list,
    "job_timestamp": str, "clip_skip": int, "is_using_inpainting_conditioning": bool, "version": str,
}  # fmt: skip
PROGRESS = {
    "progress": NUMBER,
    "eta_relative": NUMBER,
    "state": dict,
    "current_image": OPTIONAL_STR,
    "textinfo": OPTIONAL_STR,
}
PROGRESS_STATE = {
    "skipped": bool, "interrupted": bool, "job": str, "job_count": int, "job_timestamp": str, "job_no": int,
    "sampling_step": int, "sampling_steps": int,
}  # fmt: skip
SAMPLER = {"name": str, "aliases": list, "options": dict}
SD_MODEL = {
    "title": str,
    "model_name": str,
    "hash": OPTIONAL_STR,
    "sha256": OPTIONAL_STR,
    "filename": str,
    "config": OPTIONAL_STR,
}
LORA = {"name": str, "alias": str, "path": str, "metadata": dict}


def assert_shape(value: dict, shape: dict) -> None:
    assert set(shape) <= set(value), f"missing: {sorted(set(shape) - set(value))}"
    for key, kind in shape.items():
        assert isinstance(value[key], kind), f"{key}: {type(value[key]).__name__}, expected {kind}"


@pytest.fixture(scope="module")
def api(image_stack):
    with httpx.Client(base_url=image_stack.http_url, headers=image_stack.headers(), timeout=300) as client:
        yield client


def b64png(image: Image.Image) -> str:
    return base64.b64encode(encode(image)).decode()


def decode(text: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(text))).convert("RGB"))


def generation(response) -> tuple[list[np.ndarray], dict]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert_shape(body, GENERATION)
    info = json.loads(body["info"])
    assert_shape(info, INFO)
    return [decode(image) for image in body["images"]], info


@pytest.mark.parametrize(
    ("fields", "scheduler"),
    [
        ({"sampler_name": "Euler a"}, EulerAncestralDiscreteScheduler.from_config),
        (
            {"sampler_name": "DPM++ 2M", "scheduler": "Karras"},
            lambda config: DPMSolverMultistepScheduler.from_config(config, use_karras_sigmas=True),
        ),
    ],
)
def test_txt2img_maps_a1111_samplers_and_equals_bare_diffusers(fields, scheduler, api, reference_sd):
    body = {"prompt": PROMPT, "negative_prompt": "blurry", "seed": 9, "steps": 4, "cfg_scale": 6.0, "batch_size": 2}
    images, info = generation(api.post("/sdapi/v1/txt2img", json={**body, **fields, "width": 64, "height": 64}))
    assert info["all_seeds"] == [9, 10] and len(info["infotexts"]) == 2
    for seed, image in zip((9, 10), images, strict=True):
        expected = reference_sd.image(
            prompt=PROMPT, negative_prompt="blurry", seed=seed, steps=4, width=64, height=64, guidance_scale=6.0,
            scheduler=scheduler,
        )  # fmt: skip
        np.testing.assert_array_equal(image, expected)


def test_img2img_and_inpainting_equal_bare_diffusers(api, reference_edits):
    init, mask = random_image(seed=50), square_mask()
    body = {"prompt": PROMPT, "seed": 51, "steps": 5, "cfg_scale": 7.5, "init_images": [b64png(init)]}
    [edited], info = generation(api.post("/sdapi/v1/img2img", json={**body, "denoising_strength": 0.6}))
    expected = reference_edits.image(
        reference_edits.img2img, prompt=PROMPT, image=init, strength=0.6, num_inference_steps=5, seed=51
    )
    np.testing.assert_array_equal(edited, np.asarray(expected))
    assert info["denoising_strength"] == 0.6 and "Denoising strength: 0.6" in info["infotexts"][0]

    inpaint = {
        **body, "init_images": ["data:image/png;base64," + b64png(init)], "mask": b64png(mask), "mask_blur": 0,
        "inpaint_full_res": False, "denoising_strength": 0.8,
    }  # fmt: skip
    [painted], _ = generation(api.post("/sdapi/v1/img2img", json=inpaint))
    expected = reference_edits.image(
        reference_edits.inpaint, prompt=PROMPT, image=init, mask_image=mask, strength=0.8, num_inference_steps=5,
        seed=51, width=64, height=64,
    )  # fmt: skip
    np.testing.assert_array_equal(painted, np.asarray(expected))


def test_a1111s_inpainting_defaults_blur_4_and_only_the_masked_area(api):
    init, mask = random_image(seed=52), square_mask()
    body = {"prompt": PROMPT, "seed": 1, "steps": 4, "init_images": [b64png(init)], "mask": b64png(mask)}
    _, info = generation(api.post("/sdapi/v1/img2img", json=body))
    text = info["infotexts"][0]
    assert "Mask blur: 4" in text and "Inpaint area: Only masked, Masked area padding: 0" in text
    assert "Denoising strength: 0.75" in text
    # Left out of the request: the model's own, as the service used them.
    assert (info["steps"], info["cfg_scale"], info["sampler_name"]) == (4, 7.5, "Euler")


def test_listings_have_a1111s_shapes(api, image_stack):
    samplers = api.get("/sdapi/v1/samplers").json()
    for sampler in samplers:
        assert_shape(sampler, SAMPLER)
    by_name = {s["name"]: s for s in samplers}
    assert {"Euler a", "Euler", "DPM++ 2M", "DPM++ 2M Karras", "DDIM"} <= set(by_name)
    assert "euler_a" in by_name["Euler a"]["aliases"]
    [model] = api.get("/sdapi/v1/sd-models").json()
    assert_shape(model, SD_MODEL)
    assert model["model_name"] == "tiny-sd"
    [lora] = api.get("/sdapi/v1/loras").json()
    assert_shape(lora, LORA)
    assert (lora["name"], lora["path"]) == ("ink", "ink.safetensors")
    idle = api.get("/sdapi/v1/progress").json()
    assert_shape(idle, PROGRESS)
    assert_shape(idle["state"], PROGRESS_STATE)
    assert idle["state"]["job_count"] == 0 and idle["current_image"] is None


def test_a_lora_in_the_prompt_is_applied_and_written_back(api):
    body = {"prompt": PROMPT + " <lora:ink:0.7>", "seed": 3, "steps": 2, "width": 64, "height": 64}
    [with_lora], info = generation(api.post("/sdapi/v1/txt2img", json=body))
    [without], _ = generation(api.post("/sdapi/v1/txt2img", json={**body, "prompt": PROMPT}))
    assert not np.array_equal(with_lora, without)
    assert info["infotexts"][0].splitlines()[0] == PROMPT + " <lora:ink:0.7>"


@pytest.mark.parametrize(
    ("path", "body", "status", "detail"),
    [
        ("txt2img", {"sampler_name": "Euler z"}, 404, "Sampler not found: 'Euler z'; known: Euler, Euler a,"),
        ("txt2img", {"sampler_name": "Euler", "scheduler": "Exponential"}, 404, "Scheduler not found"),
        ("txt2img", {"enable_hr": True}, 400, "enable_hr: muestra has no hires fix"),
        ("txt2img", {"width": 65}, 400, "width: must be a multiple of 8"),
        ("txt2img", {"override_settings": {"CLIP_stop_at_last_layers": 2}}, 400, "override_settings: only"),
        ("img2img", {"init_images": ["@@@"]}, 400, "init_images[0]: not valid base64"),
        (
            "img2img",
            {"init_images": [base64.b64encode(b"GIF89a").decode()]},
            400,
            "init_images[0] (init_image): is not",
        ),
        ("img2img", {"denoising_strength": 1.5}, 400, "denoising_strength (strength): must be in (0, 1]"),
        ("img2img", {"mask": b64png(square_mask(64, 72))}, 400, "mask (mask_image): is 64x72"),
        ("img2img", {"resize_mode": 2}, 400, "resize_mode: only 0"),
        ("img2img", {"prompt": "<lora:nope>"}, 400, "prompt: unknown LoRA 'nope'; known: ink"),
    ],
)
def test_bad_requests_answer_as_a1111_does_with_a_detail_while_another_runs(
    path, body, status, detail, api, image_stack
):
    base = {"prompt": "a cat", "steps": 2}
    if path == "img2img":
        base["init_images"] = [b64png(random_image())]
    with generation_running(image_stack.diffusion.address) as running:
        started = time.monotonic()
        response = api.post(f"/sdapi/v1/{path}", json={**base, **body})
        assert time.monotonic() - started < 10  # answered at once, not after the running generation
        assert next(running).WhichOneof("kind") == "progress"
    assert response.status_code == status, response.text
    assert response.json()["detail"].startswith(detail), response.json()


def test_a_body_that_does_not_validate_is_422_with_fastapis_list(api):
    response = api.post("/sdapi/v1/img2img", json={"prompt": "a cat", "steps": "many"})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert {tuple(error["loc"]) for error in detail} == {("body", "steps"), ("body", "init_images")}
    assert all({"loc", "msg", "type"} <= set(error) for error in detail)


def test_progress_counts_up_during_a_job_and_interrupt_stops_it_within_a_step(api, image_stack):
    result = {}

    def run() -> None:
        body = {"prompt": "a long run", "seed": 1, "steps": 150, "width": 256, "height": 256}
        result["response"] = api.post("/sdapi/v1/txt2img", json=body)

    worker = threading.Thread(target=run)
    worker.start()
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (len(seen) < 2 or seen[-1]["state"]["sampling_step"] < 3):
        progress = api.get("/sdapi/v1/progress").json()
        if progress["state"]["sampling_step"] and (not seen or progress != seen[-1]):
            seen.append(progress)
        time.sleep(0.05)
    steps = [p["state"]["sampling_step"] for p in seen]
    assert steps == sorted(steps) and steps[-1] > steps[0], steps
    last = seen[-1]
    assert_shape(last, PROGRESS)
    assert last["state"]["sampling_steps"] == 150 and last["state"]["job_count"] == 1
    assert 0 < last["progress"] < 1 and last["eta_relative"] > 0
    assert Image.open(io.BytesIO(base64.b64decode(last["current_image"]))).size == (32, 32)

    seen = len(cancellations(image_stack.diffusion.process))
    assert api.post("/sdapi/v1/interrupt").json() == {}
    worker.join(timeout=60)
    assert not worker.is_alive()
    images, info = generation(result["response"])
    assert images == [] and info["interrupted"] is True
    cancelled_at, stopped_after, total = next_cancellation(image_stack.diffusion.process, seen)
    assert stopped_after - cancelled_at <= 1 and total == 150
    assert api.get("/sdapi/v1/progress").json()["state"]["job_count"] == 0


def test_the_routes_count_under_their_own_metric_labels(api):
    api.get("/sdapi/v1/samplers")
    api.get("/sdapi/v1/progress")
    api.post("/sdapi/v1/txt2img", json={"prompt": "a cat", "steps": 1})
    api.post("/sdapi/v1/img2img", json={"prompt": "a cat"})  # 422: no init_images
    paths = set(re.findall(r'muestra_http_requests_total\{path="([^"]*)"', api.get("/metrics").text))
    assert {"/sdapi/v1/samplers", "/sdapi/v1/txt2img", "/sdapi/v1/img2img", "/sdapi/v1/progress"} <= paths


def test_options_name_the_model_and_set_it_for_the_a1111_routes(api):
    assert api.get("/sdapi/v1/options").json() == {"sd_model_checkpoint": "tiny-sd"}
    assert api.post("/sdapi/v1/options", json={"sd_model_checkpoint": "tiny-sd"}).status_code == 200
    unknown = api.post("/sdapi/v1/options", json={"sd_model_checkpoint": "sdxl-turbo"})
    assert unknown.status_code == 404 and unknown.json()["detail"].startswith("Model not found: ")
    other = api.post("/sdapi/v1/options", json={"CLIP_stop_at_last_layers": 2})
    assert other.status_code == 400
    assert other.json()["detail"] == "CLIP_stop_at_last_layers: only sd_model_checkpoint can be set here"
    assert api.post("/sdapi/v1/options", json=[1]).status_code == 422
    schedulers = api.get("/sdapi/v1/schedulers").json()
    assert [s["label"] for s in schedulers] == ["Automatic", "Karras"]
    assert all({"name", "label", "aliases", "default_rho", "need_inner_model"} <= set(s) for s in schedulers)


@pytest.mark.parametrize(
    ("method", "path", "status", "detail", "allow"),
    [
        ("POST", "/sdapi/v1/create/embedding", 404, "Not Found", None),
        ("GET", "/sdapi/v2/txt2img", 404, "Not Found", None),
        ("GET", "/sdapi/v1/txt2img", 405, "Method Not Allowed", "POST"),
        ("DELETE", "/sdapi/v1/memory", 405, "Method Not Allowed", "GET"),
    ],
)
def test_every_sdapi_route_it_does_not_serve_answers_in_a1111s_shape(method, path, status, detail, allow, api):
    response = api.request(method, path)
    assert (response.status_code, response.json()) == (status, {"detail": detail})
    assert response.headers.get("allow") == allow


def test_png_info_without_an_image_is_422_and_with_a_non_image_400(api):
    missing = api.post("/sdapi/v1/png-info", json={})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "image"]
    garbage = api.post("/sdapi/v1/png-info", json={"image": base64.b64encode(b"GIF89a").decode()})
    assert garbage.status_code == 400 and garbage.json() == {"detail": "image: not a PNG, JPEG or WebP image"}


def test_left_out_fields_are_echoed_in_parameters_as_used(api):
    body = api.post("/sdapi/v1/txt2img", json={"prompt": "a cat", "seed": 4}).json()
    parameters = body["parameters"]
    used = {key: parameters[key] for key in ("width", "height", "steps", "cfg_scale", "seed", "sampler_name")}
    assert used == {"width": 64, "height": 64, "steps": 50, "cfg_scale": 7.5, "seed": 4, "sampler_name": "Euler"}
    assert parameters["scheduler"] == "automatic"


def test_the_edges_refusals_on_sdapi_are_a1111s_detail_too(image_stack):
    """The key check and the declared-size check answer before any route runs: on /sdapi they speak A1111 too."""
    with httpx.Client(base_url=image_stack.http_url, timeout=60) as bare:
        missing = bare.get("/sdapi/v1/sd-models")
        wrong = bare.get("/sdapi/v1/sd-models", headers={"Authorization": "Bearer nope"})
        openai_route = bare.get("/v1/models")
    for reply in (missing, wrong):
        assert reply.status_code == 401 and set(reply.json()) == {"detail"}, reply.text
    assert "API key" in missing.json()["detail"]
    assert set(openai_route.json()) == {"error"}  # OpenAI's routes keep OpenAI's shape
    # A body declared over the limit is refused from its headers alone (a raw socket: clients check the length).
    host, port = image_stack.http_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            b"POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {image_stack.api_key}\r\nContent-Length: 999999999\r\n\r\n".encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and "over the limit" in json.loads(body)["detail"], answer[:300]
