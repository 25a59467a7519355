"""`muestra image PROMPT -o out.png`: generate an image through the gateway, with a progress bar."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from muestra.cli.endpoints import api_key, gateway_address
from muestra.cli.errors import CliError
from muestra.client import Client


def add_parser(sub) -> None:
    parser = sub.add_parser("image", help="generate an image from a prompt")
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


def run(args) -> int:
    output = Path(args.output)
    _check_output(output)
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
