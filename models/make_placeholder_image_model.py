"""Build the placeholder default image model: a tiny *random* Stable Diffusion pipeline.

It exists so that `muestra up` serves an image model on a fresh clone before the trained
default model (digits) ships; its images are noise. Deterministic for fixed torch/diffusers
versions. It reuses the test suite's builder of random pipelines.

    .venv/bin/python models/make_placeholder_image_model.py
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.fixtures.diffusion_models import TINY, build_random_sd  # noqa: E402


def main() -> int:
    target = HERE / "muestra-image"
    if target.exists():
        shutil.rmtree(target)
    build_random_sd(target, TINY)
    print(f"wrote the placeholder image model into {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
