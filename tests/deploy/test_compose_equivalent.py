"""docker-compose.yml's stack, run as local processes with the commands, environment and health checks that
Compose and the Dockerfile's targets give each container (tests/deploy/compose_local.py), with lm scaled to 2.

No container is built or run here (these machines have no Docker engine): what this checks is that the
configuration the files carry starts a working stack. The compose secrets (internal token, cache key, Redis
password) are in place, as files at the paths the services are given, with values made up for this run.

The stack serves the models the images serve: the default text model that the lm and tokenizer images build into
themselves is models/smollm2-135m-instruct as `make default-model` builds it, and the image model is
./models/muestra-image, as compose mounts it. Its greedy text must equal transformers' generate on the GGUF the
default model was imported from, and its images a bare diffusers pipeline on the same folder. Where the default
text model is not built, the text fixture (models/tiny-text-fixture) stands in for it under the image's folder
name, so the tests of the deployment files still run; the comparison with transformers then skips (and fails
under CI=true, as the other tests of the default model do).
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import redis

from muestra.client import Client
from tests.deploy.compose_local import REPO, LocalCompose, environment_of, grace_seconds, load_compose, parse_dockerfile
from tests.fixtures.default_model import DEFAULT_MODEL, SOURCE_GGUF, default_model_or_skip
from tests.harness import free_port

PROMPT = "The quick brown fox"
LM_REPLICAS = 2
# Longer than two prefix-cache blocks (32 tokens each, the gateway's default).
LONG_PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 12)
# A secret as a flag (visible in ps), or its file given as one; the stack passes them as MUESTRA_*_FILE.
SECRET_FLAG = re.compile(r"--(requirepass|api-keys|internal-token|cache-key|redis-password)\b")
SECRETS = {
    "internal_token": secrets.token_hex(24),
    "cache_key": secrets.token_hex(24),
    "redis_password": secrets.token_hex(24),
    "api_keys": "",  # as `touch secrets/api_keys` leaves it: the gateway asks for no key
}


TEXT_FIXTURE = REPO / "models" / "tiny-text-fixture"
# The folder the lm and tokenizer images copy from the Dockerfile's default-text-model stage.
(DEFAULT_TEXT_MODEL,) = parse_dockerfile(REPO / "Dockerfile", "lm").built_in


def models_root(request, root: Path) -> tuple[Path, Path]:
    """A folder laid out like ./models: the repository's image model where it exists, else a test model.

    Returns the folder and the diffusers folder its muestra-image links to.
    """
    root.mkdir()
    image = REPO / "models" / "muestra-image"
    if not (image / "model_index.json").is_file():
        image = request.getfixturevalue("tiny_sd_model")
    (root / "muestra-image").symlink_to(image)
    return root, image


def default_text_model(folder: Path) -> tuple[Path, bool]:
    """The folder the images build as their default text model, and whether it is that model (not the fixture).

    Where models/smollm2-135m-instruct is not built, a copy of the text fixture under its folder name, which the
    services name the model after (a symlink would not do: the lm names a model after its resolved path).
    """
    if (DEFAULT_MODEL / "model.onnx").is_file() and SOURCE_GGUF.is_file():
        assert DEFAULT_MODEL.name == Path(DEFAULT_TEXT_MODEL).name
        return DEFAULT_MODEL, True
    stand_in = folder / Path(DEFAULT_TEXT_MODEL).name
    shutil.copytree(TEXT_FIXTURE, stand_in)
    return stand_in, False


@pytest.fixture(scope="module")
def stack(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("compose-local")
    root, image_model = models_root(request, workdir / "models")
    text_model, serves_default_text = default_text_model(workdir / "image-files")
    compose = load_compose(REPO / "docker-compose.yml", {"MUESTRA_MODELS": str(root)})
    local = LocalCompose(
        compose, workdir, scale={"lm": LM_REPLICAS}, secret_values=SECRETS, built_in={DEFAULT_TEXT_MODEL: text_model}
    )
    local.image_model = image_model
    local.serves_default_text = serves_default_text
    try:
        local.up()
    except Exception:
        local.down()
        raise
    yield local
    local.down()


@pytest.fixture(scope="module")
def client(stack):
    gateway = stack.containers["gateway"][0]
    with Client(f"127.0.0.1:{gateway.ports['50051']}", timeout=300) as c:
        yield c


def test_lm_replicas_share_one_port_as_compose_scale_gives_them(stack):
    replicas = stack.containers["lm"]
    assert len(replicas) == LM_REPLICAS
    assert len({r.ports["50053"] for r in replicas}) == 1
    gateway_env = stack.containers["gateway"][0].env
    assert gateway_env["MUESTRA_GATEWAY_LM_ADDR"] == ",".join(f"{r.host}:{r.ports['50053']}" for r in replicas)


def test_gateway_serves_text_on_both_lm_replicas_and_the_image_model(client):
    models = {m.kind: m for m in client.list_models()}
    assert set(models) == {"text", "image"}
    assert models["text"].replicas == LM_REPLICAS


def test_lm_and_tokenizer_serve_the_default_text_model_folder_compose_names(stack, client):
    services = stack.services
    folder = environment_of(services["lm"])["MUESTRA_LM_MODEL"]
    assert folder == environment_of(services["tokenizer"])["MUESTRA_TOKENIZER_MODELS"] == DEFAULT_TEXT_MODEL
    name = Path(folder).name
    assert [m.name for m in client.list_models() if m.kind == "text"] == [name]
    from muestra.v1 import tokenizer_pb2, tokenizer_pb2_grpc

    tokenizer = stack.containers["tokenizer"][0]
    with grpc.insecure_channel(f"{tokenizer.host}:{tokenizer.ports['50052']}") as channel:
        token = (("authorization", f"Bearer {SECRETS['internal_token']}"),)
        described = tokenizer_pb2_grpc.TokenizerStub(channel).Describe(
            tokenizer_pb2.DescribeTokenizerRequest(), metadata=token, timeout=30
        )
    assert list(described.models) == [name]


def test_greedy_text_through_the_compose_stack_comes_from_an_lm_replica_the_same_every_time(stack, client):
    runs = [client.generate(PROMPT, max_tokens=12, samplers=[{"name": "greedy"}]).wait() for _ in range(3)]
    for generation in runs:
        completion = generation.completions[0]
        assert completion.error == ""
        assert completion.replica in {f"{r.host}:{r.ports['50053']}" for r in stack.containers["lm"]}
        assert 1 <= len(generation.token_ids[0]) == completion.completion_tokens <= 12
        assert generation.texts[0].strip()
    assert all(generation.token_ids[0] == runs[0].token_ids[0] for generation in runs)


def test_greedy_text_through_the_compose_stack_equals_transformers_generate(stack, client):
    """transformers loads the GGUF the default model was imported from (its dequantized weights), as
    tests/models/test_default_model.py does, and its greedy generate() gives the stack's tokens."""
    default_model_or_skip()  # not built: the text fixture, which has no transformers weights, stands in for it
    assert stack.serves_default_text
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = 12
    tokenizer = AutoTokenizer.from_pretrained(SOURCE_GGUF.parent, gguf_file=SOURCE_GGUF.name)
    model = AutoModelForCausalLM.from_pretrained(SOURCE_GGUF.parent, gguf_file=SOURCE_GGUF.name, dtype=torch.float32)
    prompt_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.eval().generate(
            prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=steps, do_sample=False
        )
    expected = out[0, prompt_ids.shape[1] :].tolist()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    ends = [i for i, token in enumerate(expected) if token in eos_ids]
    expected = expected[: ends[0] + 1] if ends else expected

    assert list(client.tokenize(PROMPT).ids) == prompt_ids[0].tolist()  # the same tokenizer
    generation = client.generate(PROMPT, max_tokens=steps, samplers=[{"name": "greedy"}]).wait()
    assert generation.completions[0].error == ""
    assert generation.token_ids[0] == expected


def test_image_through_the_compose_stack_matches_a_bare_diffusers_pipeline(stack, client):
    from PIL import Image

    steps, seed, size = 3, 11, 64
    progress = []
    images = client.generate_image(
        "a watercolor painting of a lighthouse", width=size, height=size, steps=steps, seed=seed,
        on_progress=progress.append,
    )  # fmt: skip
    assert len(images) == 1
    assert [p.step for p in progress][-1] == steps
    picture = Image.open(io.BytesIO(images[0].png))
    assert picture.format == "PNG"
    assert picture.size == (size, size)
    from tests.fixtures.diffusion_models import ReferencePipeline

    expected = ReferencePipeline(stack.image_model).image(
        prompt="a watercolor painting of a lighthouse", seed=seed, steps=steps, width=size, height=size
    )
    pixels = np.asarray(picture.convert("RGB")).astype(np.int16)
    # The compose stack leaves torch its default thread count; the reference runs on one thread, so sums may
    # round differently: the images agree to within a few levels, while another seed differs by far more.
    assert np.abs(pixels - expected).max() <= 4


def test_openai_http_api_on_the_published_port_gives_the_grpc_greedy_text(stack, client):
    gateway = stack.containers["gateway"][0]
    base = f"http://127.0.0.1:{gateway.ports['8000']}"
    with urllib.request.urlopen(f"{base}/health", timeout=30) as reply:
        assert json.load(reply) == {"status": "ok"}
    body = json.dumps({"model": "", "prompt": PROMPT, "max_tokens": 6, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"{base}/v1/completions", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        http_text = json.load(reply)["choices"][0]["text"]
    grpc_text, _ = client.complete(PROMPT, max_tokens=6, samplers=[{"name": "greedy"}])
    assert http_text == grpc_text


def redis_client(stack, password: str | None) -> redis.Redis:
    server = stack.containers["redis"][0]
    return redis.Redis(server.host, server.ports["6379"], password=password, socket_timeout=10)


def test_redis_runs_with_the_compose_eviction_and_no_persistence(stack):
    server = stack.containers["redis"][0]
    port = str(server.ports["6379"])
    env = {**os.environ, "REDISCLI_AUTH": SECRETS["redis_password"]}

    def config(name: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-h", server.host, "-p", port, "CONFIG", "GET", name], capture_output=True, env=env
        )
        return out.stdout.decode().split("\n")[1]

    assert config("maxmemory-policy") == "allkeys-lru"
    assert int(config("maxmemory")) == 1024**3
    assert config("save") == ""
    assert config("appendonly") == "no"


def test_redis_refuses_a_client_without_the_password(stack):
    with pytest.raises(redis.AuthenticationError):
        redis_client(stack, None).ping()
    with pytest.raises(redis.AuthenticationError):
        redis_client(stack, "not-the-password").ping()
    assert redis_client(stack, SECRETS["redis_password"]).ping() is True


def test_lm_refuses_a_direct_call_without_the_internal_token(stack):
    from muestra.v1 import lm_pb2, lm_pb2_grpc

    replica = stack.containers["lm"][0]
    with grpc.insecure_channel(f"{replica.host}:{replica.ports['50053']}") as channel:
        stub = lm_pb2_grpc.LanguageModelStub(channel)
        for metadata in [(), (("authorization", "Bearer not-the-token"),)]:
            with pytest.raises(grpc.RpcError) as failure:
                stub.Describe(lm_pb2.DescribeModelRequest(), metadata=metadata, timeout=30)
            assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED
        token = (("authorization", f"Bearer {SECRETS['internal_token']}"),)
        assert stub.Describe(lm_pb2.DescribeModelRequest(), metadata=token, timeout=30).ByteSize() > 0


@pytest.mark.parametrize("service", ["tokenizer", "lm", "diffusion"])
def test_internal_metrics_need_the_internal_token(stack, service):
    container = stack.containers[service][0]
    url = f"http://{container.host}:{container.ports['9090']}/metrics"
    with pytest.raises(urllib.error.HTTPError) as failure:
        urllib.request.urlopen(url, timeout=30)
    assert failure.value.code == 401
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {SECRETS['internal_token']}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert b"# TYPE" in reply.read()


def test_lm_replicas_share_prefix_cache_blocks_in_the_password_protected_redis(stack, client):
    """The lm writes blocks to Redis with the password and keys their MAC with the shared cache key; a prompt
    sent again is then served from the cache (the lm only stores a block seen twice)."""
    cache = redis_client(stack, SECRETS["redis_password"])
    completions = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        generation = client.generate(LONG_PROMPT, max_tokens=2, samplers=[{"name": "greedy"}]).wait()
        completions.append(generation.completions[0])
        assert completions[-1].error == ""
        if completions[-1].cached_tokens > 0 and len(completions) >= 3:
            break
        time.sleep(0.5)
    assert cache.keys("muestra:kv:*"), "no prefix-cache block reached Redis"
    assert max(c.cached_tokens for c in completions) >= 32, [(c.replica, c.cached_tokens) for c in completions]


def stack_processes(stack) -> dict[int, str]:
    """pid -> command line of every process of the stack (each replica and everything it started)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    todo = [c.proc.pid for replicas in stack.containers.values() for c in replicas if c.proc.poll() is None]
    found = {}
    while todo:
        pid = todo.pop()
        try:
            cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
            found[pid] = cmdline.replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        todo += children.get(pid, [])
    return found


def test_no_process_of_the_stack_has_a_secret_on_its_command_line(stack):
    processes = stack_processes(stack)
    assert len(processes) >= sum(stack.scale.values())
    # The redis replica is redis-server itself: the shell exec'd it with the config on its standard input.
    redis_pid = stack.containers["redis"][0].proc.pid
    assert Path(f"/proc/{redis_pid}/comm").read_text().strip() == "redis-server"
    for pid, cmdline in processes.items():
        for name, value in SECRETS.items():
            if value:
                assert value not in cmdline, f"{name} on the command line of pid {pid}: {cmdline[:200]}"
        assert not SECRET_FLAG.search(cmdline), cmdline


def test_image_healthcheck_fails_when_nothing_serves():
    result = subprocess.run(
        [sys.executable, "-m", "muestra.runtime.healthcheck", f"127.0.0.1:{free_port()}", "--timeout", "1"],
        capture_output=True,
    )
    assert result.returncode == 1
    assert b"UNAVAILABLE" in result.stderr


def test_every_service_stops_cleanly_within_its_stop_grace_period(stack):
    """Last in this module: SIGTERM, as `docker compose down` sends it, ends every process with status 0."""
    graces = {name: grace_seconds(service.get("stop_grace_period", "10s")) for name, service in stack.services.items()}
    codes = stack.down()
    assert all(graces[name] >= 10 for name in ("tokenizer", "lm", "diffusion", "gateway"))
    assert codes == {name: [0] * stack.scale[name] for name in stack.services}
