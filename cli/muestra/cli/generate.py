"""`muestra generate PROMPT`: stream text from the gateway as it is produced."""

from __future__ import annotations

import json
import sys

from muestra.cli.endpoints import default_address
from muestra.client import Client, MuestraError


def add_parser(sub) -> None:
    parser = sub.add_parser("generate", help="stream a completion of a prompt from the gateway")
    parser.add_argument("prompt", help="prompt text")
    parser.add_argument("--model", default="", help="model name (default: the gateway's default)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=None, help="0 means greedy")
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--min-p", type=float, default=None)
    parser.add_argument("--repetition-penalty", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    parser.add_argument("--json", action="store_true", help="print the final stats as JSON after the text")
    parser.add_argument("--gateway", default=None, help="gateway address [MUESTRA_GATEWAY_ADDR]")
    parser.add_argument("--api-key", default=None, help="API key [MUESTRA_API_KEY]")
    parser.set_defaults(run=run)


def run(args) -> int:
    import os

    api_key = args.api_key or os.environ.get("MUESTRA_API_KEY")
    messages = [{"role": "user", "content": args.prompt}] if args.chat else None
    with Client(args.gateway or default_address("gateway"), api_key=api_key) as client:
        generation = client.generate(
            None if args.chat else args.prompt,
            messages=messages,
            model=args.model,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            seed=args.seed,
            stop=args.stop,
        )
        try:
            for delta in generation:
                sys.stdout.write(delta.text)
                sys.stdout.flush()
        except MuestraError as exc:
            print(f"\nmuestra generate: {exc}", file=sys.stderr)
            return 1
    sys.stdout.write("\n")
    done = generation.completions.get(0)
    if args.json and done is not None:
        print(json.dumps(done.__dict__, indent=2))
    if done is not None and done.error:
        print(f"muestra generate: {done.error}", file=sys.stderr)
        return 1
    return 0
