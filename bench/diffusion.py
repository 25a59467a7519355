"""The diffusion service end to end against the bare diffusers pipeline called in-process.

    .venv/bin/python -m bench.diffusion [--threads 1] [--repeats N] [--models tiny,mid] [--tasks img2img,...]
    .venv/bin/python -m bench.diffusion --lora-switch [--models mid]

Both sides run the same random model folder, prompt, seed, size, steps and scheduler, with the same number
of torch threads, one after the other (interleaved, so background load hits both alike). The service time is
a whole Generate call from the client's side: queueing, text encoding, denoising, VAE decode, PNG encoding,
progress messages and gRPC. The bare time is `pipe(...)` returning a PIL image.

The bare pipeline runs on a worker thread of this process, as it does in the service. This matters on a busy
machine: with torch's OpenMP pool on the main thread only, libgomp counts no more threads than cores and
spin-waits at every barrier, which on an oversubscribed 2-core box made the same call 10-30x slower.

Models (built from configs on first use, cached under --cache-dir):
  tiny  the test suite's tiny Stable Diffusion (UNet ~1M parameters), 64x64
  mid   a ~67M-parameter UNet, 256x256

Tasks: txt2img; img2img from a fixed random image at strength 0.6 (int(steps * 0.6) steps run); inpaint of
the middle quarter of that image at strength 0.75. The bare side is StableDiffusionImg2ImgPipeline /
StableDiffusionInpaintPipeline on the same components.

--lora-switch times requests through the service with no adapter, with one adapter every time, and with two
adapters taking turns (both stay loaded: a switch is set_adapters, not a reload), plus the first request that
loads an adapter; the figures are per request, best of --repeats.

With --via-gateway (the default), the client calls the gateway's GenerateImage, which forwards to the
diffusion service, so the service time includes both hops; --direct measures the diffusion service alone.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.builders.diffusion_models import MID, TINY, RandomSDConfig, build_random_lora, build_random_sd  # noqa: E402
from muestra.cli.launch import ServiceProcess  # noqa: E402

PROMPT = "a watercolor painting of a lighthouse at sunset"
SEED = 1234
TASKS = ("txt2img", "img2img", "inpaint")
STRENGTHS = {"img2img": 0.6, "inpaint": 0.75}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    config: RandomSDConfig
    size: int
    steps: int
    # Timed calls per side; the tiny model's calls are short and noisier on a shared machine, so it gets more.
    repeats: int


CASES = {
    "tiny": Case("tiny", TINY, 64, 20, repeats=21),
    "mid": Case("mid", MID, 256, 10, repeats=5),
}


@dataclasses.dataclass
class Row:
    case: Case
    task: str
    unet_params_m: float
    bare_s: list[float]
    service_s: list[float]
    same_pixels: bool

    @property
    def ratio(self) -> float:
        """Best against best: the least load-sensitive figure on a shared machine."""
        return min(self.service_s) / min(self.bare_s)

    @property
    def median_ratio(self) -> float:
        return statistics.median(self.service_s) / statistics.median(self.bare_s)


def time_service(stub, request) -> tuple[float, bytes]:
    """Seconds for one whole Generate call, and the PNG it returned."""
    started = time.perf_counter()
    png = b""
    for response in stub.Generate(request, timeout=3600):
        if response.WhichOneof("kind") == "image":
            png = response.image.png
    return time.perf_counter() - started, png


def time_bare(pipe, call: dict, executor):
    return executor.submit(_time_bare, pipe, call).result()


def _time_bare(pipe, call: dict):
    import torch

    started = time.perf_counter()
    image = pipe(**call, generator=torch.Generator("cpu").manual_seed(SEED), output_type="pil").images[0]
    return time.perf_counter() - started, image


def task_inputs(size: int):
    """The init image (random pixels, fixed seed) and the mask (the middle quarter repainted)."""
    import numpy as np
    from PIL import Image

    init = Image.fromarray(np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8))
    mask = Image.new("L", (size, size), 0)
    mask.paste(255, (size // 4, size // 4, 3 * size // 4, 3 * size // 4))
    return init, mask


def png_bytes(image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def pixels(png: bytes):
    """A PNG's RGB pixels, uint8 [height, width, 3]."""
    import io

    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def task_calls(case: Case, task: str, pipes: dict):
    """The ImageRequest fields and the bare pipeline with its call, for one task."""
    init, mask = task_inputs(case.size)
    fields = {"prompt": PROMPT, "width": case.size, "height": case.size, "steps": case.steps, "seed": SEED}
    call = {"prompt": PROMPT, "num_inference_steps": case.steps}
    if task == "txt2img":
        return fields, pipes["txt2img"], {**call, "width": case.size, "height": case.size}
    fields.update(init_image=png_bytes(init), strength=STRENGTHS[task])
    call.update(image=init, strength=STRENGTHS[task])
    if task == "img2img":
        return fields, pipes["img2img"], call
    fields.update(mask_image=png_bytes(mask))
    return fields, pipes["inpaint"], {**call, "mask_image": mask, "width": case.size, "height": case.size}


class _GatewayImages:
    """The gateway's GenerateImage under the name time_service calls."""

    def __init__(self, stub) -> None:
        self.Generate = stub.GenerateImage


def run_case(
    case: Case, cache_dir: Path, threads: int, repeats: int | None, via_gateway: bool = True, tasks=TASKS
) -> list[Row]:
    import grpc
    import numpy as np
    import torch
    from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionInpaintPipeline, StableDiffusionPipeline

    from muestra.v1 import diffusion_pb2, diffusion_pb2_grpc, gateway_pb2_grpc

    folder = build_random_sd(cache_dir / case.name, case.config)
    (cache_dir / "logs").mkdir(parents=True, exist_ok=True)
    service = ServiceProcess("diffusion", ["--model", str(folder), "--torch-threads", str(threads)], cache_dir / "logs")
    gateway = None
    if via_gateway:
        gateway_args = ["--lm-addr=", "--diffusion-addr", service.address, "--http-port", "-1"]
        gateway = ServiceProcess("gateway", gateway_args, cache_dir / "logs")
    torch.set_num_threads(threads)
    executor = concurrent.futures.ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(threads,))
    try:
        if gateway is not None:
            stub = _GatewayImages(gateway_pb2_grpc.GatewayStub(grpc.insecure_channel(gateway.address)))
        else:
            stub = diffusion_pb2_grpc.DiffusionStub(grpc.insecure_channel(service.address))
        pipe = StableDiffusionPipeline.from_pretrained(
            folder, local_files_only=True, safety_checker=None, requires_safety_checker=False
        )
        components = {k: v for k, v in pipe.components.items() if k != "image_encoder"}
        pipes = {
            "txt2img": pipe,
            "img2img": StableDiffusionImg2ImgPipeline(**components),
            "inpaint": StableDiffusionInpaintPipeline(**components),
        }
        for each in pipes.values():
            each.set_progress_bar_config(disable=True)
        unet_params = sum(p.numel() for p in pipe.unet.parameters()) / 1e6
        rows = []
        for task in tasks:
            fields, bare_pipe, call = task_calls(case, task, pipes)
            request = diffusion_pb2.ImageRequest(**fields)
            # Warm-up on both sides (first calls allocate and pick kernels).
            _, png = time_service(stub, request)
            _, image = time_bare(bare_pipe, call, executor)
            same = bool(np.array_equal(pixels(png), np.asarray(image)))
            bare, served = [], []
            for _ in range(repeats or case.repeats):
                served.append(time_service(stub, request)[0])
                bare.append(time_bare(bare_pipe, call, executor)[0])
            rows.append(Row(case, task, unet_params, bare, served, same))
        return rows
    finally:
        executor.shutdown()
        if gateway is not None:
            gateway.stop()
        service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,mid", help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--threads", type=int, default=1, help="torch threads, service and baseline alike")
    parser.add_argument("--repeats", type=int, help="timed calls per side after a warm-up (default: 21 tiny, 5 mid)")
    parser.add_argument("--direct", action="store_true", help="call the diffusion service, not the gateway")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated: " + ", ".join(TASKS))
    parser.add_argument("--lora-switch", action="store_true", help="time LoRA adapters instead (service only)")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".muestra" / "bench" / "diffusion")
    args = parser.parse_args()

    if args.lora_switch:
        for name in args.models.split(","):
            lora_switch(CASES[name], args.cache_dir, args.threads, args.repeats or 5)
        return
    tasks = tuple(args.tasks.split(","))
    rows = [
        row
        for name in args.models.split(",")
        for row in run_case(CASES[name], args.cache_dir, args.threads, args.repeats, not args.direct, tasks)
    ]
    path = "diffusion service directly" if args.direct else "gateway -> diffusion service"
    print(f"\n{path}; torch threads: {args.threads}; interleaved calls, best and median; fixed prompt, seed\n")
    print(
        "| model | task | UNet | size | steps | calls | bare best (s) | service best (s) | service / bare (best) "
        "| bare median (s) | service median (s) | service / bare (median) | same pixels |"
    )
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        print(
            f"| {row.case.name} | {row.task} | {row.unet_params_m:.1f}M | {row.case.size}x{row.case.size} "
            f"| {row.case.steps} "
            f"| {len(row.bare_s)} | {min(row.bare_s):.3f} | {min(row.service_s):.3f} | {row.ratio:.3f}x "
            f"| {statistics.median(row.bare_s):.3f} | {statistics.median(row.service_s):.3f} "
            f"| {row.median_ratio:.3f}x | {'yes' if row.same_pixels else 'no'} |"
        )
    worst = max(row.ratio for row in rows)
    verdict = "met" if worst <= 1.10 else "MISSED"
    print(f"\ntarget: service <= 1.10x bare pipeline (best against best); worst {worst:.3f}x: {verdict}")


def lora_switch(case: Case, cache_dir: Path, threads: int, repeats: int) -> None:
    """Per-request seconds through the diffusion service: no adapter, one adapter, two taking turns."""
    import grpc

    from muestra.v1 import diffusion_pb2, diffusion_pb2_grpc

    folder = build_random_sd(cache_dir / case.name, case.config)
    loras = cache_dir / f"{case.name}-loras"
    for name, seed in (("a", 1), ("b", 2)):
        if not (loras / f"{name}.safetensors").exists():
            build_random_lora(loras, folder, name, seed=seed)
    (cache_dir / "logs").mkdir(parents=True, exist_ok=True)
    args = ["--model", str(folder), "--torch-threads", str(threads), "--lora-dir", str(loras)]
    service = ServiceProcess("diffusion", args, cache_dir / "logs")
    try:
        stub = diffusion_pb2_grpc.DiffusionStub(grpc.insecure_channel(service.address))

        def timed(*names: str) -> float:
            loras = [diffusion_pb2.LoraWeight(name=name, weight=0.8) for name in names]
            request = diffusion_pb2.ImageRequest(
                prompt=PROMPT, width=case.size, height=case.size, steps=case.steps, seed=SEED, loras=loras
            )
            return time_service(stub, request)[0]

        timed()  # warm-up
        first_load = timed("a")
        base, same, turns = [], [], []
        for i in range(repeats):
            base.append(timed())
            same.append(timed("a"))
            turns.append(timed("b" if i % 2 == 0 else "a"))
    finally:
        service.stop()
    print(f"\nLoRA adapters on {case.name} ({case.size}x{case.size}, {case.steps} steps), best of {repeats}:\n")
    print("| requests | seconds per request | over no adapter |")
    print("|---|---:|---:|")
    for label, seconds in (
        ("no adapter", min(base)),
        ("the same adapter every time", min(same)),
        ("two adapters taking turns (a switch each request)", min(turns)),
        ("the first request with an adapter (loads it)", first_load),
    ):
        print(f"| {label} | {seconds:.3f} | {seconds - min(base):+.3f} |")
    print(f"\nswitch cost: {min(turns) - min(same):+.3f} s per request (turns against the same adapter)")


if __name__ == "__main__":
    main()
