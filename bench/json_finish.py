"""Do constrained JSON answers finish? json_object and a 50-schema suite on the default model.

    .venv/bin/python bench/json_finish.py [--max-tokens 200] [--out json_finish.json]

One stack (bench.stack.LocalStack) on models/smollm2-135m-instruct. Through the OpenAI chat API:
- json_object: 20 requests (prompts asking for JSON about everyday things) at temperature 0 and 20 at 0.7;
- schemas: 50 JSON Schemas from bench/builders/json_schemas.py's seeded generator with every string, array and
  object bound removed (maxLength, maxItems, maxProperties: what a user's schema often lacks), `strict` off, one
  request each at temperature 0 and at 0.7, the prompt naming the schema's properties.
Counts the answers that finish (finish_reason "stop") within --max-tokens and parse as JSON (and validate, for
schemas); prints the looping ones' first characters.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402

import jsonschema  # noqa: E402
import openai  # noqa: E402

from bench.builders.json_schemas import random_schema  # noqa: E402
from bench.speculative import cpu_name  # noqa: E402
from bench.stack import DEFAULT_TEXT_MODEL, LocalStack  # noqa: E402

SUBJECTS = [
    "a cat", "the city of Paris", "a cup of coffee", "a bicycle", "the planet Mars", "a birthday party",
    "a chess game", "a recipe for pancakes", "a library book", "a weather report", "a train ticket", "a song",
    "a football match", "a smartphone", "a hiking trip", "a dog named Max", "an apple", "a movie night",
    "a school timetable", "a garden",
]  # fmt: skip
UNBOUNDED = ("maxLength", "maxItems", "maxProperties")


def unbounded(schema):
    if isinstance(schema, dict):
        return {k: unbounded(v) for k, v in schema.items() if k not in UNBOUNDED}
    if isinstance(schema, list):
        return [unbounded(v) for v in schema]
    return schema


def ask(client, model: str, prompt: str, temperature: float, max_tokens: int, response_format: dict, seed: int):
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], temperature=temperature, max_tokens=max_tokens,
        seed=seed, response_format=response_format,
    )  # fmt: skip
    choice = reply.choices[0]
    return choice.message.content or "", choice.finish_reason, reply.usage.completion_tokens


def judge(text: str, finish: str, schema: dict | None) -> str:
    if finish != "stop":
        return "cut"
    try:
        value = json.loads(text)
    except ValueError:
        return "invalid"
    if schema is not None:
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError:
            return "invalid"
    return "finished"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--schemas", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--text-model", type=Path, default=DEFAULT_TEXT_MODEL)
    parser.add_argument("--gateway-arg", action="append", default=[], help="extra gateway flag (repeat)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    jobs = []
    for temperature in (0.0, 0.7):
        for i, subject in enumerate(SUBJECTS):
            prompt = f"Describe {subject} as a JSON object."
            jobs.append(("json_object", temperature, prompt, {"type": "json_object"}, None, i))
        for seed in range(args.schemas):
            schema = unbounded(random_schema(seed))
            names = ", ".join(schema.get("properties", {})) or "its fields"
            prompt = f"Write a JSON object with these fields: {names}."
            fmt = {"type": "json_schema", "json_schema": {"name": f"s{seed}", "schema": schema}}
            jobs.append(("schemas", temperature, prompt, fmt, schema, seed))
    results = []
    with tempfile.TemporaryDirectory(prefix="muestra-bench-json-") as logs:
        stack = LocalStack(
            Path(logs), text_model=args.text_model, image_model=None, gateway_args=tuple(args.gateway_arg)
        )
        try:
            client = openai.OpenAI(base_url=stack.base_url, api_key="none", max_retries=0, timeout=600)
            model = client.models.list().data[0].id

            def run(job):
                suite, temperature, prompt, fmt, schema, seed = job
                text, finish, tokens = ask(client, model, prompt, temperature, args.max_tokens, fmt, seed)
                verdict = judge(text, finish, schema)
                return {"suite": suite, "temperature": temperature, "seed": seed, "verdict": verdict,
                        "tokens": tokens, "text": text[:120]}  # fmt: skip

            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                results = list(pool.map(run, jobs))
        finally:
            stack.close()
    print(f"{cpu_name()}; max_tokens {args.max_tokens}; gateway flags {args.gateway_arg or 'none'}")
    for suite in ("json_object", "schemas"):
        for temperature in (0.0, 0.7):
            rows = [r for r in results if r["suite"] == suite and r["temperature"] == temperature]
            counts = {v: sum(r["verdict"] == v for r in rows) for v in ("finished", "cut", "invalid")}
            share = counts["finished"] / len(rows)
            print(f"{suite} t={temperature}: {counts['finished']}/{len(rows)} finished ({share:.0%}), "
                  f"{counts['cut']} cut at max_tokens, {counts['invalid']} invalid")  # fmt: skip
            for r in rows:
                if r["verdict"] != "finished":
                    print(f"    {r['verdict']} seed {r['seed']}: {r['text'][:90]!r}")
    if args.out:
        args.out.write_text(json.dumps({"cpu": cpu_name(), "results": results}, ensure_ascii=False))


if __name__ == "__main__":
    main()
