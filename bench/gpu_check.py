"""The GPU check: what bench/gpu_check.sh runs once its venv is ready. It refuses to run on CPU.

    bench/gpu_check.sh                       # on a machine with an NVIDIA GPU; under 8 minutes

It prints, in one run:
1. the execution providers onnxruntime offers and the ones each session actually uses, and the
   devices (nvidia-smi, torch);
2. lm decode tokens/s over gRPC at batch 1, 8 and 32 for the bench's 124M models exported in
   float16 (fused layout: one KV buffer per layer kept on the device as CUDA OrtValues, bound as
   both past and present), beside a bare onnxruntime CUDA loop over the same graph;
3. whether the tiny text fixture's greedy tokens on CUDA equal the CPU run's, prompt by prompt;
4. the diffusion service on CUDA in float16 against the same service on CPU in float32, for the
   same seed (the noise comes from a CPU generator): the mean and largest pixel difference and
   the PSNR, against the tolerance stated below.

It exits 1 when a check fails and 2 when there is no GPU to check (never a silent CPU run).
`--cpu-dry-run` runs the same code with the CPU in the GPU's place, to test the script itself on
a machine without one (`--models llama-tiny` keeps it short); it says so and exits 3.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402

BATCHES = (1, 8, 32)
MODELS = ("gpt2-124m", "llama-100m")
PROMPT_TOKENS = 64
# fp16 on the GPU against fp32 on the CPU, the same seed and noise: at least this PSNR (dB).
IMAGE_MIN_PSNR_DB = 30.0
# The device checked (the dry run swaps in the CPU) and its diffusion dtype.
GPU = {"lm": "cuda", "diffusion": "cuda", "dtype": "float16"}
GREEDY_PROMPTS = ("Once upon a time", "The capital of", "def main():", "En un lugar de la Mancha")


def fail(message: str, code: int = 1) -> None:
    print(f"gpu_check: FAIL: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def providers_and_devices() -> dict:
    import onnxruntime as ort
    import torch

    available = ort.get_available_providers()
    print(f"onnxruntime {ort.__version__} ({ort.get_device()}): providers available {available}")
    if "CUDAExecutionProvider" not in available:
        fail("onnxruntime offers no CUDAExecutionProvider (is onnxruntime-gpu installed, not onnxruntime?)", 2)
    smi = shutil.which("nvidia-smi")
    gpus = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip() if smi else ""
    print(f"nvidia-smi: {gpus or 'none'}")
    if not torch.cuda.is_available():
        fail(f"torch {torch.__version__} sees no CUDA device (a CPU wheel?)", 2)
    print(f"torch {torch.__version__}: {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}")
    return {"onnxruntime": ort.__version__, "available": available, "gpus": gpus}


def lm_decode(args, log_dir: Path) -> list[dict]:
    """Decode tokens/s at each batch: the lm over gRPC on CUDA against a bare CUDA loop."""
    from bench import decode_models
    from bench.decode import fastest_chunks
    from bench.decode_loops import ServiceLoop, SharedBufferLoop

    rows = []
    for name in args.models.split(","):
        hf_dir, onnx_dir = decode_models.build(name, "fused", dtype="float16")
        vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
        prompt = np.random.default_rng(0).integers(3, vocab, (1, PROMPT_TOKENS))
        service = ServiceLoop(onnx_dir, 0, log_dir, providers=GPU["lm"])
        try:
            in_use = [line for line in service.process.log_path.read_text().splitlines() if "providers in use" in line]
            print(f"{name} lm: {in_use[-1].split('onnxruntime ')[-1] if in_use else 'providers not logged'}")
            loops = {"lm": service, "bare": SharedBufferLoop(onnx_dir, 0, device=GPU["lm"])}
            print(f"{name} bare loop: {loops['bare'].session.get_providers()}")
            for batch in BATCHES:
                seconds = fastest_chunks(loops, np.repeat(prompt, batch, 0), args.chunk, args.repeats)
                tokens = {k: batch * args.chunk / s for k, s in seconds.items()}
                rows.append({"model": name, "batch": batch, **tokens})
                print(
                    f"{name} fp16 batch {batch:>2}: lm over gRPC {tokens['lm']:8.1f} tok/s, bare CUDA loop "
                    f"{tokens['bare']:8.1f} tok/s ({tokens['lm'] / tokens['bare']:.2f}x)",
                    flush=True,
                )
        finally:
            service.close()
    return rows


def greedy_equal(args, log_dir: Path) -> bool:
    """The tiny text fixture's greedy continuation of each prompt, CUDA against CPU."""
    from tokenizers import Tokenizer

    from bench.decode_loops import ServiceLoop

    model = ROOT / "models" / "tiny-text-fixture"
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    runs = {}
    for providers in (GPU["lm"], "cpu"):
        service = ServiceLoop(model, 0, log_dir, providers=providers)
        try:
            runs.setdefault(providers, [])
            for text in GREEDY_PROMPTS:
                ids = np.array([tokenizer.encode(text).ids])
                runs[providers].append(service.decode(service.prefill(ids), args.greedy_steps)[1][0])
        finally:
            service.close()
    same = True
    for text, on_gpu, on_cpu in zip(GREEDY_PROMPTS, runs[GPU["lm"]], runs["cpu"], strict=True):
        agree = next((i for i, (a, b) in enumerate(zip(on_gpu, on_cpu, strict=True)) if a != b), len(on_cpu))
        same &= agree == len(on_cpu)
        print(f"greedy {text!r}: CUDA equals CPU for {agree}/{len(on_cpu)} tokens")
    return same


def diffusion(args, log_dir: Path) -> bool:
    """One image from the default image model on CUDA float16 and on CPU float32, the same seed."""
    import io

    import grpc
    from PIL import Image

    from muestra.cli.launch import ServiceProcess
    from muestra.v1 import diffusion_pb2, diffusion_pb2_grpc

    images = {}
    for device, dtype in ((GPU["diffusion"], GPU["dtype"]), ("cpu", "float32")):
        model = ["--model", str(ROOT / "models" / "muestra-image"), "--device", device, "--dtype", dtype]
        service = ServiceProcess("diffusion", model, log_dir)
        try:
            with grpc.insecure_channel(service.address) as channel:
                stub = diffusion_pb2_grpc.DiffusionStub(channel)
                described = stub.Describe(diffusion_pb2.DescribeDiffusionRequest())
                print(f"diffusion: device {described.device}, dtype {described.dtype}")
                if described.device != device:
                    fail(f"the diffusion service runs on {described.device}, not {device}")
                request = diffusion_pb2.ImageRequest(prompt="a seven", steps=args.image_steps, seed=1234)
                for response in stub.Generate(request, timeout=300):
                    if response.WhichOneof("kind") == "image":
                        png = Image.open(io.BytesIO(response.image.png)).convert("RGB")
                        images[device, dtype] = np.asarray(png, dtype=np.float64)
        finally:
            service.stop()
    diff = np.abs(images[GPU["diffusion"], GPU["dtype"]] - images["cpu", "float32"])
    mse = float((diff**2).mean())
    psnr = 10 * np.log10(255**2 / mse) if mse else float("inf")
    ok = psnr >= IMAGE_MIN_PSNR_DB
    print(
        f"diffusion CUDA fp16 vs CPU fp32, seed 1234, {args.image_steps} steps: mean |diff| {diff.mean():.2f}/255, "
        f"max {diff.max():.0f}/255, PSNR {psnr:.1f} dB (tolerance: >= {IMAGE_MIN_PSNR_DB} dB): {'ok' if ok else 'FAIL'}"
    )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--greedy-steps", type=int, default=48)
    parser.add_argument("--image-steps", type=int, default=20)
    parser.add_argument("--cpu-dry-run", action="store_true", help="test this script on CPU (exits 3)")
    args = parser.parse_args()
    if args.cpu_dry_run:
        print("gpu_check: DRY RUN ON CPU: this is not a GPU check", flush=True)
        GPU.update(lm="cpu", diffusion="cpu", dtype="bfloat16")
    else:
        providers_and_devices()
    with tempfile.TemporaryDirectory(prefix="muestra-gpu-check-") as log_dir:
        lm_decode(args, Path(log_dir))
        greedy_ok = greedy_equal(args, Path(log_dir))
        image_ok = diffusion(args, Path(log_dir))
    if not (greedy_ok and image_ok):
        fail(f"greedy tokens equal: {greedy_ok}; image within tolerance: {image_ok}")
    if args.cpu_dry_run:
        fail("dry run on CPU: the script ran, but nothing was checked on a GPU", 3)
    print("gpu_check: all checks passed")


if __name__ == "__main__":
    main()
