"""`muestra tokenize TEXT`: the ids and tokens of a text, from the running tokenizer service."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc

from muestra.cli.endpoints import default_address
from muestra.v1 import tokenizer_pb2, tokenizer_pb2_grpc


def add_parser(sub) -> None:
    parser = sub.add_parser("tokenize", help="show the token ids and tokens of a text")
    parser.add_argument("text", help="text to tokenize")
    parser.add_argument("--model", default="", help="tokenizer name (default: the service's default)")
    parser.add_argument(
        "--tokenizer", default=None,
        help="tokenizer service address [MUESTRA_TOKENIZER_ADDR] (internal token: MUESTRA_INTERNAL_TOKEN[_FILE])",
    )  # fmt: skip
    parser.add_argument("--no-special-tokens", action="store_true", help="do not add BOS/EOS and the like")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def internal_token() -> str:
    """The internal token, from MUESTRA_INTERNAL_TOKEN or the file MUESTRA_INTERNAL_TOKEN_FILE names, or ''."""
    if os.environ.get("MUESTRA_INTERNAL_TOKEN"):
        return os.environ["MUESTRA_INTERNAL_TOKEN"]
    path = os.environ.get("MUESTRA_INTERNAL_TOKEN_FILE")
    return Path(path).read_text().strip() if path else ""


def run(args) -> int:
    address = args.tokenizer or default_address("tokenizer")
    request = tokenizer_pb2.EncodeRequest(
        model=args.model, texts=[args.text], add_special_tokens=not args.no_special_tokens
    )
    token = internal_token()
    metadata = [("authorization", f"Bearer {token}")] if token else []
    try:
        with grpc.insecure_channel(address) as channel:
            reply = tokenizer_pb2_grpc.TokenizerStub(channel).Encode(request, timeout=30, metadata=metadata)
    except grpc.RpcError as exc:
        print(f"muestra tokenize: {address}: {exc.code().name}: {exc.details()}")
        return 1
    encoding = reply.encodings[0]
    if args.json:
        print(json.dumps({"ids": list(encoding.ids), "tokens": list(encoding.tokens)}, ensure_ascii=False))
        return 0
    print(f"{len(encoding.ids)} tokens")
    print("ids:   ", " ".join(str(i) for i in encoding.ids))
    print("tokens:", " ".join(repr(t) for t in encoding.tokens))
    return 0
