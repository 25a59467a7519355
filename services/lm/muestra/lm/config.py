"""Settings of the lm service."""

from __future__ import annotations

import dataclasses

from muestra.runtime import ServiceConfig
from muestra.runtime.config import RedisConfig, secret, setting


@dataclasses.dataclass
class LmConfig(ServiceConfig, RedisConfig):
    model: str = setting("", "model folder (model.onnx, config.json, generation_config.json, tokenizer)")
    model_name: str = setting("", "name reported by Describe (default: the folder's name)")
    providers: str = setting(
        "auto", "onnxruntime execution providers by priority (cuda, cpu or full names); auto: CUDA if any"
    )
    intra_op_threads: int = setting(0, "onnxruntime intra-op threads (0: onnxruntime's default)")
    intra_op_spinning: bool = setting(
        True,
        "onnxruntime's intra-op threads spin between operators (fastest alone); false where other "
        "processes share the cores, such as a draft model's lm beside its target's",
    )
    max_batch_rows: int = setting(64, "largest number of rows one batch may hold")
    kv_budget_bytes: int = setting(4 << 30, "bytes of KV cache (plus prefill logits) the service may hold at once")
    context_length: int = setting(0, "longest prompt plus generation (0: from config.json; may only lower it)")
    max_top_n: int = setting(64, "largest top_n a TOP_N output may ask for")
    max_tokens_per_row: int = setting(32, "most tokens one row may append in one Decode (DecodeRequest.tokens_per_row)")
    max_greedy_steps: int = setting(64, "most greedy steps one Decode may run (DecodeRequest.greedy_steps)")
    samplers: bool = setting(
        True,
        "run sampled rows' sampler chains here, several tokens per Decode (sampled bursts), with the "
        "installed sampler plugins that declare runs_in_lm; off: the gateway runs every chain",
    )
    row_invariant: bool = setting(
        True,
        "on CPU, give every row bitwise the same logits in any batch: steps whose activation rows would "
        "take a one-row kernel (float-activation 4-bit layers) run the several-row ones; a lone row's step only "
        "when its Decode asks (DecodeRequest.row_invariant, ~1.7x that step)",
    )
    max_draft_tokens: int = setting(
        16, "most draft tokens one row may have verified in one Decode (DecodeBatch.draft_lengths)"
    )
    batch_idle_s: float = setting(
        300.0,
        "a batch no call has used for this long is freed (its caller left without a Clear); 0: never. "
        "A batch also goes when the step stream of the lease it was created under breaks",
    )
    prefix_cache: bool = setting(True, "reuse prompt-prefix KV blocks (in Redis at --redis-url, else in process)")
    cache_key: str = secret(
        "",
        "secret that keys the MAC on prefix-cache blocks; replicas sharing a Redis need the same one "
        "(empty: a random key per process)",
    )
    # The lm's calls move whole KV blocks, so it waits longer than RedisConfig's 0.25 s.
    redis_timeout_s: float = setting(0.5, "Redis connect and socket timeout; a slower call is a miss")
    prefix_cache_key_prefix: str = setting("muestra:kv:", "prefix of the cache's Redis keys (one namespace per tenant)")
    prefix_cache_ttl_s: int = setting(86400, "seconds a cached block lives (0: until evicted)")
    prefix_cache_memory_bytes: int = setting(
        1 << 30, "bytes of blocks the in-process cache holds (without --redis-url)"
    )
    prefix_cache_min_sightings: int = setting(
        2,
        "store a prompt's block once this many prompts holding it were prefilled here (2: a one-off "
        "prompt is never stored; 1: store everything on first sight); a finished row's blocks, its prompt's "
        "and its answer's, are stored on first sight",
    )
    hot_tier: bool = setting(
        True,
        "keep the KV of finished rows (prompt and answer) in the KV budget's free room, for the next "
        "prompt that starts with them (a conversation's next turn); live rows evict it",
    )
    prefill_chunk_tokens: int = setting(
        128,
        "a prompt longer than this is prefilled in chunks of this many tokens, with the running rows' "
        "decode steps between them (0: in one forward)",
    )
