"""Which model names the gateway serves, and the tokenizer, lm and diffusion endpoints behind each."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import logging
import socket
from collections.abc import Sequence
from pathlib import Path

import grpc

from muestra.gateway.engine.clients.kv_budget import KvBudget
from muestra.gateway.engine.prefix import LookupHealth, PrefixLookup, open_redis
from muestra.runtime.channels import service_channel
from muestra.runtime.errors import NotFound
from muestra.runtime.logs import without_password
from muestra.v1 import diffusion_pb2, diffusion_pb2_grpc, lm_pb2, lm_pb2_grpc, tokenizer_pb2, tokenizer_pb2_grpc

log = logging.getLogger("muestra.gateway.backends")


def expand_target(target: str) -> list[str]:
    """host:port → one address per IP the name resolves to (an IP, or an unresolvable name, as is)."""
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        return [target]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return [target]
    addresses = sorted({info[4][0] for info in infos})
    if len(addresses) <= 1:
        return [target]
    return [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in addresses]


@dataclasses.dataclass
class LmReplica:
    address: str
    stub: lm_pb2_grpc.LanguageModelStub
    channel: grpc.aio.Channel
    # Most greedy steps one Decode may run there (its Describe's max_greedy_steps; 1 until known).
    max_greedy_steps: int = 1
    # Its KV layout and budget (its Describe's; None: admitted by row count alone).
    kv: KvBudget | None = None
    # Most draft tokens one row may have verified there per Decode (its Describe's; 0: none).
    max_draft_tokens: int = 0
    # The samplers it runs itself in sampled bursts, as (name, distribution, version) (lm_samplers()).
    samplers: frozenset[tuple[str, str, str]] = frozenset()

    def described(self, info: lm_pb2.DescribeModelResponse) -> None:
        """Take the limits its Describe gives (at start, and when it comes back from a restart)."""
        self.max_greedy_steps = max(1, info.max_greedy_steps)
        self.max_draft_tokens = info.max_draft_tokens
        self.kv = KvBudget.from_describe(info)
        self.samplers = lm_samplers(info)


def lm_samplers(info: lm_pb2.DescribeModelResponse) -> frozenset[tuple[str, str, str]]:
    """The samplers an lm runs in sampled bursts. None when it names no EOS ids: the gateway then validates chains
    against the tokenizer's, and the lm, validating them again against its own model, might read them otherwise."""
    if not info.eos_token_ids:
        return frozenset()
    return frozenset((s.name, s.distribution, s.version) for s in info.samplers)


@dataclasses.dataclass
class TextModel:
    name: str
    tokenizer: tokenizer_pb2_grpc.TokenizerStub
    tokenizer_model: str
    replicas: list[LmReplica]
    # The lm targets as configured (names that may resolve to several replicas).
    targets: tuple[str, ...] = ()
    # From the lm and tokenizer services' Describe.
    vocab_size: int = 0
    context_length: int = 0
    eos_token_ids: tuple[int, ...] = ()
    generation_config: dict = dataclasses.field(default_factory=dict)
    fingerprint: str = ""
    has_chat_template: bool = False
    # Ids the tokenizer knows; a model's embedding table is often padded past it. Ids beyond it
    # decode to no text (as transformers' tokenizers decode them).
    tokenizer_vocab_size: int = 0
    # Ids no request picks unless it allows special tokens: the tokenizer's special ids and those past its
    # vocabulary, less EOS (special_token_ids()).
    special_token_ids: tuple[int, ...] = ()
    # Finds a prompt's cached prefix (None: the prefix cache is off).
    prefix_cache: PrefixLookup | None = None


def special_token_ids(model: TextModel, tokenizer_special: Sequence[int]) -> tuple[int, ...]:
    """The ids that are special but do not end text: the tokenizer's special ids and the model's ids past the
    tokenizer's vocabulary (padding rows of its embedding table), less the model's EOS ids."""
    padding = range(model.tokenizer_vocab_size, model.vocab_size)
    ends = set(model.eos_token_ids)
    return tuple(sorted(i for i in {*tokenizer_special, *padding} if i < model.vocab_size and i not in ends))


@dataclasses.dataclass
class ImageModel:
    name: str
    address: str
    stub: diffusion_pb2_grpc.DiffusionStub
    schedulers: list[str] = dataclasses.field(default_factory=list)
    # Every name a request may use for a scheduler: the registered names and their aliases.
    scheduler_names: set[str] = dataclasses.field(default_factory=set)
    # The channel of `stub` (its health checks go over it too).
    channel: grpc.aio.Channel | None = None


def _endpoints_from_config(config) -> tuple[dict, dict]:
    """{name: {tokenizer, tokenizer_model, lm: [...]}} and {name: {diffusion}} from the settings."""
    if config.models_config:
        spec = json.loads(Path(config.models_config).read_text())
        return spec.get("text", {}), spec.get("image", {})
    lm = [a.strip() for a in config.lm_addr.split(",") if a.strip()]
    if not lm and not config.diffusion_addr:
        lm = [DEFAULT_LM_ADDR]
    # With only --diffusion-addr given, the gateway serves images alone.
    text = {"": {"tokenizer": config.tokenizer_addr or DEFAULT_TOKENIZER_ADDR, "lm": lm}} if lm else {}
    image = {"": {"diffusion": config.diffusion_addr}} if config.diffusion_addr else {}
    return text, image


DEFAULT_LM_ADDR = "127.0.0.1:50053"
DEFAULT_TOKENIZER_ADDR = "127.0.0.1:50052"
# A backend not connected within this long at start-up gets one warning line; the gateway waits on.
_QUIET_S = 1.0


class BackendError(Exception):
    """A backend the gateway was told to use cannot be used; the message says which and what to change."""


async def _call_at_startup(what: str, setting: str, deadline: float, channel: grpc.aio.Channel, method, request):
    """method(request), waiting (wait_for_ready) until `deadline` for the backend; a BackendError naming `setting`."""
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(channel.channel_ready(), max(0.0, min(_QUIET_S, deadline - loop.time())))
    except TimeoutError:
        log.warning("waiting up to %.0f s for %s; %s sets its address", deadline - loop.time(), what, setting)
    try:
        return await method(request, timeout=max(0.001, deadline - loop.time()), wait_for_ready=True)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            problem = "did not answer within --startup-timeout-s; check that it runs"
        else:
            problem = f"answered {exc.code().name} ({exc.details()}); check its settings"
        raise BackendError(f"{what} {problem}, or change {setting}") from None


def _model(models: dict, name: str, default: str, kind: str):
    """The model served as `name` ("" for `default`), or NotFound naming the known ones."""
    model = models.get(name or default)
    if model is None:
        known = ", ".join(sorted(models)) or "none"
        raise NotFound(f"model: unknown {kind} model {name!r}; known: {known}")
    return model


class ModelRegistry:
    def __init__(self) -> None:
        self.text: dict[str, TextModel] = {}
        self.image: dict[str, ImageModel] = {}
        self.default_text = ""
        self.default_image = ""
        self._channels: list[grpc.aio.Channel] = []
        self._redis = None
        self.internal_token = ""

    def _channel(self, address: str, max_message_bytes: int) -> grpc.aio.Channel:
        channel = service_channel(address, max_message_bytes, self.internal_token)
        self._channels.append(channel)
        return channel

    async def connect(self, config) -> None:
        """Describe every endpoint (waiting up to startup_timeout_s for each) and name the models."""
        deadline = asyncio.get_running_loop().time() + config.startup_timeout_s
        self.internal_token = config.internal_token
        text_spec, image_spec = _endpoints_from_config(config)
        from_file = f"the models config {config.models_config}" if config.models_config else ""
        lm_setting = from_file or "--lm-addr (MUESTRA_GATEWAY_LM_ADDR)"
        tokenizer_setting = from_file or "--tokenizer-addr (MUESTRA_GATEWAY_TOKENIZER_ADDR)"
        diffusion_setting = from_file or "--diffusion-addr (MUESTRA_GATEWAY_DIFFUSION_ADDR)"
        prefix_health = None
        if config.prefix_cache_block_size > 0 and config.redis_url:
            self._redis = open_redis(config.redis_url, config.redis_timeout_s, config.redis_password)
            prefix_health = LookupHealth(f"Redis at {without_password(config.redis_url)}")
        for name, spec in text_spec.items():
            tokenizer_channel = self._channel(spec["tokenizer"], config.max_message_bytes)
            tokenizer = tokenizer_pb2_grpc.TokenizerStub(tokenizer_channel)
            addresses = [address for target in spec["lm"] for address in expand_target(target)]
            channels = [self._channel(addr, config.max_message_bytes) for addr in addresses]
            replicas = [
                LmReplica(addr, lm_pb2_grpc.LanguageModelStub(channel), channel)
                for addr, channel in zip(addresses, channels, strict=True)
            ]
            lm_info = await _call_at_startup(
                f"the lm service at {spec['lm'][0]}", lm_setting, deadline,
                replicas[0].channel, replicas[0].stub.Describe, lm_pb2.DescribeModelRequest(),
            )  # fmt: skip
            replicas[0].described(lm_info)
            tok_model = spec.get("tokenizer_model", "")
            tok_info = await _call_at_startup(
                f"the tokenizer service at {spec['tokenizer']}", tokenizer_setting, deadline,
                tokenizer_channel, tokenizer.Describe, tokenizer_pb2.DescribeTokenizerRequest(model=tok_model),
            )  # fmt: skip
            model = TextModel(
                name=name or lm_info.model,
                tokenizer=tokenizer,
                tokenizer_model=tok_info.model,
                replicas=replicas,
                vocab_size=lm_info.vocab_size,
                context_length=lm_info.context_length,
                eos_token_ids=tuple(lm_info.eos_token_ids) or tuple(tok_info.eos_token_ids),
                generation_config=json.loads(lm_info.generation_config_json or "{}"),
                fingerprint=lm_info.fingerprint,
                has_chat_template=tok_info.has_chat_template,
                tokenizer_vocab_size=tok_info.vocab_size,
                targets=tuple(spec["lm"]),
            )
            model.special_token_ids = special_token_ids(model, tok_info.special_token_ids)
            for replica in replicas[1:]:
                other = await _call_at_startup(
                    f"the lm service at {replica.address}", lm_setting, deadline,
                    replica.channel, replica.stub.Describe, lm_pb2.DescribeModelRequest(),
                )  # fmt: skip
                replica.described(other)  # its own limits and the samplers it runs, as the first replica's
                if other.fingerprint != model.fingerprint:
                    raise BackendError(
                        f"lm replicas of {model.name} serve different models ({replica.address} differs); "
                        f"check {lm_setting}"
                    )
            if config.prefix_cache_block_size > 0:
                model.prefix_cache = PrefixLookup(
                    model.name, model.fingerprint, config.prefix_cache_block_size,
                    config.prefix_cache_key_prefix, self._redis, prefix_health, config.redis_timeout_s,
                )  # fmt: skip
            self.text[model.name] = model
            self.default_text = self.default_text or model.name
            log.info(
                "text model %s: %d replica(s), context %d, vocab %d",
                model.name,
                len(replicas),
                model.context_length,
                model.vocab_size,
            )
        if config.prefix_cache_block_size <= 0:
            log.info("prefix cache: off (prefix_cache_block_size 0)")
        elif prefix_health is not None:
            log.info(
                "prefix cache: lookups in %s, blocks of %d tokens", prefix_health.where, config.prefix_cache_block_size
            )
        else:
            log.info(
                "prefix cache: no --redis-url; each lm replica keeps its own blocks in process (blocks of %d tokens)",
                config.prefix_cache_block_size,
            )
        for name, spec in image_spec.items():
            channel = self._channel(spec["diffusion"], config.max_message_bytes)
            stub = diffusion_pb2_grpc.DiffusionStub(channel)
            what = f"the diffusion service at {spec['diffusion']}"
            info = await _call_at_startup(
                what, diffusion_setting, deadline, channel, stub.Describe, diffusion_pb2.DescribeDiffusionRequest()
            )
            schedulers = await _call_at_startup(
                what, diffusion_setting, deadline, channel, stub.ListSchedulers, diffusion_pb2.ListSchedulersRequest()
            )
            names = {n for s in schedulers.schedulers for n in (s.name, *s.aliases)}
            model = ImageModel(
                name or info.model, spec["diffusion"], stub, [s.name for s in schedulers.schedulers], names, channel
            )
            self.image[model.name] = model
            self.default_image = self.default_image or model.name
            log.info("image model %s at %s", model.name, spec["diffusion"])

    def text_model(self, name: str) -> TextModel:
        return _model(self.text, name, self.default_text, "text")

    def image_model(self, name: str) -> ImageModel:
        return _model(self.image, name, self.default_image, "image")

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
        for channel in self._channels:
            await channel.close()
        for model in self.text.values():
            for replica in model.replicas:
                await replica.channel.close()
