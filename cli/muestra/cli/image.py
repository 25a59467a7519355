"""`muestra image PROMPT -o out.png`: generate an image through the gateway, with a progress bar.

--init-image makes it img2img, --mask as well inpainting; --lora NAME:WEIGHT applies an adapter.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from muestra.cli.arguments import SEED, UINT64_MAX, integer, number, stderr_is_terminal
from muestra.cli.endpoints import api_key, gateway_address
from muestra.cli.errors import CliError
from muestra.cli.generate import add_gateway_arguments
from muestra.client import Client


def add_parser(sub) -> None:
    parser = sub.add_parser("image", help="generate an image from a prompt (or edit one: --init-image, --mask)")
    parser.add_argument("prompt")
    parser.add_argument(
        "-o", "--output", default="muestra.png", help="PNG path; with --num-images N, -0, -1… are added"
    )
    parser.add_argument("--negative-prompt", default="")
    parser.add_argument("--width", type=integer(8), default=0, help="pixels, a multiple of 8 (default: the model's)")
    parser.add_argument("--height", type=integer(8), default=0, help="pixels, a multiple of 8 (default: the model's)")
    parser.add_argument("--steps", type=integer(1), default=0, help="denoising steps (default: the model's)")
    parser.add_argument("--guidance-scale", type=number(0.0), default=None, help="1 or less: no guidance")
    parser.add_argument("--seed", type=SEED, default=None, help=f"0 to {UINT64_MAX}; image i uses seed + i")
    parser.add_argument("--sampler", default="", help="scheduler name, e.g. euler_a, dpmpp_2m_karras")
    parser.add_argument("--num-images", type=integer(1), default=1)
    parser.add_argument("--init-image", type=Path, default=None, help="start from this PNG/JPEG/WebP (img2img)")
    parser.add_argument(
        "--strength", type=number(0.0, 1.0, low_open=True), default=None, help="how much of --init-image to repaint"
    )
    parser.add_argument("--mask", type=Path, default=None, help="inpaint: white is repainted, black kept")
    parser.add_argument("--mask-blur", type=integer(0), default=0, help="blur the mask by this many pixels")
    parser.add_argument("--invert-mask", action="store_true", help="repaint the black part instead")
    parser.add_argument(
        "--only-masked", type=integer(0), default=None, metavar="PADDING",
        help="inpaint only the mask's area plus PADDING pixels, at full size",
    )  # fmt: skip
    parser.add_argument(
        "--lora", action="append", default=[], metavar="NAME[:WEIGHT]", help="apply a LoRA adapter (repeatable)"
    )
    parser.add_argument("--model", default="")
    add_gateway_arguments(parser)
    parser.set_defaults(run=run)


def _bar(progress) -> None:
    width = 30
    filled = int(width * progress.step / max(progress.total, 1))
    sys.stderr.write(
        f"\rimage {progress.image_index + 1}: [{'#' * filled}{'.' * (width - filled)}] "
        f"{progress.step}/{progress.total} {progress.elapsed_s:.1f}s"
    )
    sys.stderr.flush()


def _check_output(output: Path) -> None:
    """Fail before generating, not after, when the PNGs cannot be written where -o says (a usage error: exit 2)."""
    folder = output.parent
    if output.is_dir():
        raise CliError(f"-o {output}: is a folder; give a file name such as {output / 'muestra.png'}", 2)
    if not folder.is_dir():
        raise CliError(f"-o {output}: the folder {folder} does not exist", 2)
    if not os.access(folder, os.W_OK):
        raise CliError(f"-o {output}: the folder {folder} is not writable", 2)


def _is_image(data: bytes) -> bool:
    """PNG, JPEG or WebP by their signatures: the formats the diffusion service reads."""
    return data.startswith((b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


def _read(flag: str, path: Path | None) -> bytes:
    if path is None:
        return b""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"{flag} {path}: {exc.strerror or exc}", 2) from None
    if not _is_image(data):
        raise CliError(f"{flag} {path}: not a PNG, JPEG or WebP image", 2)
    return data


def _loras(specs: list[str]) -> dict[str, float]:
    loras = {}
    for spec in specs:
        name, _, weight = spec.partition(":")
        try:
            loras[name] = float(weight) if weight else 1.0
        except ValueError:
            raise CliError(f"--lora {spec}: the weight after ':' must be a number", 2) from None
    return loras


def run(args) -> int:
    output = Path(args.output)
    _check_output(output)
    init_image, mask = _read("--init-image", args.init_image), _read("--mask", args.mask)
    loras = _loras(args.lora)
    args.gateway = gateway_address(args.gateway)
    # On a terminal only: redirected, each \r update would be a line of the log.
    show_progress = stderr_is_terminal()
    with Client(args.gateway, api_key=api_key(args.api_key)) as client:
        try:
            images = client.generate_image(
                args.prompt,
                on_progress=_bar if show_progress else None,
                model=args.model,
                negative_prompt=args.negative_prompt,
                width=args.width,
                height=args.height,
                steps=args.steps,
                guidance_scale=args.guidance_scale,
                seed=args.seed,
                sampler=args.sampler,
                num_images=args.num_images,
                init_image=init_image,
                strength=args.strength,
                mask_image=mask,
                mask_blur=args.mask_blur,
                invert_mask=args.invert_mask,
                padding_mask_crop=args.only_masked,
                loras=loras,
            )
        finally:
            if show_progress:
                sys.stderr.write("\n")
    for image in images:
        path = output if len(images) == 1 else output.with_name(f"{output.stem}-{image.index}{output.suffix}")
        try:
            path.write_bytes(image.png)
        except OSError as exc:
            raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
        print(f"{path} ({image.width}x{image.height}, seed {image.seed})")
    return 0
