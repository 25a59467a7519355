"""Prometheus metrics of the lm service, named after vLLM's where the meaning is the same."""

from prometheus_client import Counter, Gauge, Histogram

_STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

KV_BYTES = Gauge("muestra_lm_kv_cache_bytes", "Bytes of KV cache the lm service holds")
KV_BUDGET = Gauge("muestra_lm_kv_cache_budget_bytes", "The lm service's KV budget (kv_budget_bytes)")
KV_USAGE = Gauge(
    "muestra_lm_kv_cache_usage_perc", "KV cache held, as a fraction of the KV budget, 0 to 1 (vllm:kv_cache_usage_perc)"
)
ROWS = Gauge("muestra_lm_num_rows_running", "Rows held in the lm service's batches")
BATCHES = Gauge("muestra_lm_num_batches", "Batches held in the lm service")
ABANDONED = Counter(
    "muestra_lm_abandoned_batches_total",
    "Batches freed without a Clear: their lease's last step stream ended, their Prefill's caller left, or nobody used "
    "them for batch_idle_s",
    ["why"],
)
PREFILL_SECONDS = Histogram(
    "muestra_lm_prefill_seconds", "Forward time of one Prefill call (all its rows)", buckets=_STEP_BUCKETS
)
PREFILL_CHUNKS = Counter(
    "muestra_lm_prefill_chunks_total", "Chunks of long prompts prefilled apart (--prefill-chunk-tokens each)"
)
PREFILL_TOKENS = Histogram(
    "muestra_lm_prefill_tokens",
    "Prompt tokens one Prefill call computed (after prefix-cache hits)",
    buckets=(1, 8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384),
)
DECODE_STEP_SECONDS = Histogram(
    "muestra_lm_decode_step_seconds",
    "Forward time of one decode step (one token for every row, or tokens_per_row)",
    buckets=_STEP_BUCKETS,
)
BATCH_ROWS = Histogram(
    "muestra_lm_decode_batch_rows", "Rows in the batch of one decode step", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)
)
SAMPLED_TOKENS = Counter(
    "muestra_lm_sampled_tokens",
    "Tokens the lm picked with a row's own sampler chain (DecodeBatch.samplers), shipping no logits for them",
)
DRAFT_TOKENS = Counter(
    "muestra_lm_spec_decode_num_draft_tokens",
    "Draft tokens scored by verification steps (vllm:spec_decode_num_draft_tokens)",
)
ACCEPTED_DRAFT_TOKENS = Counter(
    "muestra_lm_spec_decode_num_argmax_accepted_tokens",
    "Draft tokens the lm accepted for ARGMAX rows (the gateway judges the others' with their samplers)",
)
