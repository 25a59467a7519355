"""Does the default image model turn a three into the digit a prompt names, by img2img and by inpainting?

    .venv/bin/python -m bench.image_edit_quality [--model models/muestra-image] [--seeds 50]
        [--sheet docs/images/edits_contact_sheet.png] [--threads 2]

The init image is a real three from scikit-learn's load_digits (the first one in the set), upsampled to the
model's size the way bench/image_quality.py's baseline upsamples (bicubic). Each case runs the img2img or
inpainting pipeline the diffusion service builds from the loaded one (from_pipe), at the service's defaults
for the folder, one CPU generator per seed; bench/image_quality.py's classifier (an SVC trained on real
digits only) labels every result. Prints the rate per case and writes a contact sheet (8 seeds per case).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from bench.image_quality import as_load_digits, load_pipeline, service_defaults, train_classifier

# (label, prompt, strength, mask) with the mask "left" repainting the left half (a three plus a left side
# is an eight).
CASES = [
    ("img2img 0.3", "a handwritten eight", 0.3, None),
    ("img2img 0.6", "a handwritten eight", 0.6, None),
    ("img2img 0.8", "a handwritten eight", 0.8, None),
    ("inpaint left half 1.0", "a handwritten eight", 1.0, "left"),
    ("img2img 0.6", "a handwritten zero", 0.6, None),
    ("img2img 0.3 (keep)", "a handwritten three", 0.3, None),
]


def a_three(size: int) -> Image.Image:
    from sklearn.datasets import load_digits

    digits = load_digits()
    three = digits.images[list(digits.target).index(3)] / 16.0
    small = torch.from_numpy(three).float()[None, None]
    big = torch.nn.functional.interpolate(small, size=(size, size), mode="bicubic", align_corners=False)
    grey = (big.clamp(0, 1)[0, 0].numpy() * 255).round().astype(np.uint8)
    return Image.fromarray(grey).convert("RGB")


def left_half(size: int) -> Image.Image:
    mask = Image.new("L", (size, size), 0)
    mask.paste(255, (0, 0, size // 2, size))
    return mask


def run(pipes: dict, defaults: dict, init: Image.Image, case, seeds: list[int]) -> np.ndarray:
    _, prompt, strength, mask = case
    call = {
        "prompt": [prompt] * len(seeds),
        "image": [init] * len(seeds),
        "strength": strength,
        "num_inference_steps": defaults["num_inference_steps"],
        "guidance_scale": defaults["guidance_scale"],
        "generator": [torch.Generator("cpu").manual_seed(seed) for seed in seeds],
        "output_type": "np",
    }
    if mask is None:
        return pipes["img2img"](**call).images
    size = defaults["width"]
    return pipes["inpaint"](**call, mask_image=[left_half(size)] * len(seeds), width=size, height=size).images


def contact_sheet(init: Image.Image, rows: list, path: Path, scale: int = 3) -> None:
    """The init image, then one row per case: its label and prompt, and the first images; red digit: the
    classifier's label where it is not the prompt's digit."""
    size = init.width * scale
    margin, pad = 230, 4
    cols = rows[0][1].shape[0]
    sheet = Image.new("RGB", (margin + (cols + 1) * (size + pad), len(rows) * (size + pad) + pad), "white")
    draw = ImageDraw.Draw(sheet)
    big_init = init.resize((size, size), Image.NEAREST)
    for r, (case, images, predicted, wanted) in enumerate(rows):
        top = pad + r * (size + pad)
        label, prompt, _, _ = case
        draw.text((6, top + size // 2 - 12), f"{label}\n{prompt!r}", fill="black")
        sheet.paste(big_init, (margin, top))
        for c in range(cols):
            tile = Image.fromarray((images[c] * 255).round().astype(np.uint8)).resize((size, size), Image.NEAREST)
            left = margin + (c + 1) * (size + pad)
            sheet.paste(tile, (left, top))
            if predicted[c] != wanted:
                draw.text((left + 2, top + 1), str(predicted[c]), fill="red")
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path)


def main() -> None:
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/muestra-image")
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--sheet", default="docs/images/edits_contact_sheet.png", help="'' for none")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    classifier, _, _, _ = train_classifier()
    pipe = load_pipeline(Path(args.model))
    pipes = {
        "img2img": AutoPipelineForImage2Image.from_pipe(pipe),
        "inpaint": AutoPipelineForInpainting.from_pipe(pipe),
    }
    for each in pipes.values():
        each.set_progress_bar_config(disable=True)
    defaults = service_defaults(pipe)
    init = a_three(defaults["width"])
    words = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    print(f"the init image reads as {classifier.predict(as_load_digits(np.asarray(init)[None] / 255.0))[0]}")

    rows = []
    started = time.perf_counter()
    print("\n| case | prompt | read as the prompt's digit | read as a three | most common label |")
    print("|---|---|---|---|---|")
    for case in CASES:
        wanted = words.index(case[1].rsplit(" ", 1)[1])
        seeds = list(range(1, args.seeds + 1))
        images = np.concatenate([run(pipes, defaults, init, case, seeds[i : i + 25]) for i in range(0, len(seeds), 25)])
        predicted = classifier.predict(as_load_digits(images))
        counts = np.bincount(predicted, minlength=10)
        right, threes = int(counts[wanted]), int(counts[3])
        print(
            f"| {case[0]} | {case[1]} | {right}/{len(seeds)} ({right / len(seeds):.0%}) | {threes}/{len(seeds)} "
            f"| {int(counts.argmax())} |",
            flush=True,
        )
        rows.append((case, images[:8], predicted[:8].tolist(), wanted))
    print(
        f"\nmodel {args.model}: {defaults['width']}x{defaults['height']}, {defaults['num_inference_steps']} steps "
        f"(int(steps * strength) run), guidance_scale {defaults['guidance_scale']}, seeds 1-{args.seeds}; "
        f"{time.perf_counter() - started:.0f} s ({args.threads} threads)"
    )
    if args.sheet:
        contact_sheet(init, rows, Path(args.sheet))
        print(f"contact sheet: {args.sheet}")


if __name__ == "__main__":
    main()
