"""Small helpers the lm tests share: building requests and reading logits back."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from muestra.v1 import lm_pb2


def spec(kind: int = lm_pb2.LOGITS, top_n: int = 0) -> lm_pb2.OutputSpec:
    return lm_pb2.OutputSpec(kind=kind, top_n=top_n)


def prefill(stub, prompts: Sequence[Sequence[int]], kind: int = lm_pb2.LOGITS, top_n: int = 0):
    rows = [lm_pb2.PrefillRow(request_id=f"r{i}", input_ids=p, output=spec(kind, top_n)) for i, p in enumerate(prompts)]
    return stub.Prefill(lm_pb2.PrefillRequest(rows=rows))


def decode(stub, *batches: tuple[str, Sequence[int]], kind: int | None = None):
    """One Decode over (batch_id, next_ids) pairs; `kind` sets every row's output, None keeps them."""
    request = lm_pb2.DecodeRequest()
    for batch_id, next_ids in batches:
        outputs = [spec(kind)] * len(next_ids) if kind is not None else []
        request.batches.add(batch_id=batch_id, next_ids=list(next_ids), outputs=outputs)
    return stub.Decode(request)


def logits(output: lm_pb2.BatchOutput) -> np.ndarray:
    """The packed float32 logits of a BatchOutput as [rows, vocab]."""
    tensor = output.logits
    return np.frombuffer(tensor.data, dtype="<f4").reshape(tuple(tensor.shape))


def torch_last_logits(model, ids: Sequence[int]) -> np.ndarray:
    """Logits of the last position, recomputed over the whole sequence without any cache."""
    with torch.no_grad():
        return model(torch.tensor([list(ids)]), use_cache=False).logits[0, -1].float().numpy()


def prompts(lengths: Sequence[int], vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, vocab, n).tolist() for n in lengths]
