"""The diffusion service end to end against the bare diffusers pipeline called in-process.

    .venv/bin/python -m bench.diffusion [--threads 1] [--repeats N] [--models tiny,mid]

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

from tests.fixtures.diffusion_models import MID, TINY, RandomSDConfig, build_random_sd  # noqa: E402
from tests.harness import ServiceProcess  # noqa: E402

PROMPT = "a watercolor painting of a lighthouse at sunset"
SEED = 1234


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


def time_bare(pipe, case: Case, executor):
    return executor.submit(_time_bare, pipe, case).result()


def _time_bare(pipe, case: Case):
    import torch

    started = time.perf_counter()
    image = pipe(
        prompt=PROMPT,
        width=case.size,
        height=case.size,
        num_inference_steps=case.steps,
        generator=torch.Generator("cpu").manual_seed(SEED),
        output_type="pil",
    ).images[0]
    return time.perf_counter() - started, image


class _GatewayImages:
    """The gateway's GenerateImage under the name time_service calls."""

    def __init__(self, stub) -> None:
        self.Generate = stub.GenerateImage


def run_case(case: Case, cache_dir: Path, threads: int, repeats: int | None, via_gateway: bool = True) -> Row:
    import grpc
    import numpy as np
    import torch
    from diffusers import StableDiffusionPipeline

    from muestra.v1 import diffusion_pb2, diffusion_pb2_grpc, gateway_pb2_grpc
    from tests.diffusion.client import pixels

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
        request = diffusion_pb2.ImageRequest(
            prompt=PROMPT, width=case.size, height=case.size, steps=case.steps, seed=SEED
        )
        pipe = StableDiffusionPipeline.from_pretrained(
            folder, local_files_only=True, safety_checker=None, requires_safety_checker=False
        )
        pipe.set_progress_bar_config(disable=True)
        unet_params = sum(p.numel() for p in pipe.unet.parameters()) / 1e6
        # Warm-up on both sides (first calls allocate and pick kernels).
        _, png = time_service(stub, request)
        _, image = time_bare(pipe, case, executor)
        same = bool(np.array_equal(pixels(png), np.asarray(image)))
        bare, served = [], []
        for _ in range(repeats or case.repeats):
            served.append(time_service(stub, request)[0])
            bare.append(time_bare(pipe, case, executor)[0])
        return Row(case, unet_params, bare, served, same)
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
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".muestra" / "bench" / "diffusion")
    args = parser.parse_args()

    rows = [
        run_case(CASES[name], args.cache_dir, args.threads, args.repeats, via_gateway=not args.direct)
        for name in args.models.split(",")
    ]
    path = "diffusion service directly" if args.direct else "gateway -> diffusion service"
    print(f"\n{path}; torch threads: {args.threads}; interleaved calls, best and median; fixed prompt, seed\n")
    print(
        "| model | UNet | size | steps | calls | bare best (s) | service best (s) | service / bare (best) "
        "| bare median (s) | service median (s) | service / bare (median) | same pixels |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        print(
            f"| {row.case.name} | {row.unet_params_m:.1f}M | {row.case.size}x{row.case.size} | {row.case.steps} "
            f"| {len(row.bare_s)} | {min(row.bare_s):.3f} | {min(row.service_s):.3f} | {row.ratio:.3f}x "
            f"| {statistics.median(row.bare_s):.3f} | {statistics.median(row.service_s):.3f} "
            f"| {row.median_ratio:.3f}x | {'yes' if row.same_pixels else 'no'} |"
        )
    worst = max(row.ratio for row in rows)
    verdict = "met" if worst <= 1.10 else "MISSED"
    print(f"\ntarget: service <= 1.10x bare pipeline (best against best); worst {worst:.3f}x: {verdict}")


if __name__ == "__main__":
    main()
