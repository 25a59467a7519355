"""A third-party distribution adds schedulers through the `muestra` entry point, like the built-ins do."""

from __future__ import annotations

import os

import numpy as np
import pytest
from diffusers import DEISMultistepScheduler, EulerDiscreteScheduler

from muestra.v1 import diffusion_pb2
from tests.diffusion.client import generate, pixels, stub
from tests.fixtures.diffusion_models import start_diffusion_service

PLUGIN = """
from diffusers import DEISMultistepScheduler, EulerDiscreteScheduler

from muestra.plugin import hookimpl


def euler_trailing(base_config):
    return EulerDiscreteScheduler.from_config(base_config, timestep_spacing="trailing")


def broken(base_config):
    raise RuntimeError("this factory never works")


@hookimpl
def register_schedulers(register):
    register("deis", DEISMultistepScheduler, aliases=("DEISMultistepScheduler",))
    register("euler_trailing", euler_trailing)
    register("euler", euler_trailing)  # taken by the built-in: skipped
    register("broken", broken)  # cannot be built: dropped at start-up
"""


@pytest.fixture(scope="module")
def plugin_service(tiny_sd_model, tmp_path_factory):
    """The service with a tiny installed distribution (a module and its .dist-info) on PYTHONPATH."""
    site = tmp_path_factory.mktemp("site")
    (site / "muestra_test_schedulers.py").write_text(PLUGIN)
    dist_info = site / "muestra_test_schedulers-0.3.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: muestra-test-schedulers\nVersion: 0.3.1\n")
    (dist_info / "entry_points.txt").write_text("[muestra]\ntest-schedulers = muestra_test_schedulers\n")
    python_path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    # The model comes from MUESTRA_DIFFUSION_MODEL here, which this also checks.
    service = start_diffusion_service(
        tiny_sd_model, tmp_path_factory.mktemp("logs"), env={"PYTHONPATH": python_path}, model_from_env=True
    )
    yield service
    service.process.stop()


def test_a_plugin_registers_a_scheduler_class_and_a_factory(plugin_service):
    schedulers = stub(plugin_service.address).ListSchedulers(diffusion_pb2.ListSchedulersRequest()).schedulers
    by_name = {s.name: s for s in schedulers}
    for name in ("deis", "euler_trailing"):
        info = by_name[name]
        assert (info.plugin, info.distribution, info.version) == ("test-schedulers", "muestra-test-schedulers", "0.3.1")
    assert list(by_name["deis"].aliases) == ["DEISMultistepScheduler"]
    assert by_name["euler"].plugin == "diffusion-schedulers"
    assert "broken" not in by_name
    assert "plugin test-schedulers: scheduler 'euler' not registered" in plugin_service.process.log_tail(200)


@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("deis", DEISMultistepScheduler.from_config),
        ("euler_trailing", lambda config: EulerDiscreteScheduler.from_config(config, timestep_spacing="trailing")),
    ],
)
def test_a_plugin_scheduler_matches_the_bare_pipeline(name, reference, plugin_service, reference_sd):
    [image] = generate(plugin_service.address, prompt="a lighthouse", steps=4, seed=21, sampler=name).images
    expected = reference_sd.image(prompt="a lighthouse", width=64, height=64, steps=4, seed=21, scheduler=reference)
    np.testing.assert_array_equal(pixels(image.png), expected)
    assert f"Sampler: {name}," in image.parameters
