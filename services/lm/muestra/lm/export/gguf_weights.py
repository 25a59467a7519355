"""A GGUF file's own quantized weights carried into the exported graph, integers and scales as they are.

The graph is traced from transformers' dequantized weights; every weight MatMul and embedding Gather
whose rows all come from one Q4_0, Q4_1 or Q8_0 tensor is then rewritten to onnxruntime's
MatMulNBits or GatherBlockQuantized over the file's own blocks, so nothing is quantized twice. A
row is found by its dequantized values (transformers permutes llama's q/k rows and the exporter merges
sibling projections, but neither changes a row), so no tensor-name mapping is needed.

- Q8_0 (w = d·q, q int8): 8-bit blocks of 32, the stored byte q + 128, onnxruntime's default zero point 128.
- Q4_0 (w = d·(q - 8)): 4-bit blocks of 32, onnxruntime's default zero point 8.
- Q4_1 (w = d·q + m): MatMulNBits' zero points would have to be -m/d, which only its float zero points
  hold, and onnxruntime's CPU kernel dequantizes the whole weight on every call for those (70x slower,
  measured). So the kernel computes d·(q - 8) and the rest, m + 8d per block, is added as a second,
  small product: the activation's block sums times it (one [K, blocks] and one [blocks, N] MatMul, then an
  Add; the [K, blocks] block indicator is one table per width K, read by every MatMul of that width).
  Each MatMulNBits already has an input of its own (q/k/v and gate/up are merged), so that is one block
  sum per input. On SmolLM2 these 360 small ops are ~15% of a CPU decode step: about half is reading the
  [blocks, N] tables (13 MB a step), the rest ~3 us an op; ReduceSum over a Reshape instead of the
  indicator, the sums as extra MatMulNBits rows, or an Einsum doing sums and product in one op measured no
  faster (onnxruntime has no CPU op that also adds, and it folds a float16 table back to float32 at load).
  Centring matters: with accuracy level 4 the kernel rounds activations to int8, and a weight of d·q
  (zero point 0) carried that rounding on an offset of ~7.5d: +3.3% perplexity on SmolLM2, against
  +0.3-0.9% centred. m + 8d is exact in float32 for ordinary scales; a tensor where it is not is left
  float32.

How they are computed is `keep_file_quantization`'s accuracy level: 0 (the exporter's default for
GGUF files) gives the same greedy tokens as transformers on the dequantized weights; 4 is faster.

Dequantizing what is stored here gives the gguf package's own dequantized values bit for bit.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

BLOCK = 32
# The last part of the names of the nodes that add a Q4_1 MatMul's offsets (block sums, their product, the
# Add): bench/profile_decode.py counts their time.
OFFSET_NODES = ("sum_blocks", "mm", "add_m")
# Bytes of one block of 32 weights in the file.
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
EXACT = frozenset(BLOCK_BYTES)
MS_DOMAIN = "com.microsoft"


def keep_file_quantization(
    model: onnx.ModelProto, gguf_path: Path, accuracy_level: int, vocab_size: int
) -> dict[str, int]:
    """Rewrite `model` in place; returns how many MatMuls and Gathers of each GGUF type were rewritten.

    Accuracy level 0 keeps the model's function exact: 4-bit weights run on MatMulNBits' float
    kernel; 8-bit ones have none on the CPU (it dequantizes every call, 100x slower), so they stay
    float32 except the vocabulary projection, which runs on int8 activations and has its top
    RESCORE_TOP logits of every position recomputed in float32 from the same stored rows. Level 4
    runs every kept weight on int8 activations (faster; greedy tokens may part from the reference
    at near-ties).
    """
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    rows = _row_index(reader)
    if not rows:
        return {}
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    kept: Counter[str] = Counter()
    nodes = []
    for node in graph.node:
        replacement = None
        if node.op_type == "MatMul" and node.input[1] in weights:
            source = _find_rows(numpy_helper.to_array(weights[node.input[1]]).T, rows, reader)
            vocabulary = source is not None and source[1].shape[0] == vocab_size
            if source is not None and (accuracy_level or source[0] != "Q8_0" or vocabulary):
                level = 4 if source[0] == "Q8_0" else accuracy_level
                replacement = _matmul_nbits(node, *source, level, graph)
                if vocabulary and level and not accuracy_level and source[0] != "Q4_1":
                    replacement += _rescore_top_logits(replacement[0], node, *source, graph)
                    kept["rescored/" + source[0]] += 1
        elif node.op_type == "Gather" and node.input[0] in weights and _axis(node) == 0:
            source = _find_rows(numpy_helper.to_array(weights[node.input[0]]), rows, reader)
            if source is not None:
                replacement = _gather_block_quantized(node, *source, graph)
        if replacement is None:
            nodes.append(node)
        else:
            nodes.extend(replacement)
            kept[f"{node.op_type}/{source[0]}"] += 1
    del graph.node[:]
    graph.node.extend(nodes)
    _share_identical_initializers(graph)
    _drop_unused_initializers(graph)
    if not any(opset.domain == MS_DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return dict(kept)


# Logits of every position recomputed exactly after an int8-activation vocabulary projection: the
# projection's error (~0.1 on SmolLM2) only ever reorders near-ties, which lie among the top few.
RESCORE_TOP = 8


def _rescore_top_logits(projection, node, kind: str, blocks: np.ndarray, graph) -> list:
    """Nodes that overwrite the RESCORE_TOP largest approximate logits with float32 dot products of
    the hidden state and the same stored rows, dequantized by GatherBlockQuantized."""
    q, d, _ = unpack_blocks(kind, blocks)
    stored, bits = _stored(kind, q)
    stem = f"{node.name or node.output[0]}/rescore"
    approx = f"{stem}/approx"
    projection.output[0] = approx
    data = _add(graph, stored.reshape(q.shape[0], -1), f"{stem}/data")
    scales = _add(graph, d, f"{stem}/scales")
    top = _add(graph, np.array([RESCORE_TOP], np.int64), f"{stem}/k")
    last = _add(graph, np.array([-1], np.int64), f"{stem}/last_axis")
    attrs = {"gather_axis": 0, "quantize_axis": 1, "block_size": BLOCK, "bits": bits}

    def make(op: str, inputs: list[str], outputs: list[str], **kwargs):
        return helper.make_node(op, inputs, outputs, name=f"{stem}/{op}", **kwargs)

    return [
        make("TopK", [approx, top], [f"{stem}/values", f"{stem}/ids"], axis=-1),
        make("GatherBlockQuantized", [data, f"{stem}/ids", scales], [f"{stem}/rows"], domain=MS_DOMAIN, **attrs),
        make("Unsqueeze", [node.input[0], last], [f"{stem}/hidden"]),  # [..., hidden, 1]
        make("MatMul", [f"{stem}/rows", f"{stem}/hidden"], [f"{stem}/dots"]),  # [..., top, 1]
        make("Squeeze", [f"{stem}/dots", last], [f"{stem}/exact"]),
        make("ScatterElements", [approx, f"{stem}/ids", f"{stem}/exact"], [node.output[0]], axis=-1),
    ]


def _share_identical_initializers(graph) -> None:
    """One copy of byte-identical large tables (a tied embedding's and its projection's rescoring rows)."""
    first: dict[bytes, str] = {}
    renamed: dict[str, str] = {}
    for tensor in graph.initializer:
        if len(tensor.raw_data) < 1 << 20:
            continue
        key = hashlib.blake2b(
            str((list(tensor.dims), tensor.data_type)).encode() + tensor.raw_data,
            digest_size=16,
        ).digest()
        if key in first:
            renamed[tensor.name] = first[key]
        else:
            first[key] = tensor.name
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]


def _row_index(reader) -> dict[bytes, tuple[int, int]]:
    """The digest of every dequantized row of every exactly-mappable 2-D tensor -> (tensor, row)."""
    import gguf

    index: dict[bytes, tuple[int, int]] = {}
    for number, tensor in enumerate(reader.tensors):
        if tensor.tensor_type.name not in EXACT or len(tensor.shape) != 2 or int(tensor.shape[0]) % BLOCK:
            continue
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        for row, digest in enumerate(_digests(values)):
            index.setdefault(digest, (number, row))
    return index


def _digests(matrix: np.ndarray) -> list[bytes]:
    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    return [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in matrix]


def _find_rows(matrix: np.ndarray, index: dict, reader):
    """(type, raw blocks [rows, blocks, bytes]) when every row of `matrix` is a row of one GGUF type."""
    if matrix.ndim != 2 or matrix.dtype != np.float32 or matrix.shape[1] % BLOCK:
        return None
    found = [index.get(digest) for digest in _digests(matrix)]
    if any(f is None for f in found):
        return None
    kinds = {reader.tensors[number].tensor_type.name for number, _ in found}
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    raw = np.stack([reader.tensors[number].data[row] for number, row in found])
    blocks = raw.reshape(matrix.shape[0], matrix.shape[1] // BLOCK, BLOCK_BYTES[kind])
    if not np.array_equal(_dequantize(kind, blocks).view(np.uint32), matrix.view(np.uint32)):
        return None  # a Q4_1 offset that float32 cannot hold exactly once centred
    return kind, blocks


def _dequantize(kind: str, blocks: np.ndarray) -> np.ndarray:
    """What onnxruntime reads from the stored form, [rows, columns] float32."""
    q, d, offset = unpack_blocks(kind, blocks)
    centre = {"Q8_0": 0, "Q4_0": 8, "Q4_1": 8}[kind]
    values = d[..., None] * (q.astype(np.float32) - centre)
    if offset is not None:
        values = values + offset[..., None]
    return values.reshape(blocks.shape[0], -1)


def unpack_blocks(kind: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """GGUF blocks [rows, n, bytes] -> (q [rows, n, 32] as stored, d [rows, n] float32, offset or None).

    A Q4_1 block's offset is m + 8d: the kernel's default zero point 8 takes the rest.
    """
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q8_0":
        return blocks[..., 2:].copy().view(np.int8), d, None
    offset = 4 if kind == "Q4_1" else 2
    nibbles = blocks[..., offset : offset + 16]
    # Byte j holds weight j in its low nibble and weight j + 16 in its high one.
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)
    if kind != "Q4_1":
        return q, d, None
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    return q, d, m + 8 * d


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """onnxruntime's 4-bit layout: weights 2j and 2j + 1 share byte j, the first in the low nibble."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _stored(kind: str, q: np.ndarray) -> tuple[np.ndarray, int]:
    if kind == "Q8_0":
        return (q.astype(np.int16) + 128).astype(np.uint8), 8
    return _pack_nibbles(q), 4


def _add(graph, array: np.ndarray, name: str) -> str:
    graph.initializer.append(numpy_helper.from_array(array, name))
    return name


def _block_indicator(width: int) -> np.ndarray:
    """[width, width / 32]: 1 where position k lies in block b."""
    return np.kron(np.eye(width // BLOCK, dtype=np.float32), np.ones((BLOCK, 1), dtype=np.float32))


def _matmul_nbits(node, kind: str, blocks: np.ndarray, accuracy_level: int, graph) -> list:
    q, d, m = unpack_blocks(kind, blocks)
    n, k = q.shape[0], q.shape[1] * BLOCK
    stored, bits = _stored(kind, q)
    stem = f"{node.name or node.output[0]}/gguf_{kind.lower()}"
    inputs = [node.input[0], _add(graph, stored, f"{stem}/B"), _add(graph, d.reshape(-1), f"{stem}/scales")]
    product = node.output[0] if m is None else f"{stem}/scaled"
    attrs = {"K": k, "N": n, "bits": bits, "block_size": BLOCK, "accuracy_level": accuracy_level}
    nodes = [helper.make_node("MatMulNBits", inputs, [product], name=f"{stem}/matmul", domain=MS_DOMAIN, **attrs)]
    if m is not None:
        sums, offsets = f"{stem}/block_sums", f"{stem}/offsets"
        sum_blocks, mm, add_m = (f"{stem}/{part}" for part in OFFSET_NODES)
        indicator, m_table = _block_indicator_of(graph, k), _add(graph, m.T.copy(), f"{stem}/m")
        nodes += [
            helper.make_node("MatMul", [node.input[0], indicator], [sums], name=sum_blocks),
            helper.make_node("MatMul", [sums, m_table], [offsets], name=mm),
            helper.make_node("Add", [product, offsets], [node.output[0]], name=add_m),
        ]
    return nodes


def _block_indicator_of(graph, width: int) -> str:
    """The one block indicator of this width, added on first use: every Q4_1 MatMul of that width reads it."""
    name = f"gguf_q4_1/block_indicator_{width}"
    if not any(tensor.name == name for tensor in graph.initializer):
        _add(graph, _block_indicator(width), name)
    return name


def _gather_block_quantized(node, kind: str, blocks: np.ndarray, graph) -> list:
    q, d, m = unpack_blocks(kind, blocks)
    rows, width = q.shape[0], q.shape[1] * BLOCK
    stored, bits = _stored(kind, q)
    stem = f"{node.name or node.output[0]}/gguf_{kind.lower()}"
    inputs = [_add(graph, stored.reshape(rows, -1), f"{stem}/data"), node.input[1], _add(graph, d, f"{stem}/scales")]
    out = node.output[0] if m is None else f"{stem}/scaled"
    attrs = {"gather_axis": 0, "quantize_axis": 1, "block_size": BLOCK, "bits": bits}
    nodes = [helper.make_node("GatherBlockQuantized", inputs, [out], name=f"{stem}/gather", domain=MS_DOMAIN, **attrs)]
    if m is not None:
        # Each row's block offsets, spread over their 32 positions by the transposed block indicator.
        offsets, spread = f"{stem}/row_m", f"{stem}/row_offsets"
        nodes += [
            helper.make_node("Gather", [_add(graph, m, f"{stem}/m"), node.input[1]], [offsets], name=f"{stem}/row_m"),
            helper.make_node(
                "MatMul", [offsets, _add(graph, _block_indicator(width).T.copy(), f"{stem}/spread")], [spread]
            ),
            helper.make_node("Add", [out, spread], [node.output[0]], name=f"{stem}/add_m"),
        ]
    return nodes


def _axis(node) -> int:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)


def _drop_unused_initializers(graph) -> None:
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    unused = [t for t in graph.initializer if t.name not in used]
    for tensor in unused:
        graph.initializer.remove(tensor)


def dequantized_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every rewritten MatMul weight as onnxruntime reads it, [N, K] float32: for tests and checks."""
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or not node.name.endswith("/matmul"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        stored, scales = weights[node.input[1]], weights[node.input[2]].reshape(attrs["N"], -1)
        if attrs["bits"] == 8:
            q = stored.astype(np.float32) - 128
        else:
            q = np.stack([stored & 0x0F, stored >> 4], axis=-1).reshape(*stored.shape[:-1], -1).astype(np.float32) - 8
        values = scales[..., None] * q
        stem = node.name.removesuffix("/matmul")
        if f"{stem}/m" in weights:
            values = values + weights[f"{stem}/m"].T[..., None]
        out[stem] = values.reshape(attrs["N"], attrs["K"])
    return out
