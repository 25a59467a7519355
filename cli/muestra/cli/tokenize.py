"""`muestra tokenize TEXT`: the ids and tokens of a text, from the gateway (or a tokenizer service directly)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from muestra.cli.arguments import address_type
from muestra.cli.endpoints import api_key, gateway_address
from muestra.cli.errors import CliError
from muestra.cli.generate import add_gateway_arguments, read_prompt
from muestra.cli.stacks import running_stacks
from muestra.client import Client


def add_parser(sub) -> None:
    parser = sub.add_parser("tokenize", help="show the token ids and tokens of a text")
    parser.add_argument("text", help="text to tokenize; - reads it from standard input")
    parser.add_argument("--model", default="", help="model name (default: the gateway's default text model)")
    parser.add_argument("--no-special-tokens", action="store_true", help="do not add BOS/EOS and the like")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_gateway_arguments(parser)
    parser.add_argument(
        "--tokenizer", type=address_type("--tokenizer"), default=None,
        help="ask this tokenizer service directly instead of the gateway (--model is then the tokenizer's name; "
        "internal token: MUESTRA_INTERNAL_TOKEN[_FILE], else the running `muestra up`'s)",
    )  # fmt: skip
    parser.set_defaults(run=run)


def _stack_serving(tokenizer: str) -> dict:
    """The running `muestra up` whose tokenizer this is, else the newest one ({} without one)."""
    stacks = running_stacks()
    owner = next((s for s in stacks if s.get("services", {}).get("tokenizer") == tokenizer), None)
    return owner or (stacks[0] if stacks else {})


def internal_token(tokenizer: str) -> str:
    """MUESTRA_INTERNAL_TOKEN, or the file MUESTRA_INTERNAL_TOKEN_FILE (else the running `muestra up`'s) names."""
    if os.environ.get("MUESTRA_INTERNAL_TOKEN") is not None:
        return os.environ["MUESTRA_INTERNAL_TOKEN"]
    path = os.environ.get("MUESTRA_INTERNAL_TOKEN_FILE") or _stack_serving(tokenizer).get("internal_token_file")
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise CliError(f"cannot read the internal token from {path}: {exc.strerror or exc}") from None


def _from_tokenizer(args, text: str) -> tuple[list[int], list[str]]:
    import grpc

    from muestra.v1 import tokenizer_pb2, tokenizer_pb2_grpc

    request = tokenizer_pb2.EncodeRequest(model=args.model, texts=[text], add_special_tokens=not args.no_special_tokens)
    token = internal_token(args.tokenizer)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    try:
        with grpc.insecure_channel(args.tokenizer) as channel:
            reply = tokenizer_pb2_grpc.TokenizerStub(channel).Encode(request, timeout=30, metadata=metadata)
    except grpc.RpcError as exc:
        raise CliError(f"{args.tokenizer}: {exc.code().name}: {exc.details()}") from None
    return list(reply.encodings[0].ids), list(reply.encodings[0].tokens)


def run(args) -> int:
    text = read_prompt(args.text)
    if args.tokenizer:
        ids, tokens = _from_tokenizer(args, text)
    else:
        args.gateway = gateway_address(args.gateway)
        with Client(args.gateway, api_key=api_key(args.api_key)) as client:
            reply = client.tokenize(text, model=args.model, add_special_tokens=not args.no_special_tokens)
        ids, tokens = list(reply.ids), list(reply.tokens)
    if args.json:
        print(json.dumps({"ids": ids, "tokens": tokens}, ensure_ascii=False))
        return 0
    print(f"{len(ids)} tokens")
    print("ids:   ", " ".join(str(i) for i in ids))
    print("tokens:", " ".join(repr(t) for t in tokens))
    return 0
