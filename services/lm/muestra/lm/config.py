"""Settings of the lm service."""

from __future__ import annotations

import dataclasses

from muestra.runtime import ServiceConfig
from muestra.runtime.config import RedisConfig, secret


@dataclasses.dataclass
class LmConfig(ServiceConfig, RedisConfig):
    model: str = dataclasses.field(
        default="", metadata={"help": "model folder (model.onnx, config.json, generation_config.json, tokenizer)"}
    )
    model_name: str = dataclasses.field(
        default="", metadata={"help": "name reported by Describe (default: the folder's name)"}
    )
    providers: str = dataclasses.field(
        default="auto",
        metadata={"help": "onnxruntime execution providers by priority (cuda, cpu or full names); auto: CUDA if any"},
    )
    intra_op_threads: int = dataclasses.field(
        default=0, metadata={"help": "onnxruntime intra-op threads (0: onnxruntime's default)"}
    )
    intra_op_spinning: bool = dataclasses.field(
        default=True,
        metadata={
            "help": "onnxruntime's intra-op threads spin between operators (fastest alone); false where other "
            "processes share the cores, such as a draft model's lm beside its target's"
        },
    )
    max_batch_rows: int = dataclasses.field(default=64, metadata={"help": "largest number of rows one batch may hold"})
    kv_budget_bytes: int = dataclasses.field(
        default=4 << 30, metadata={"help": "bytes of KV cache (plus prefill logits) the service may hold at once"}
    )
    context_length: int = dataclasses.field(
        default=0, metadata={"help": "longest prompt plus generation (0: from config.json; may only lower it)"}
    )
    max_top_n: int = dataclasses.field(default=64, metadata={"help": "largest top_n a TOP_N output may ask for"})
    max_tokens_per_row: int = dataclasses.field(
        default=32, metadata={"help": "most tokens one row may append in one Decode (DecodeRequest.tokens_per_row)"}
    )
    max_greedy_steps: int = dataclasses.field(
        default=64, metadata={"help": "most greedy steps one Decode may run (DecodeRequest.greedy_steps)"}
    )
    samplers: bool = dataclasses.field(
        default=True,
        metadata={
            "help": "run sampled rows' sampler chains here, several tokens per Decode (sampled bursts), with the "
            "installed sampler plugins that declare runs_in_lm; off: the gateway runs every chain"
        },
    )
    row_invariant: bool = dataclasses.field(
        default=True,
        metadata={
            "help": "on CPU, give every row bitwise the same logits in any batch: steps whose activation rows would "
            "take a one-row kernel (float-activation 4-bit layers) run the several-row ones; a lone row's step only "
            "when its Decode asks (DecodeRequest.row_invariant, ~1.7x that step)"
        },
    )
    max_draft_tokens: int = dataclasses.field(
        default=16,
        metadata={"help": "most draft tokens one row may have verified in one Decode (DecodeBatch.draft_lengths)"},
    )
    batch_idle_s: float = dataclasses.field(
        default=300.0,
        metadata={
            "help": "a batch no call has used for this long is freed (its caller left without a Clear); 0: never. "
            "A batch also goes when the step stream of the lease it was created under breaks"
        },
    )
    prefix_cache: bool = dataclasses.field(
        default=True, metadata={"help": "reuse prompt-prefix KV blocks (in Redis at --redis-url, else in process)"}
    )
    cache_key: str = secret(
        "",
        "secret that keys the MAC on prefix-cache blocks; replicas sharing a Redis need the same one "
        "(empty: a random key per process)",
    )
    # The lm's calls move whole KV blocks, so it waits longer than RedisConfig's 0.25 s.
    redis_timeout_s: float = dataclasses.field(
        default=0.5, metadata={"help": "Redis connect and socket timeout; a slower call is a miss"}
    )
    prefix_cache_key_prefix: str = dataclasses.field(
        default="muestra:kv:", metadata={"help": "prefix of the cache's Redis keys (one namespace per tenant)"}
    )
    prefix_cache_ttl_s: int = dataclasses.field(
        default=86400, metadata={"help": "seconds a cached block lives (0: until evicted)"}
    )
    prefix_cache_memory_bytes: int = dataclasses.field(
        default=1 << 30, metadata={"help": "bytes of blocks the in-process cache holds (without --redis-url)"}
    )
    prefix_cache_min_sightings: int = dataclasses.field(
        default=2,
        metadata={
            "help": "store a prompt's block once this many prompts holding it were prefilled here (2: a one-off "
            "prompt is never stored; 1: store everything on first sight); a finished row's blocks, its prompt's "
            "and its answer's, are stored on first sight"
        },
    )
    hot_tier: bool = dataclasses.field(
        default=True,
        metadata={
            "help": "keep the KV of finished rows (prompt and answer) in the KV budget's free room, for the next "
            "prompt that starts with them (a conversation's next turn); live rows evict it"
        },
    )
    prefill_chunk_tokens: int = dataclasses.field(
        default=128,
        metadata={
            "help": "a prompt longer than this is prefilled in chunks of this many tokens, with the running rows' "
            "decode steps between them (0: in one forward)"
        },
    )
