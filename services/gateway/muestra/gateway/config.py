"""Gateway settings (flags or MUESTRA_GATEWAY_* / MUESTRA_* variables)."""

from __future__ import annotations

import dataclasses

from muestra.runtime import ServiceConfig
from muestra.runtime.config import RedisConfig, secret


def _f(default, help_text: str):
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass
class GatewayConfig(ServiceConfig, RedisConfig):
    tokenizer_addr: str = _f("", "tokenizer service address of the default text model (empty: 127.0.0.1:50052)")
    lm_addr: str = _f(
        "",
        "lm replicas, comma-separated host:port; a name that resolves to several addresses (compose --scale, "
        "a Kubernetes headless Service) is one replica per address, re-resolved every health interval "
        "(empty: 127.0.0.1:50053, or no text model when only --diffusion-addr is given)",
    )
    diffusion_addr: str = _f("", "diffusion service address (empty: no image model)")
    models_config: str = _f("", "JSON file mapping model names to endpoints (several models)")
    api_keys: str = secret(
        "", "comma-separated API keys; when set, every RPC, HTTP route and /metrics but health needs one"
    )
    max_queue: int = _f(256, "requests waiting for admission per lm replica before RESOURCE_EXHAUSTED")
    max_batch_rows: int = _f(32, "rows the gateway keeps in one lm replica's running batch")
    max_prompt_bytes: int = _f(256 * 1024, "longest prompt (or all chat messages together), in UTF-8 bytes")
    max_n: int = _f(16, "most completions per request (n) and most beams")
    max_stop_strings: int = _f(16, "most stop strings per request")
    max_stop_bytes: int = _f(256, "longest stop string, in UTF-8 bytes")
    max_top_logprobs: int = _f(20, "most alternatives per token with logprobs")
    max_constraint_bytes: int = _f(
        256 * 1024, "largest constraint (a JSON Schema's text, a regex or a grammar), in UTF-8 bytes"
    )
    json_endings: bool = _f(
        True,
        "a JSON-constrained answer (json_object, json_schema) that comes within a few tokens, or the last fifth, of "
        "its max_tokens while still open is steered to close its strings and brackets, so it ends valid (finish "
        "stop) instead of being cut mid-value; false: it is cut where max_tokens falls (finish length)",
    )
    constraint_compile_timeout_s: float = _f(10.0, "longest a request's constraint may take to compile")
    constraint_mask: str = _f(
        "lm",
        "where a constrained row's allowed-token mask is applied: lm (the lm masks its logits before its argmax, "
        "so greedy rows still ship no logits) or gateway (the row ships full logits and the gateway masks them)",
    )
    greedy_burst: int = _f(
        8,
        "steps the lm runs in one Decode when every row of the batch is greedy, or sampled with a chain the lm runs "
        "itself (sampled bursts), unconstrained, without stop strings, and no request waits (the lm feeds each pick "
        "back itself; tokens then stream in bursts). 1: a Decode per token",
    )
    greedy_burst_ms: float = _f(
        100.0, "a burst is cut to the steps that the replica's recent step times say fit in this many milliseconds"
    )
    row_invariant: str = _f(
        "seeded",
        "which requests get every token bitwise the same in any batch (their seed's tokens do not depend on what else "
        "runs): seeded (sampled requests that give a seed), all (greedy and unseeded ones too), or off. Only the "
        "steps where such a request runs alone cost more, ~1.7x on the default model (the lm's --row-invariant)",
    )
    speculation: str = _f(
        "off",
        "draft proposer of requests that name none (speculative decoding; the text for a seed is the same either "
        "way but for near-ties, docs/speculative.md): a registered proposer's name such as ngram, or off",
    )
    speculation_params: str = _f(
        "",
        'params of --speculation\'s proposer as a JSON object, such as {"model": "smollm2-int4"} for draft_model; a '
        "request that names its own proposer gives its own",
    )
    startup_timeout_s: float = _f(120.0, "how long to wait for the backend services at start")
    affinity_tokens: int = _f(32, "prompts sharing this many leading tokens go to the same lm replica")
    health_interval_s: float = _f(2.0, "seconds between health checks (and DNS lookups) of lm replicas")
    health_timeout_s: float = _f(1.0, "a replica whose health check takes longer is taken out")
    lm_timeout_s: float = _f(
        120.0,
        "longest wait for an lm replica to answer a Prefill or a decode step; past it the replica's requests "
        "fail (or move, if they have streamed nothing) and it leaves the rotation until its health check passes",
    )
    tokenizer_timeout_s: float = _f(
        30.0, "longest wait for the tokenizer to answer one call; past it the requests waiting on it fail (UNAVAILABLE)"
    )
    diffusion_timeout_s: float = _f(
        900.0, "longest an image request may take at the diffusion service (a shorter client deadline wins)"
    )
    watchdog_s: float = _f(
        300.0,
        "a scheduler that has work and makes no progress this long turns the gateway's health NOT_SERVING and logs "
        "what it waits for (0: off)",
    )
    prefix_cache_block_size: int = _f(32, "tokens per prefix-cache block (0: no prefix cache)")
    prefix_cache_key_prefix: str = _f("muestra:kv:", "prefix of the cache's Redis keys (the lm's must match)")
    responses_ttl_s: float = _f(
        30 * 24 * 3600.0, "how long a stored /v1/responses response (and its conversation) is kept, in seconds"
    )
    responses_max_stored: int = _f(
        10000, "stored responses kept in process when there is no --redis-url (the oldest go first)"
    )
    responses_max_stored_mib: int = _f(
        256, "most memory the stored responses take in process when there is no --redis-url (the oldest go first)"
    )
    responses_key_prefix: str = _f("muestra:resp:", "prefix of the stored responses' Redis keys")
    responses_redis_url: str = _f(
        "",
        "Redis for stored responses, when not --redis-url's (a cache with allkeys-lru may evict them before their TTL "
        "under the KV blocks' pressure: point this at a Redis with persistence and noeviction to keep them); its "
        "password goes in the URL (redis://:PASSWORD@host:port/db; MUESTRA_GATEWAY_RESPONSES_REDIS_URL keeps it off "
        "the command line)",
    )
    http_port: int = _f(8000, "OpenAI-compatible HTTP API port (0: pick a free one, -1: off)")
    http_host: str = _f("", "address the HTTP API binds (empty: the same as --host)")
    http_max_body_bytes: int = _f(8 * 1024 * 1024, "largest HTTP request body, in bytes (413 beyond it)")
    http_body_timeout_s: float = _f(
        60.0, "longest an HTTP request body may take to arrive, from its headers to its last byte (408 beyond it)"
    )
