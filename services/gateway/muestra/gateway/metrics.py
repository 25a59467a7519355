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
RUNNING = Gauge("muestra_num_requests_running", "Rows in lm batches (vllm:num_requests_running)", ["model", "replica"])
WAITING = Gauge(
    "muestra_num_requests_waiting", "Requests waiting for admission (vllm:num_requests_waiting)", ["model", "replica"]
)
