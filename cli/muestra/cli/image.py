"""`muestra image PROMPT -o out.png`: generate an image through the gateway, with a progress bar.

--init-image makes it img2img, --mask as well inpainting; --lora NAME:WEIGHT applies an adapter.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from muestra.cli.endpoints import api_key, gateway_address
from muestra.cli.errors import CliError
from muestra.client import Client


def add_parser(sub) -> None:
    parser = sub.add_parser("image", help="generate an image from a prompt (or edit one: --init-image, --mask)")
    parser.add_argument("prompt")
    parser.add_argument(
        "-o", "--output", default="muestra.png", help="PNG path; with --num-images N, -0, -1… are added"
    )
    parser.add_argument("--negative-prompt", default="")
    parser.add_argument("--width", type=int, default=0)
    parser.add_argument("--height", type=int, default=0)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--guidance-scale", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--sampler", default="", help="scheduler name, e.g. euler_a, dpmpp_2m_karras")
    parser.add_argument("--num-images", type=int, default=1)
    parser.add_argument("--init-image", type=Path, default=None, help="start from this PNG/JPEG/WebP (img2img)")
    parser.add_argument("--strength", type=float, default=None, help="how much of --init-image to repaint, in (0, 1]")
    parser.add_argument("--mask", type=Path, default=None, help="inpaint: white is repainted, black kept")
    parser.add_argument("--mask-blur", type=int, default=0, help="blur the mask by this many pixels")
    parser.add_argument("--invert-mask", action="store_true", help="repaint the black part instead")
    parser.add_argument(
        "--only-masked", type=int, default=None, metavar="PADDING",
        help="inpaint only the mask's area plus PADDING pixels, at full size",
    )  # fmt: skip
    parser.add_argument(
        "--lora", action="append", default=[], metavar="NAME[:WEIGHT]", help="apply a LoRA adapter (repeatable)"
    )
    parser.add_argument("--model", default="")
    parser.add_argument("--gateway", default=None, help="gateway address [MUESTRA_GATEWAY_ADDR, else `muestra up`'s]")
    parser.add_argument("--api-key", default=None, help="API key [MUESTRA_API_KEY]")
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
    """Fail before generating, not after, when the PNGs cannot be written where -o says."""
    folder = output.parent
    if output.is_dir():
        raise CliError(f"-o {output}: is a folder; give a file name such as {output / 'muestra.png'}")
    if not folder.is_dir():
        raise CliError(f"-o {output}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise CliError(f"-o {output}: the folder {folder} is not writable")


def _read(flag: str, path: Path | None) -> bytes:
    if path is None:
        return b""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CliError(f"{flag} {path}: {exc.strerror or exc}") from None


def _loras(specs: list[str]) -> dict[str, float]:
    loras = {}
    for spec in specs:
        name, _, weight = spec.partition(":")
        try:
            loras[name] = float(weight) if weight else 1.0
        except ValueError:
            raise CliError(f"--lora {spec}: the weight after ':' must be a number") from None
    return loras


def run(args) -> int:
    output = Path(args.output)
    _check_output(output)
    init_image, mask = _read("--init-image", args.init_image), _read("--mask", args.mask)
    loras = _loras(args.lora)
    args.gateway = gateway_address(args.gateway)
    with Client(args.gateway, api_key=api_key(args.api_key)) as client:
        try:
            images = client.generate_image(
                args.prompt,
                on_progress=_bar,
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
            sys.stderr.write("\n")
    for image in images:
        path = output if len(images) == 1 else output.with_name(f"{output.stem}-{image.index}{output.suffix}")
        try:
            path.write_bytes(image.png)
        except OSError as exc:
            raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
        print(f"{path} ({image.width}x{image.height}, seed {image.seed})")
    return 0
