"""`muestra image --init-image F --strength S --mask M --lora NAME:W`: the same image as the gRPC call it makes."""

from __future__ import annotations

import numpy as np
import pytest

from muestra.v1 import diffusion_pb2
from tests.cli.conftest import assert_fails_in_one_line, muestra
from tests.diffusion.client import generate, pixels
from tests.diffusion.test_img2img import encode, random_image, square_mask


@pytest.fixture
def inputs(tmp_path):
    init, mask = tmp_path / "init.png", tmp_path / "mask.png"
    init.write_bytes(encode(random_image(seed=60)))
    mask.write_bytes(encode(square_mask()))
    return init, mask


def test_inpainting_with_a_lora_from_the_cli_equals_the_direct_request(image_stack, inputs, tmp_path):
    init, mask = inputs
    out = tmp_path / "out.png"
    result = muestra(
        "image", "a cat", "-o", str(out), "--init-image", str(init), "--mask", str(mask), "--strength", "0.6",
        "--mask-blur", "2", "--lora", "ink:0.8", "--steps", "5", "--seed", "61",
        "--gateway", image_stack.gateway.address, "--api-key", image_stack.api_key,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "(64x64, seed 61)" in result.stdout
    assert result.stderr == ""  # standard error is no terminal here: no progress bar
    [direct] = generate(
        image_stack.diffusion.address, prompt="a cat", init_image=init.read_bytes(), mask_image=mask.read_bytes(),
        strength=0.6, mask_blur=2, loras=[diffusion_pb2.LoraWeight(name="ink", weight=0.8)], steps=5, seed=61,
    ).images  # fmt: skip
    np.testing.assert_array_equal(pixels(out.read_bytes()), pixels(direct.png))
    assert "<lora:ink:0.8>" in direct.parameters and "Denoising strength: 0.6" in direct.parameters


@pytest.mark.parametrize(
    ("flags", "says", "exit_code"),
    [
        (["--init-image", "missing.png"], "--init-image missing.png: No such file or directory", 2),
        (["--init-image", "notes.txt"], "--init-image notes.txt: not a PNG, JPEG or WebP image", 2),
        (["--mask", "notes.txt"], "--mask notes.txt: not a PNG, JPEG or WebP image", 2),
        (["--lora", "ink:heavy"], "--lora ink:heavy: the weight after ':' must be a number", 2),
        (["--strength", "2"], "argument --strength: 2 is out of range: give a number in (0, 1]", 2),
        (["--lora", "nope"], "loras[0].name: unknown LoRA 'nope'; known: ink", 1),
    ],
)
def test_bad_edit_flags_are_one_line(flags, says, exit_code, image_stack, inputs, tmp_path):
    init, _ = inputs
    (tmp_path / "notes.txt").write_text("not an image\n")
    result = muestra(
        "image", "a cat", "-o", str(tmp_path / "out.png"), "--init-image", str(init), *flags, "--steps", "2",
        "--gateway", image_stack.gateway.address, "--api-key", image_stack.api_key, cwd=tmp_path,
    )  # fmt: skip
    assert says in assert_fails_in_one_line(result, exit_code)
