"""`muestra image PROMPT -o out.png`: generate an image through the gateway, with a progress bar."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from muestra.cli.endpoints import default_address
from muestra.client import Client, MuestraError


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
    parser.add_argument("--gateway", default=None, help="gateway address [MUESTRA_GATEWAY_ADDR]")
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


def run(args) -> int:
    api_key = args.api_key or os.environ.get("MUESTRA_API_KEY")
    with Client(args.gateway or default_address("gateway"), api_key=api_key) as client:
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
        except MuestraError as exc:
            print(f"\nmuestra image: {exc}", file=sys.stderr)
            return 1
    sys.stderr.write("\n")
    output = Path(args.output)
    for image in images:
        path = output if len(images) == 1 else output.with_name(f"{output.stem}-{image.index}{output.suffix}")
        path.write_bytes(image.png)
        print(f"{path} ({image.width}x{image.height}, seed {image.seed})")
    return 0
