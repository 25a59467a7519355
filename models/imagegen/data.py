"""The training data: scikit-learn's 8x8 handwritten digits, upsampled, and captions naming each digit."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

ENGLISH = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SPANISH = ("cero", "uno", "dos", "tres", "cuatro", "cinco", "seis", "siete", "ocho", "nueve")

# {w}: the digit as an English word or a numeral; "a"/"an" is fixed up afterwards.
ENGLISH_TEMPLATES = (
    "{w}",
    "a {w}",
    "the {w}",
    "a handwritten {w}",
    "handwritten {w}",
    "the digit {w}",
    "digit {w}",
    "the number {w}",
    "number {w}",
    "a handwritten digit {w}",
    "a handwritten number {w}",
    "a drawing of a {w}",
    "a picture of the digit {w}",
    "an image of the number {w}",
    "a {w}, handwritten",
    "the handwritten digit {w}",
)
# {w}: the digit as a Spanish word or a numeral.
SPANISH_TEMPLATES = (
    "{w}",
    "un {w}",
    "el {w}",
    "el número {w}",
    "número {w}",
    "el dígito {w}",
    "dígito {w}",
    "un {w} escrito a mano",
    "{w} escrito a mano",
    "el número {w} escrito a mano",
    "un dibujo de un {w}",
)


def _fix_article(text: str) -> str:
    for word in ("eight", "8"):
        text = text.replace(f"a {word}", f"an {word}").replace(f"A {word}", f"An {word}")
    return text


def captions_for(digit: int) -> list[str]:
    """Every caption the model is trained on for `digit`: English words, numerals and Spanish words."""
    numeral = str(digit)
    captions = [_fix_article(t.format(w=w)) for t in ENGLISH_TEMPLATES for w in (ENGLISH[digit], numeral)]
    captions += [t.format(w=w) for t in SPANISH_TEMPLATES for w in (SPANISH[digit], numeral)]
    return list(dict.fromkeys(captions))


def all_captions() -> list[list[str]]:
    return [captions_for(digit) for digit in range(10)]


def load_digit_images(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels): images [N, 3, size, size] in [-1, 1], ink bright on a dark ground, grey replicated to RGB."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = torch.from_numpy(digits.images.astype(np.float32) / 16.0)[:, None]
    images = F.interpolate(small, size=(size, size), mode="bicubic", align_corners=False).clamp(0, 1)
    images = (images * 2 - 1).repeat(1, 3, 1, 1)
    return images, torch.from_numpy(digits.target.astype(np.int64))
