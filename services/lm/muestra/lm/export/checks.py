"""Run an exported graph with onnxruntime: equivalence with the PyTorch model, and perplexity on a text."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from muestra.lm.export.families import LOGITS_POSITIONS

_NUMPY_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def ort_session(model_path: Path) -> ort.InferenceSession:
    """A CPU session, or CUDA first when both onnxruntime-gpu and torch see a GPU."""
    providers = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers() and torch.cuda.is_available():
        providers.insert(0, "CUDAExecutionProvider")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_path), options, providers=providers)


def empty_past(session: ort.InferenceSession, batch: int) -> dict[str, np.ndarray]:
    """Zero-length past tensors, shaped and typed from the graph's own inputs."""
    past = {}
    for node in session.get_inputs():
        if node.name.startswith("past_key_values."):
            _, heads, _, head_dim = node.shape
            past[node.name] = np.zeros((batch, heads, 0, head_dim), dtype=_NUMPY_DTYPES[node.type])
    return past


def last_position(session: ort.InferenceSession) -> dict[str, np.ndarray]:
    """The feed that asks a graph with a logits_positions input for the last position's logits (the default
    of the graphs without one)."""
    if any(node.name == LOGITS_POSITIONS for node in session.get_inputs()):
        return {LOGITS_POSITIONS: np.array([-1], np.int64)}
    return {}


def run_step(
    session: ort.InferenceSession,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    past: dict[str, np.ndarray],
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One forward pass; returns logits and the presents renamed as the next step's past."""
    feed = {"input_ids": input_ids, "attention_mask": attention_mask, **past, **last_position(session)}
    if "position_ids" in {node.name for node in session.get_inputs()}:
        positions = np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None)
        feed["position_ids"] = positions[:, -input_ids.shape[1] :].astype(np.int64)
    names = [node.name for node in session.get_outputs()]
    values = session.run(names, feed)
    presents = {
        name.replace("present.", "past_key_values.", 1): value
        for name, value in zip(names, values, strict=True)
        if name.startswith("present.")
    }
    return values[names.index("logits")], presents


def shared_buffers(session: ort.InferenceSession, rows: int, capacity: int) -> dict[str, np.ndarray]:
    """Zeroed KV buffers [rows, kv_heads, capacity, head_dim] for a fused (GroupQueryAttention) graph."""
    return {
        name: np.zeros((rows, value.shape[1], capacity, value.shape[3]), value.dtype)
        for name, value in empty_past(session, rows).items()
    }


def run_shared_step(
    session: ort.InferenceSession, input_ids: np.ndarray, lengths: np.ndarray, buffers: dict[str, np.ndarray]
) -> np.ndarray:
    """One step of a fused graph: each buffer is bound as its layer's past and present, written in place.

    Rows are right-padded: after the step row i holds `lengths[i]` positions, its new tokens last.
    """
    new = input_ids.shape[1]
    mask = (np.arange(int(lengths.max()))[None, :] < lengths[:, None]).astype(np.int64)
    positions = np.arange(new)[None, :] + np.maximum(lengths - new, 0)[:, None]
    binding = session.io_binding()
    binding.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids, dtype=np.int64))
    binding.bind_cpu_input("attention_mask", mask)
    binding.bind_cpu_input("position_ids", positions.astype(np.int64))
    for name, value in last_position(session).items():
        binding.bind_cpu_input(name, value)
    binding.bind_output("logits")
    for name, buffer in buffers.items():
        value = ort.OrtValue.ortvalue_from_numpy(buffer)
        binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(name.replace("past_key_values.", "present.", 1), value)
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()


def max_abs_diff_against_torch(
    model: torch.nn.Module, session: ort.InferenceSession, vocab_size: int, decode_steps: int = 3, shared: bool = False
) -> float:
    """Largest |logit difference| between onnxruntime and transformers over a padded prefill + decode.

    A concat graph runs a left-padded batch; a fused graph (`shared`) prefills each row alone into
    its row of the shared buffers, then decodes the right-padded rows together, as the lm does.
    """
    if shared:
        return _shared_diff(model, session, vocab_size, decode_steps)
    rng = np.random.default_rng(0)
    lengths = [7, 4]
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = rng.integers(2, vocab_size, size=length)
        mask[row, width - length :] = 1
    logits, past = run_step(session, ids, mask, empty_past(session, len(lengths)))
    worst = 0.0
    for step in range(decode_steps + 1):
        if step:
            next_ids = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
            ids = np.concatenate([ids, next_ids], axis=1)
            mask = np.concatenate([mask, np.ones_like(next_ids)], axis=1)
            logits, past = run_step(session, next_ids, mask, past)
        with torch.no_grad():
            positions = torch.from_numpy(np.clip(np.cumsum(mask, axis=1) - 1, 0, None))
            reference = model(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                position_ids=positions,
            ).logits[:, -1]
        worst = max(worst, float(np.abs(logits[:, -1].astype(np.float64) - reference.double().numpy()).max()))
    return worst


def _shared_diff(model: torch.nn.Module, session: ort.InferenceSession, vocab_size: int, decode_steps: int) -> float:
    rng = np.random.default_rng(0)
    rows = [rng.integers(2, vocab_size, size=length).tolist() for length in (7, 4)]
    buffers = shared_buffers(session, len(rows), max(map(len, rows)) + decode_steps + 1)
    last = []
    for row, tokens in enumerate(rows):
        alone = {name: np.ascontiguousarray(buffer[row : row + 1]) for name, buffer in buffers.items()}
        last.append(run_shared_step(session, np.array([tokens]), np.array([len(tokens)]), alone)[0, -1])
        for name, buffer in buffers.items():
            buffer[row] = alone[name][0]
    logits = np.stack(last)
    worst = 0.0
    for step in range(decode_steps + 1):
        if step:
            next_ids = logits.argmax(-1)
            for row, token in enumerate(next_ids):
                rows[row].append(int(token))
            lengths = np.array([len(r) for r in rows])
            logits = run_shared_step(session, next_ids[:, None], lengths, buffers)[:, -1]
        with torch.no_grad():
            for row, tokens in enumerate(rows):
                reference = model(input_ids=torch.tensor([tokens])).logits[0, -1].double().numpy()
                worst = max(worst, float(np.abs(logits[row].astype(np.float64) - reference).max()))
    return worst


def perplexity(session: ort.InferenceSession, token_ids: list[int], label: str = "perplexity") -> float:
    """exp(mean negative log-likelihood) of token_ids[1:], decoded one token at a time through the KV cache."""
    if len(token_ids) < 2:
        raise ValueError("perplexity needs a text of at least two tokens")
    past = empty_past(session, 1)
    mask = np.zeros((1, 0), dtype=np.int64)
    nll = 0.0
    last_report = time.monotonic()
    for i, token in enumerate(token_ids[:-1]):
        mask = np.concatenate([mask, np.ones((1, 1), dtype=np.int64)], axis=1)
        logits, past = run_step(session, np.array([[token]], dtype=np.int64), mask, past)
        row = logits[0, -1].astype(np.float64)
        log_z = row.max() + math.log(np.exp(row - row.max()).sum())
        nll += log_z - row[token_ids[i + 1]]
        if time.monotonic() - last_report > 10:
            last_report = time.monotonic()
            print(f"[export-lm]   {label}: {i + 1}/{len(token_ids) - 1} tokens", file=sys.stderr, flush=True)
    return math.exp(nll / (len(token_ids) - 1))
