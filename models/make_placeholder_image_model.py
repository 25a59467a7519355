"""Build the placeholder default image model: a tiny *random* Stable Diffusion pipeline.

It exists so that `muestra up` serves an image model on a fresh clone before the trained
default model (digits) ships; its images are noise. The weights are seeded; the
tokenizer's merge order may differ between builds. It reuses the test suite's builder of random pipelines.

    .venv/bin/python models/make_placeholder_image_model.py
"""

from __future__ import annotations

import json
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
    # Marks the folder as the placeholder (diffusers ignores "_" keys; save_pretrained of the trained
    # model rewrites the file without it). The trained model's quality tests skip the placeholder.
    index_path = target / "model_index.json"
    index = json.loads(index_path.read_text())
    index["_muestra_placeholder"] = True
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    print(f"wrote the placeholder image model into {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
