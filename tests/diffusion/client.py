"""A small synchronous client for the diffusion tests."""

from __future__ import annotations

import dataclasses
import functools
import io
import re
import time
import urllib.request

import grpc
import numpy as np
from PIL import Image

from muestra.v1 import diffusion_pb2, diffusion_pb2_grpc


@functools.cache
def stub(address: str) -> diffusion_pb2_grpc.DiffusionStub:
    return diffusion_pb2_grpc.DiffusionStub(grpc.insecure_channel(address))


@dataclasses.dataclass
class Result:
    progress: list[diffusion_pb2.ImageProgress]
    images: list[diffusion_pb2.GeneratedImage]
    # "progress" or "image", in arrival order.
    kinds: list[str]


def generate(address: str, timeout: float = 120, **fields) -> Result:
    """Run one Generate call to the end and collect what it streamed."""
    result = Result([], [], [])
    for response in stub(address).Generate(diffusion_pb2.ImageRequest(**fields), timeout=timeout):
        kind = response.WhichOneof("kind")
        result.kinds.append(kind)
        if kind == "progress":
            result.progress.append(response.progress)
        else:
            result.images.append(response.image)
    return result


def rpc_error(address: str, **fields) -> grpc.RpcError:
    """The error a Generate call ends with (fails the test if it succeeds)."""
    try:
        generate(address, **fields)
    except grpc.RpcError as error:
        return error
    raise AssertionError(f"Generate({fields}) succeeded; an error was expected")


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def metric(port: int, name: str) -> float:
    """The value of an unlabelled Prometheus sample from the service's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise KeyError(name)


CANCELLATION = re.compile(r"cancelled by the client at step (\d+); the loop stopped after step (\d+) of (\d+)")


def cancellations(process) -> list[tuple[int, int, int]]:
    """(cancelled at step, stopped after step, total) for every cancellation in a service's whole log."""
    return [tuple(map(int, match)) for match in CANCELLATION.findall(process.log_path.read_text(errors="replace"))]


def next_cancellation(process, seen: int, timeout_s: float = 10.0) -> tuple[int, int, int]:
    """The first cancellation logged after the `seen` earlier ones (waits for the worker to log it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = cancellations(process)
        if len(found) > seen:
            return found[seen]
        time.sleep(0.05)
    raise AssertionError(f"no cancellation logged within {timeout_s}s")


def looks_like(preview: np.ndarray, image: np.ndarray) -> tuple[float, float]:
    """(Pearson correlation, mean absolute difference in 0-255) of a preview with the image averaged to its size."""
    height, width = preview.shape[:2]
    rows, cols = image.shape[0] // height, image.shape[1] // width
    target = image.astype(np.float64).reshape(height, rows, width, cols, 3).mean(axis=(1, 3))
    shown = preview.astype(np.float64)
    return float(np.corrcoef(shown.flatten(), target.flatten())[0, 1]), float(np.abs(shown - target).mean())
