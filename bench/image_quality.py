"""Does the default image model draw the digit it is asked for? An independent digit classifier decides.

    .venv/bin/python -m bench.image_quality [--model models/muestra-image] [--per-digit 50]
        [--sheet docs/contact_sheet.png] [--threads 2]

Generates `--per-digit` images for each digit 0-9 with the prompt "a handwritten {word}" and varied seeds,
at the service's defaults for the folder (size from the UNet's sample_size, the pipeline's default steps and
guidance_scale, the model's own scheduler), through the pipeline loaded from the folder the way the
diffusion service loads it (the initial noise drawn from a CPU generator per seed, as the service does).
Each image is turned back into a load_digits sample (grey, 4x4 area average to 8x8, scaled to [0, 16]) and
labelled by an SVC trained on 80% of the real digits only. The baseline is the same classifier on the
other 20% of real digits, put through the same 32x32 upsampling and 8x8 downsampling, in the same run.
Prints a markdown table per digit and writes a contact sheet (10 digits x 8 seeds).
"""

from __future__ import annotations

import argparse
import inspect
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
PROMPT = "a handwritten {word}"


def load_pipeline(model: Path):
    """As the diffusion service loads it: local files only, float32 on the CPU, no safety checker."""
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(
        model,
        dtype=torch.float32,
        local_files_only=True,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def service_defaults(pipe) -> dict:
    """The size, steps and guidance the diffusion service uses for this folder when a request leaves them out."""
    call = inspect.signature(type(pipe).__call__).parameters
    size = pipe.unet.config.sample_size * pipe.vae_scale_factor
    return {
        "width": size,
        "height": size,
        "num_inference_steps": call["num_inference_steps"].default,
        "guidance_scale": call["guidance_scale"].default,
    }


def generate(pipe, prompt: str, seeds: list[int], defaults: dict) -> np.ndarray:
    """[len(seeds), H, W, 3] in [0, 1]; image i equals a one-image call with seeds[i]."""
    from diffusers.utils.torch_utils import randn_tensor

    generators = [torch.Generator("cpu").manual_seed(seed) for seed in seeds]
    factor = pipe.vae_scale_factor
    shape = (1, pipe.unet.config.in_channels, defaults["height"] // factor, defaults["width"] // factor)
    latents = torch.cat([randn_tensor(shape, generator=g, dtype=torch.float32) for g in generators])
    result = pipe(prompt=[prompt] * len(seeds), latents=latents, generator=generators, output_type="np", **defaults)
    return result.images


def as_load_digits(images: np.ndarray) -> np.ndarray:
    """[N, H, W, 3] in [0, 1] -> [N, 64] like load_digits().data: grey, area-averaged to 8x8, in [0, 16]."""
    grey = torch.from_numpy(np.ascontiguousarray(images)).float().mean(dim=-1, keepdim=True).permute(0, 3, 1, 2)
    small = F.interpolate(grey, size=(8, 8), mode="area")
    return (small.reshape(len(images), 64) * 16).numpy()


def train_classifier(seed: int = 0):
    """An SVC on 80% of the real digits, and its accuracy on the other 20% put through a 32x32 round trip."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.svm import SVC

    digits = load_digits()
    train_x, test_x, train_y, test_y = train_test_split(
        digits.data, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )
    classifier = SVC(gamma=0.001).fit(train_x, train_y)
    small = torch.from_numpy(test_x.reshape(-1, 1, 8, 8) / 16.0).float()
    upsampled = F.interpolate(small, size=(32, 32), mode="bicubic", align_corners=False).clamp(0, 1)
    round_trip = as_load_digits(upsampled.permute(0, 2, 3, 1).repeat(1, 1, 1, 3).numpy())
    return classifier, float((classifier.predict(test_x) == test_y).mean()), round_trip, test_y


def contact_sheet(rows: list[np.ndarray], labels: list[list[int]], path: Path, scale: int = 3) -> None:
    """One row per digit: its prompt, then the images; a classifier label that disagrees is drawn in red."""
    n, cols = len(rows), rows[0].shape[0]
    height, width = rows[0].shape[1] * scale, rows[0].shape[2] * scale
    margin, pad = 130, 4
    sheet = Image.new("RGB", (margin + cols * (width + pad), n * (height + pad) + pad), "white")
    draw = ImageDraw.Draw(sheet)
    for digit, (images, predicted) in enumerate(zip(rows, labels, strict=True)):
        top = pad + digit * (height + pad)
        draw.text((6, top + height // 2 - 6), PROMPT.format(word=WORDS[digit]), fill="black")
        for col in range(cols):
            tile = Image.fromarray((images[col] * 255).round().astype(np.uint8)).resize((width, height), Image.NEAREST)
            left = margin + col * (width + pad)
            sheet.paste(tile, (left, top))
            if predicted[col] != digit:
                draw.text((left + 2, top + 1), str(predicted[col]), fill="red")
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/muestra-image")
    parser.add_argument("--per-digit", type=int, default=50)
    parser.add_argument("--batch", type=int, default=25, help="images per pipeline call")
    parser.add_argument("--sheet", default="docs/contact_sheet.png", help="contact sheet PNG ('' for none)")
    parser.add_argument("--sheet-seeds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    classifier, real_accuracy, round_trip, round_trip_y = train_classifier()
    baseline = float((classifier.predict(round_trip) == round_trip_y).mean())
    pipe = load_pipeline(Path(args.model))
    defaults = service_defaults(pipe)
    scheduler = type(pipe.scheduler).__name__

    rows, sheet_images, sheet_labels = [], [], []
    started = time.perf_counter()
    for digit, word in enumerate(WORDS):
        prompt = PROMPT.format(word=word)
        seeds = [10_000 * (digit + 1) + i for i in range(args.per_digit)]
        images = np.concatenate(
            [generate(pipe, prompt, seeds[i : i + args.batch], defaults) for i in range(0, len(seeds), args.batch)]
        )
        predicted = classifier.predict(as_load_digits(images))
        rows.append((digit, prompt, int((predicted == digit).sum()), np.bincount(predicted, minlength=10)))
        sheet_images.append(images[: args.sheet_seeds])
        sheet_labels.append(predicted[: args.sheet_seeds].tolist())
        print(f"{prompt!r}: {rows[-1][2]}/{len(seeds)}", flush=True)
    seconds = time.perf_counter() - started
    total = args.per_digit * 10
    correct = sum(row[2] for row in rows)

    print(
        f"\nmodel {args.model}; defaults: {defaults['width']}x{defaults['height']}, "
        f"{defaults['num_inference_steps']} steps, guidance_scale {defaults['guidance_scale']}, {scheduler}; "
        f"{args.per_digit} seeds per digit; {seconds / total:.2f} s per image ({args.threads} threads, "
        f"batches of {args.batch})\n"
    )
    print("| digit | prompt | classified as the prompt's digit | accuracy | most common wrong label |")
    print("|---|---|---|---|---|")
    for digit, prompt, right, counts in rows:
        wrong = counts.copy()
        wrong[digit] = 0
        worst = f"{int(wrong.argmax())} ({int(wrong.max())})" if wrong.max() else "-"
        print(f"| {digit} | {prompt} | {right}/{args.per_digit} | {right / args.per_digit:.0%} | {worst} |")
    accuracy = correct / total
    print(f"| all | | {correct}/{total} | **{accuracy:.1%}** | |")
    print(
        f"\nbaseline (same classifier, held-out real digits through the 32x32 round trip): {baseline:.1%} "
        f"(at 8x8 directly: {real_accuracy:.1%}); generated / baseline = {accuracy / baseline:.3f}"
    )
    if args.sheet:
        contact_sheet(sheet_images, sheet_labels, Path(args.sheet))
        print(f"contact sheet: {args.sheet}")


if __name__ == "__main__":
    main()
