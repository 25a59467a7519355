"""Prometheus metrics of text generation, named after vLLM's where the meaning is the same."""

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)

TIME_TO_FIRST_TOKEN = Histogram(
    "muestra_time_to_first_token_seconds",
    "From a request's arrival to its first token (vllm:time_to_first_token_seconds)",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    "muestra_inter_token_latency_seconds",
    "Between two tokens of one completion (vllm:inter_token_latency_seconds)",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
E2E_LATENCY = Histogram(
    "muestra_e2e_request_latency_seconds",
    "From arrival to the end of a request (vllm:e2e_request_latency_seconds)",
    ["model"],
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320),
)
PROMPT_TOKENS = Counter("muestra_prompt_tokens_total", "Prompt tokens prefilled (vllm:prompt_tokens)", ["model"])
GENERATION_TOKENS = Counter("muestra_generation_tokens_total", "Tokens generated (vllm:generation_tokens)", ["model"])
REQUESTS_FINISHED = Counter(
    "muestra_request_success_total", "Finished completions by reason (vllm:request_success)", ["model", "finish_reason"]
)
REQUESTS_FAILED = Counter(
    "muestra_request_failures_total", "Requests that ended with an error status, by status", ["model", "code"]
)
RUNNING = Gauge(
    "muestra_num_requests_running",
    "Requests with rows in an lm batch, being prefilled or decoded (vllm:num_requests_running)",
    ["model", "replica"],
)
WAITING = Gauge(
    "muestra_num_requests_waiting", "Requests waiting for admission (vllm:num_requests_waiting)", ["model", "replica"]
)
ROWS_RUNNING = Gauge(
    "muestra_num_rows_running", "lm batch rows in use: one per completion, or per beam", ["model", "replica"]
)
QUEUE_TIME = Histogram(
    "muestra_request_queue_time_seconds",
    "From a request's arrival to its admission into a batch (vllm:request_queue_time_seconds)",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
PREFILL_TIME = Histogram(
    "muestra_request_prefill_time_seconds",
    "From a request's admission to its first token (vllm:request_prefill_time_seconds)",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
DECODE_TIME = Histogram(
    "muestra_request_decode_time_seconds",
    "From a completion's first token to its last (vllm:request_decode_time_seconds)",
    ["model"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320),
)
_TOKEN_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
PROMPT_LENGTH = Histogram(
    "muestra_request_prompt_tokens", "Prompt tokens of a request (vllm:request_prompt_tokens)", ["model"],
    buckets=_TOKEN_BUCKETS,
)  # fmt: skip
GENERATION_LENGTH = Histogram(
    "muestra_request_generation_tokens", "Tokens generated for one completion (vllm:request_generation_tokens)",
    ["model"], buckets=_TOKEN_BUCKETS,
)  # fmt: skip
STEP_TIME = Histogram(
    "muestra_decode_step_seconds",
    "One scheduler step for a replica's batch: the lm's decode step, sampling and streaming",
    ["model", "replica"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
DECODE_BURST = Histogram(
    "muestra_decode_burst_steps",
    "Greedy steps one lm Decode ran for a replica's batch (1: a Decode per token; see --greedy-burst)",
    ["model", "replica"],
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
KV_RESERVED = Gauge(
    "muestra_kv_reserved_bytes",
    "lm KV bytes a replica's batch may take before its last row ends (each row up to prompt + max_tokens), "
    "as the lm counts them; admission keeps it within the lm's kv_budget_bytes",
    ["model", "replica"],
)
KV_ADMISSION_WAITS = Counter(
    "muestra_kv_admission_waits_total",
    "Requests that waited at the head of a replica's queue because its KV budget could not hold them yet",
    ["model", "replica"],
)
# Speculative decoding, named after vLLM's spec_decode metrics. Tokens per verification step are
# (accepted + drafts) / drafts, and the acceptance rate accepted / draft tokens.
SPEC_DRAFTS = Counter(
    "muestra_spec_decode_num_drafts_total",
    "Rows' drafts the lm verified, one per row and step (vllm:spec_decode_num_drafts)",
    ["model", "proposer"],
)
SPEC_DRAFT_TOKENS = Counter(
    "muestra_spec_decode_num_draft_tokens_total",
    "Draft tokens the lm verified (vllm:spec_decode_num_draft_tokens)",
    ["model", "proposer"],
)
SPEC_ACCEPTED_TOKENS = Counter(
    "muestra_spec_decode_num_accepted_tokens_total",
    "Draft tokens the sampler chain accepted (vllm:spec_decode_num_accepted_tokens)",
    ["model", "proposer"],
)
