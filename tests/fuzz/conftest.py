"""The fuzz runs' stack (the text fixture, the image model, Redis, one lm, diffusion, an HTTP gateway) and their tally.

MUESTRA_FUZZ_EXAMPLES sets the examples per test (CI's default is small; a long run: 2000).
The counts by outcome per surface are printed at the end of the run, and written as JSON to
MUESTRA_FUZZ_REPORT when it is set.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, settings

from bench.stack import TEXT_FIXTURE, LocalStack
from muestra.runtime.channels import metadata_interceptors
from muestra.v1 import diffusion_pb2, diffusion_pb2_grpc, gateway_pb2, gateway_pb2_grpc

TEXT_MODEL = TEXT_FIXTURE.name
IMAGE_MODEL = "muestra-image"

EXAMPLES = int(os.environ.get("MUESTRA_FUZZ_EXAMPLES", "40"))
settings.register_profile(
    "muestra-fuzz", max_examples=EXAMPLES, deadline=None, database=None, derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                           HealthCheck.function_scoped_fixture],
)  # fmt: skip
FUZZ = settings.get_profile("muestra-fuzz")

# surface -> outcome -> count, for the summary.
TALLY: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


# With MUESTRA_FUZZ_DETAILS set: the commonest error messages per surface too (to see what examples hit).
DETAILS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def tally(surface: str, outcome: str, details: str = "") -> None:
    TALLY[surface][outcome] += 1
    if details and os.environ.get("MUESTRA_FUZZ_DETAILS"):
        DETAILS[surface][details[:90]] += 1


def internal_channel(stack, target: str, options: list | None = None) -> grpc.aio.Channel:
    """A channel to an internal service of the stack, carrying its internal token as the gateway's do."""
    return grpc.aio.insecure_channel(target, options=options, interceptors=metadata_interceptors(stack.internal_token))


@pytest.fixture(scope="session")
def fuzz_stack(tmp_path_factory):
    stack = LocalStack(tmp_path_factory.mktemp("fuzz"), lm_replicas=1)
    yield stack
    stack.close()


@dataclasses.dataclass
class Known:
    """What the running stack accepts, for hints that get examples past the first checks."""

    samplers: list[str]
    params: list[str]
    vocab_size: int
    context_length: int
    image_limits: diffusion_pb2.DescribeDiffusionResponse
    greedy: list[int]
    # Batches the lm holds for this run: fuzzed Decode and Filter calls use (and replace) them.
    batches: list[str] = dataclasses.field(default_factory=list)


async def greedy_ids(address: str) -> list[int]:
    async with grpc.aio.insecure_channel(address) as channel:
        request = gateway_pb2.GenerateRequest(prompt="def fuzz(x):\n", max_tokens=16, ignore_eos=True, seed=3)
        request.samplers.add(name="greedy")
        ids: list[int] = []
        async for message in gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=60):
            if message.HasField("delta"):
                ids.extend(message.delta.token_ids)
        return ids


async def _known(stack) -> Known:
    async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
        gateway = gateway_pb2_grpc.GatewayStub(channel)
        listing = await gateway.ListSamplers(gateway_pb2.ListSamplersRequest(), timeout=10)
        models = await gateway.ListModels(gateway_pb2.ListModelsRequest(), timeout=10)
    params = set()
    for sampler in listing.samplers:
        schema = json.loads(sampler.parameter_schema or "{}")
        params |= set(schema.get("properties", {}))
    text = next(m for m in models.models if m.kind == "text")
    async with internal_channel(stack, stack.diffusion.address) as channel:
        limits = await diffusion_pb2_grpc.DiffusionStub(channel).Describe(
            diffusion_pb2.DescribeDiffusionRequest(), timeout=10
        )
    return Known(
        samplers=[s.name for s in listing.samplers], params=sorted(params), vocab_size=text.vocab_size,
        context_length=text.context_length, image_limits=limits, greedy=await greedy_ids(stack.gateway.address),
    )  # fmt: skip


@pytest.fixture(scope="session")
def known(fuzz_stack) -> Known:
    return asyncio.run(_known(fuzz_stack))


def unharmed(stack, known: Known) -> None:
    """Every process alive and serving, and the greedy generation as before the fuzzing."""
    for process in stack.processes():
        assert process.alive(), f"{process.name} died:\n{process.log_tail()}"
    for process in stack.services():
        with grpc.insecure_channel(process.address) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING, process.name
    assert asyncio.run(greedy_ids(stack.gateway.address)) == known.greedy
    for process in stack.services():
        log = process.log_path.read_text(errors="replace")
        assert "Traceback" not in log, f"{process.name} logged a traceback:\n{process.log_tail(80)}"


def pytest_terminal_summary(terminalreporter):
    if not TALLY:
        return
    terminalreporter.section(f"fuzz outcomes ({EXAMPLES} examples per test)")
    for surface in sorted(TALLY):
        counts = ", ".join(f"{outcome} {n}" for outcome, n in TALLY[surface].most_common())
        terminalreporter.write_line(f"{surface}: {counts}")
        for message, n in DETAILS[surface].most_common(5):
            terminalreporter.write_line(f"    {n:4d} {message}")
    path = os.environ.get("MUESTRA_FUZZ_REPORT")
    if path:
        with open(path, "w") as out:
            json.dump({"examples": EXAMPLES, "surfaces": {s: dict(c) for s, c in TALLY.items()}}, out, indent=2)
