"""A stored conversation through the Responses API against the same conversation sent whole through chat completions.

    .venv/bin/python bench/responses.py [--rounds 3] [--out responses.json]

One stack as `muestra up` runs it (bench.stack.LocalStack: redis-server, tokenizer, lm, gateway) on
models/smollm2-135m-instruct. A document chat of 5 turns (a ~2,870-token document of CPython's pydoc topics and a
question, then four follow-ups; temperature 0, 48 tokens an answer), through the official client, streamed:

- responses: turn 1 sends the document and the question; each later turn sends only its question, with
  previous_response_id (the gateway renders the stored conversation, and the prefix cache finds its KV);
- chat: every turn sends the whole history (system prompt, document, every question and answer so far).

Per turn: TTFT (request sent to the first text delta), input tokens, cached tokens and the bytes of the request
body. Every round and path has its own session tag at the start of the instructions, so neither reuses the
other's cache (so the answers of the two paths differ; tests/gateway/test_openai_responses.py checks that the same
conversation gives the same tokens on both); the two paths alternate which goes first. Medians over the rounds.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import openai  # noqa: E402

from bench.conversations import DOCUMENT_TOKENS, QUESTIONS, topics_text  # noqa: E402
from bench.speculative import cpu_name  # noqa: E402
from bench.stack import DEFAULT_TEXT_MODEL, LocalStack  # noqa: E402

MAX_TOKENS = 48


def instructions(tag: str) -> str:
    return f"Session {tag}. You answer questions about Python's documentation in two sentences."


def body_bytes(body: dict) -> int:
    return len(json.dumps(body, ensure_ascii=False).encode())


def responses_turns(client: openai.OpenAI, model: str, document: str, tag: str) -> list[dict]:
    turns, previous = [], None
    for i, question in enumerate(QUESTIONS):
        body = {
            "model": model, "instructions": instructions(tag), "temperature": 0, "max_output_tokens": MAX_TOKENS,
            "input": f"{document}\n\n{question}" if i == 0 else question,
        }  # fmt: skip
        if previous is not None:
            body["previous_response_id"] = previous
        started = time.perf_counter()
        first = final = None
        with client.responses.stream(**body) as stream:
            for event in stream:
                if event.type == "response.output_text.delta" and first is None:
                    first = time.perf_counter()
                if event.type in ("response.completed", "response.incomplete"):  # 48 tokens may cut an answer
                    final = event.response
        previous = final.id
        turns.append({
            "ttft_s": first - started, "input_tokens": final.usage.input_tokens,
            "cached_tokens": final.usage.input_tokens_details.cached_tokens,
            "output_tokens": final.usage.output_tokens, "request_bytes": body_bytes(body), "text": final.output_text,
        })  # fmt: skip
    return turns


def chat_turns(client: openai.OpenAI, model: str, document: str, tag: str) -> list[dict]:
    turns, messages = [], [{"role": "system", "content": instructions(tag)}]
    for i, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": f"{document}\n\n{question}" if i == 0 else question})
        body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS}
        started = time.perf_counter()
        first, text, usage = None, "", None
        stream = client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    first = first or time.perf_counter()
                    text += choice.delta.content
        turns.append({
            "ttft_s": first - started, "input_tokens": usage.prompt_tokens,
            "cached_tokens": usage.prompt_tokens_details.cached_tokens, "output_tokens": usage.completion_tokens,
            "request_bytes": body_bytes(body), "text": text,
        })  # fmt: skip
        messages.append({"role": "assistant", "content": text})
    return turns


def median_turns(runs: list[list[dict]]) -> list[dict]:
    keys = ("ttft_s", "input_tokens", "cached_tokens", "output_tokens", "request_bytes")
    return [{key: statistics.median(run[i][key] for run in runs) for key in keys} for i in range(len(runs[0]))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--text-model", type=Path, default=DEFAULT_TEXT_MODEL)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    document = topics_text("assignment", DOCUMENT_TOKENS)
    with tempfile.TemporaryDirectory(prefix="muestra-bench-responses-") as logs:
        stack = LocalStack(Path(logs), text_model=args.text_model, image_model=None)
        try:
            client = openai.OpenAI(base_url=stack.base_url, api_key="none", max_retries=0, timeout=600)
            model = client.models.list().data[0].id
            runs: dict[str, list] = {"responses": [], "chat": []}
            for r in range(args.rounds):
                order = ["responses", "chat"] if r % 2 == 0 else ["chat", "responses"]
                for path in order:
                    run = responses_turns if path == "responses" else chat_turns
                    runs[path].append(run(client, model, document, f"{r}{path[0]}"))
        finally:
            stack.close()
    summary = {path: median_turns(turns) for path, turns in runs.items()}
    print(f"{cpu_name()}; {args.rounds} rounds, medians")
    print("turn | responses TTFT ms, input, cached, request bytes | chat (whole history) TTFT ms, input, cached, bytes")
    for i, (ours, chat) in enumerate(zip(summary["responses"], summary["chat"], strict=True), 1):
        print(
            f"{i} | {ours['ttft_s'] * 1000:.0f}, {ours['input_tokens']:.0f}, {ours['cached_tokens']:.0f}, "
            f"{ours['request_bytes']:.0f} | {chat['ttft_s'] * 1000:.0f}, {chat['input_tokens']:.0f}, "
            f"{chat['cached_tokens']:.0f}, {chat['request_bytes']:.0f}"
        )
    if args.out:
        args.out.write_text(json.dumps({"cpu": cpu_name(), "summary": summary, "runs": runs}))


if __name__ == "__main__":
    main()
