"""Read-only JSON listings: OpenAI's /v1/models, and those the playground reads (muestra extensions):
/v1/samplers, /v1/schedulers and the gateway's state at /v1/status.

Each is what the gRPC API or the gateway's metrics already say, as JSON; every one needs the API key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import grpc
from fastapi import APIRouter, Request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from muestra.gateway.engine.clients import DiffusionClient
from muestra.gateway.engine.sampling import default_specs
from muestra.gateway.http.errors import OpenAIError
from muestra.gateway.http.state import EngineDep
from muestra.v1 import diffusion_pb2

log = logging.getLogger("muestra.gateway.openai")
router = APIRouter(prefix="/v1")
# As ListPlugins waits for a diffusion service's schedulers.
LIST_TIMEOUT_S = 5.0


def _tokens(counter: str, model: str) -> int:
    """A token counter of the prefix cache (prefix.QUERIES, prefix.HITS) for one model."""
    return int(REGISTRY.get_sample_value(counter, {"model": model}) or 0)


async def _serving(channel, timeout_s: float) -> bool:
    """Whether the service behind `channel` answers its gRPC health check with SERVING within timeout_s."""
    if channel is None:
        return False
    try:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


async def _schedulers(model) -> list[diffusion_pb2.SchedulerInfo] | None:
    try:
        return await DiffusionClient(model, LIST_TIMEOUT_S).schedulers()
    except grpc.aio.AioRpcError as exc:
        log.warning("/v1/schedulers: the diffusion service of %r did not answer (%s)", model.name, exc.code().name)
        return None


async def _model_cards(engine, created: int) -> list[dict]:
    cards = []
    for m in engine.models():
        card = {"id": m.name, "object": "model", "created": created, "owned_by": "muestra", "kind": m.kind}
        if m.kind == "text":
            card.update(max_model_len=m.context_length, vocab_size=m.vocab_size, replicas=m.replicas)
            # The chain a request without `samplers` gets, from the model's generation_config.json (the playground's).
            card["default_samplers"] = default_specs(engine.registry.text[m.name].generation_config)
        cards.append(card)
    return cards


@router.get("/models")
async def list_models(http: Request, engine: EngineDep) -> dict:
    return {"object": "list", "data": await _model_cards(engine, http.app.state.created)}


@router.get("/models/{model:path}")
async def retrieve_model(model: str, http: Request, engine: EngineDep) -> dict:
    cards = await _model_cards(engine, http.app.state.created)
    for card in cards:
        if card["id"] == model:
            return card
    known = ", ".join(card["id"] for card in cards) or "none"
    raise OpenAIError(404, f"model: unknown model {model!r}; known: {known}", param="model", code="model_not_found")


@router.get("/samplers")
async def samplers(engine: EngineDep) -> dict:
    return {
        "object": "list",
        "data": [
            {
                "name": entry.sampler.name,
                "plugin": entry.plugin,
                "distribution": entry.distribution,
                "version": entry.version,
                "description": entry.sampler.description,
                # sorted keys, as ListSamplers' parameter_schema
                "parameters": json.loads(json.dumps(entry.sampler.parameter_schema, sort_keys=True)),
                "argmax_invariant": entry.sampler.argmax_invariant,
                "kind": entry.kind,  # where a chain may place it
            }
            for entry in engine.samplers.list()
        ],
    }


@router.get("/schedulers")
async def schedulers(engine: EngineDep) -> dict:
    found: dict[str, dict] = {}
    unanswered = []
    models = list(engine.registry.image.values())
    replies = await asyncio.gather(*(_schedulers(model) for model in models))
    for model, reply in zip(models, replies, strict=True):
        if reply is None:  # the others are still worth listing: say whose schedulers are missing instead
            unanswered.append(model.name)
            continue
        for s in reply:
            entry = found.setdefault(
                s.name,
                {
                    "name": s.name,
                    "aliases": list(s.aliases),
                    "plugin": s.plugin,
                    "distribution": s.distribution,
                    "version": s.version,
                    "models": [],
                },
            )
            entry["models"].append(model.name)
    return {"object": "list", "data": list(found.values()), "unanswered_image_models": unanswered}


def _replica(scheduler) -> dict:
    """One lm replica of a text model, as /v1/status shows it."""
    return {
        "address": scheduler.replica.address,
        "healthy": scheduler.healthy,
        "requests_running": scheduler.running_requests(),
        "requests_waiting": len(scheduler.waiting),
        "rows_running": scheduler.rows_running(),
    }


@router.get("/status")
async def status(http: Request, engine: EngineDep) -> dict:
    models = []
    running = waiting = 0
    query_tokens = hit_tokens = 0
    enabled = False
    for model in engine.registry.text.values():
        replicas = [_replica(scheduler) for scheduler in list(engine.routers[model.name].schedulers.values())]
        running += sum(replica["requests_running"] for replica in replicas)
        waiting += sum(replica["requests_waiting"] for replica in replicas)
        if model.prefix_cache is not None:
            enabled = True
            query_tokens += _tokens("muestra_prefix_cache_queries_total", model.name)
            hit_tokens += _tokens("muestra_prefix_cache_hits_total", model.name)
        models.append(
            {"name": model.name, "kind": "text", "context_length": model.context_length, "replicas": replicas}
        )
    images = list(engine.registry.image.values())
    timeout_s = engine.config.health_timeout_s
    health = await asyncio.gather(*(_serving(m.channel, timeout_s) for m in images))
    for model, healthy in zip(images, health, strict=True):
        models.append(
            {"name": model.name, "kind": "image", "replicas": [{"address": model.address, "healthy": healthy}]}
        )
    return {
        "models": models,
        "requests": {"running": running, "waiting": waiting},
        "prefix_cache": {
            "enabled": enabled,
            "query_tokens": query_tokens,
            "hit_tokens": hit_tokens,
            "hit_rate": hit_tokens / query_tokens if enabled and query_tokens else None,
        },
        "uptime_s": time.monotonic() - http.app.state.started,
        # The playground's gRPC example targets it; None when the gateway was told to pick a free port (--port 0).
        "grpc_port": engine.config.port or None,
    }
