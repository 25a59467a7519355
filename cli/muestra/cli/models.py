"""`muestra models`: the models the gateway serves."""

from __future__ import annotations

import json

from muestra.cli.endpoints import api_key, gateway_address
from muestra.cli.generate import add_gateway_arguments
from muestra.client import Client


def add_parser(sub) -> None:
    parser = sub.add_parser("models", help="list the models the gateway serves")
    parser.add_argument("--json", action="store_true")
    add_gateway_arguments(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    args.gateway = gateway_address(args.gateway)
    with Client(args.gateway, api_key=api_key(args.api_key)) as client:
        models = client.list_models()
    rows = [
        {
            "name": m.name,
            "kind": m.kind,
            "context_length": m.context_length,
            "vocab_size": m.vocab_size,
            "replicas": m.replicas,
        }
        for m in models
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        sizes = f"context {row['context_length']}, vocabulary {row['vocab_size']}, " if row["kind"] == "text" else ""
        print(f"{row['name']:<24} {row['kind']:<5} {sizes}{row['replicas']} replica(s)")
    return 0
