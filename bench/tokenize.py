"""Batch encoding through the tokenizer service vs the same `tokenizers` object in-process.

    .venv/bin/python bench/tokenize.py [--docs 1000] [--doc-bytes 2048] [--repeats 5]

Encodes the same documents (about 2 KB each, cut from CPython's pydoc_data/topics.py) with the
tokenizer of models/tiny-text-fixture both ways in one run, and prints docs/s, MB/s and the
ratio gRPC / in-process as a markdown table. The service runs as a subprocess on loopback; the
client sends the documents in calls of `batch` documents with `in flight` calls outstanding.
Each figure is the best of --repeats rounds; every round runs every way once, in turn.
"""

from __future__ import annotations

import os
import sys

# ruff: noqa: E402 - the imports must follow the sys.path repair below.
# Run as a script, this file's folder leads sys.path, and its name would shadow the standard
# library's tokenize (which linecache, and so logging and grpc, import).
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse
import pydoc_data.topics
import socket
import subprocess
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tokenizers import Tokenizer

from muestra.v1 import tokenizer_pb2, tokenizer_pb2_grpc

MODEL = Path(__file__).resolve().parent.parent / "models" / "tiny-text-fixture"
# (documents per Encode call, calls in flight at once)
CALL_SHAPES = ((1000, 1), (250, 1), (100, 1), (100, 2), (100, 4), (50, 4))


def documents(count: int, size: int) -> list[str]:
    """`count` distinct documents of about `size` bytes from the pydoc topics (mostly ASCII)."""
    text = "".join(pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics))
    stride = (len(text) - size) // count
    return [text[i * stride : i * stride + size] for i in range(count)]


def start_service(port: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "muestra.tokenizer",
        "--models",
        str(MODEL),
        "--port",
        str(port),
        "--log-level",
        "WARNING",
    ]
    proc = subprocess.Popen(cmd)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return proc
            except grpc.RpcError:
                time.sleep(0.1)
    proc.kill()
    raise SystemExit("the tokenizer service did not start")


def encode_over_grpc(stub, docs: list[str], batch: int, in_flight: int) -> list[list[int]]:
    """All docs in calls of `batch`, keeping up to `in_flight` calls outstanding; ids in order."""
    chunks = [docs[i : i + batch] for i in range(0, len(docs), batch)]
    results: list[list[list[int]]] = [[] for _ in chunks]
    pending: list[tuple[int, grpc.Future]] = []
    for index, chunk in enumerate(chunks):
        pending.append((index, stub.Encode.future(tokenizer_pb2.EncodeRequest(texts=chunk), timeout=120)))
        if len(pending) >= in_flight:
            done, future = pending.pop(0)
            results[done] = [list(e.ids) for e in future.result().encodings]
    for done, future in pending:
        results[done] = [list(e.ids) for e in future.result().encodings]
    return [ids for chunk in results for ids in chunk]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--doc-bytes", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    docs = documents(args.docs, args.doc_bytes)
    megabytes = sum(len(d.encode()) for d in docs) / 1e6
    tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    expected = [e.ids for e in tokenizer.encode_batch_fast(docs)]
    ways = {
        "in-process `encode_batch_fast`, ids": lambda: [e.ids for e in tokenizer.encode_batch_fast(docs)],
        "in-process `encode_batch`, ids": lambda: [e.ids for e in tokenizer.encode_batch(docs)],
    }
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = start_service(port)
    try:
        options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            stub = tokenizer_pb2_grpc.TokenizerStub(channel)
            for batch, in_flight in CALL_SHAPES:
                if encode_over_grpc(stub, docs, batch, in_flight) != expected:
                    raise SystemExit(f"gRPC ids differ from in-process ids (batch {batch})")
                ways[f"gRPC, batch {batch}, {in_flight} in flight"] = lambda b=batch, f=in_flight: encode_over_grpc(
                    stub, docs, b, f
                )
            # Round-robin over the ways, so that load from other processes hits them alike.
            best = dict.fromkeys(ways, float("inf"))
            for _ in range(args.repeats):
                for way, fn in ways.items():
                    start = time.perf_counter()
                    fn()
                    best[way] = min(best[way], time.perf_counter() - start)
    finally:
        proc.terminate()
        proc.wait(10)
    rows = list(best.items())

    baseline = rows[0][1]
    print(f"{len(docs)} documents, {megabytes:.2f} MB, {sum(map(len, expected))} tokens, "
          f"best of {args.repeats}, {os.cpu_count()} CPUs\n")  # fmt: skip
    print("| way | docs/s | MB/s | ratio to in-process fast |")
    print("|---|---:|---:|---:|")
    for way, seconds in rows:
        print(f"| {way} | {len(docs) / seconds:,.0f} | {megabytes / seconds:.2f} | {baseline / seconds:.2f} |")


if __name__ == "__main__":
    main()
