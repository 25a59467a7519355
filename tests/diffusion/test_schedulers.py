"""Schedulers come from plugins; every registered one runs and matches the same scheduler in a bare pipeline."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    HeunDiscreteScheduler,
    LCMScheduler,
    LMSDiscreteScheduler,
    PNDMScheduler,
    UniPCMultistepScheduler,
)

from muestra.v1 import diffusion_pb2
from tests.diffusion.client import generate, pixels, rpc_error, stub

PROMPT = "an astronaut riding a horse"

# The built-in names and what each means in diffusers, written out independently of the service's table.
EXPECTED = {
    "euler": EulerDiscreteScheduler.from_config,
    "euler_a": EulerAncestralDiscreteScheduler.from_config,
    "ddim": DDIMScheduler.from_config,
    "ddpm": DDPMScheduler.from_config,
    "pndm": PNDMScheduler.from_config,
    "lms": LMSDiscreteScheduler.from_config,
    "heun": HeunDiscreteScheduler.from_config,
    "dpmpp_2m": DPMSolverMultistepScheduler.from_config,
    "dpmpp_2m_karras": lambda config: DPMSolverMultistepScheduler.from_config(config, use_karras_sigmas=True),
    "unipc": UniPCMultistepScheduler.from_config,
    "lcm": LCMScheduler.from_config,
}


def test_the_built_in_schedulers_are_registered_through_the_plugin_hook(diffusion_service):
    schedulers = stub(diffusion_service.address).ListSchedulers(diffusion_pb2.ListSchedulersRequest()).schedulers
    assert [s.name for s in schedulers] == list(EXPECTED)
    for info in schedulers:
        assert (info.plugin, info.distribution) == ("diffusion-schedulers", "muestra-diffusion")
        assert info.version
    aliases = {s.name: set(s.aliases) for s in schedulers}
    assert "EulerAncestralDiscreteScheduler" in aliases["euler_a"] and "Euler a" in aliases["euler_a"]
    assert "DPM++ 2M Karras" in aliases["dpmpp_2m_karras"]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_scheduler_matches_the_bare_pipeline(name, diffusion_service, reference_sd):
    [image] = generate(diffusion_service.address, prompt=PROMPT, steps=4, seed=11, sampler=name).images
    expected = reference_sd.image(prompt=PROMPT, width=64, height=64, steps=4, seed=11, scheduler=EXPECTED[name])
    np.testing.assert_array_equal(pixels(image.png), expected)
    assert f"Sampler: {name}," in image.parameters


def test_a_step_count_the_scheduler_cannot_run_is_invalid_argument(diffusion_service):
    # PNDM built from this model's config does Runge-Kutta warm-up steps, which need at least 4 steps.
    error = rpc_error(diffusion_service.address, prompt=PROMPT, steps=3, sampler="pndm")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("steps: sampler 'pndm' cannot run 3 steps")


def test_an_alias_selects_the_same_scheduler_ignoring_case(diffusion_service):
    by_name = generate(diffusion_service.address, prompt=PROMPT, steps=3, seed=2, sampler="euler_a").images[0]
    by_alias = generate(diffusion_service.address, prompt=PROMPT, steps=3, seed=2, sampler="EULER A").images[0]
    by_class = generate(
        diffusion_service.address, prompt=PROMPT, steps=3, seed=2, sampler="EulerAncestralDiscreteScheduler"
    ).images[0]
    np.testing.assert_array_equal(pixels(by_name.png), pixels(by_alias.png))
    np.testing.assert_array_equal(pixels(by_name.png), pixels(by_class.png))


def test_an_unknown_sampler_is_invalid_argument_listing_the_known_ones(diffusion_service):
    error = rpc_error(diffusion_service.address, prompt=PROMPT, steps=2, sampler="k_dpm_fast_nonexistent")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("sampler: unknown sampler 'k_dpm_fast_nonexistent'")
    for name in EXPECTED:
        assert name in error.details()


def test_scheduler_options_in_extra_override_its_config(diffusion_service, reference_sd):
    extra = {"scheduler": {"timestep_spacing": "trailing", "steps_offset": 0}}
    [image] = generate(diffusion_service.address, prompt=PROMPT, steps=3, seed=4, sampler="ddim", extra=extra).images

    def trailing_ddim(config):
        return DDIMScheduler.from_config(config, timestep_spacing="trailing", steps_offset=0)

    expected = reference_sd.image(prompt=PROMPT, width=64, height=64, steps=3, seed=4, scheduler=trailing_ddim)
    np.testing.assert_array_equal(pixels(image.png), expected)
    default = generate(diffusion_service.address, prompt=PROMPT, steps=3, seed=4, sampler="ddim").images[0]
    assert not np.array_equal(pixels(image.png), pixels(default.png))
    assert 'Scheduler options: "{\\"steps_offset\\": 0, \\"timestep_spacing\\": \\"trailing\\"}"' in image.parameters


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"scheduler": {"no_such_option": 1}}, "extra.scheduler.no_such_option"),
        ({"scheduler": {"steps_offset": 0.5}}, "extra.scheduler.steps_offset"),
        ({"scheduler": {"timestep_spacing": "sideways"}}, "extra.scheduler"),
        ({"scheduler": "trailing"}, "extra.scheduler"),
        ({"lora": "x"}, "extra"),
        # JSON has no NaN or infinities: these used to fail MessageToDict as INTERNAL.
        ({"scheduler": {"beta_start": float("nan")}}, "extra.scheduler.beta_start"),
        ({"scheduler": {"betas": [0.1, float("-inf")]}}, "extra.scheduler.betas[1]"),
        ({"lora": float("inf")}, "extra.lora"),
    ],
)
def test_bad_scheduler_options_are_invalid_argument_naming_the_option(extra, field, diffusion_service):
    error = rpc_error(diffusion_service.address, prompt=PROMPT, steps=2, sampler="ddim", extra=extra)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(field + ":")
