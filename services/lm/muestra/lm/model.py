"""A decoder model folder behind one onnxruntime session (model_folder.py reads its JSON files)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import mmap
import re
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from muestra.lm.int8_activations import describe_quantizer, int8_activations_before_kv
from muestra.lm.kv import ConcatKV, SharedKV
from muestra.lm.model_folder import ModelFolderError, no_onnx_message, read_folder_config
from muestra.lm.providers import resolve_providers
from muestra.lm.row_pad import ROW_PADS, add_row_pads, has_one_row_kernels, pads

log = logging.getLogger("muestra.lm")

# The graph input that names the positions whose logits a step returns, and its value for the last one.
LOGITS_POSITIONS = "logits_positions"
_LAST = np.array([-1], dtype=np.int64)
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_ONNX_DTYPES = {"tensor(float)": np.dtype(np.float32), "tensor(float16)": np.dtype(np.float16)}
_INT_DTYPES = {"tensor(int64)": np.dtype(np.int64), "tensor(int32)": np.dtype(np.int32)}


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    name: str
    fingerprint: str
    context_length: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: np.dtype
    # "concat" (the graph concatenates past and new KV) or "shared" (one buffer is past and present).
    storage: str
    has_position_ids: bool
    generation_config_json: str
    providers: tuple[str, ...]

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token of one row holds, over every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype.itemsize

    @property
    def layout(self) -> str:
        return f"{self.storage}:{self.num_layers}x{self.num_kv_heads}x{self.head_dim}:{self.kv_dtype.name}"


def model_fingerprint(onnx_files: list[Path], kv_dtype: np.dtype, layout: str) -> str:
    """sha256 of the ONNX bytes (graph and external data), the KV dtype and the KV layout."""
    digest = hashlib.sha256()
    for path in onnx_files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    digest.update(f"\0kv_dtype={kv_dtype.name}\0layout={layout}".encode())
    return digest.hexdigest()


def _uses_op(path: Path, op_type: bytes) -> bool:
    """Whether the graph names an operator (op types are plain strings in the protobuf)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(op_type) >= 0


class OnnxDecoder:
    """One onnxruntime session over a decoder with past_key_values; forward() runs one step."""

    def __init__(
        self,
        folder: str | Path,
        providers: str = "auto",
        intra_op_threads: int = 0,
        context_length: int = 0,
        name: str = "",
        intra_op_spinning: bool = True,
        row_invariant: bool = True,
    ) -> None:
        folder = Path(folder)
        onnx_path = folder / "model.onnx"
        if not folder.is_dir():
            raise ModelFolderError(f"model folder {folder} does not exist")
        if not onnx_path.is_file():
            raise ModelFolderError(no_onnx_message(folder))
        folder_config = read_folder_config(folder)
        config, generation_config = folder_config.config, folder_config.generation_config
        # GroupQueryAttention graphs take one buffer as both past and present; others concatenate.
        self.storage_cls = SharedKV if _uses_op(onnx_path, b"GroupQueryAttention") else ConcatKV

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if intra_op_threads > 0:
            options.intra_op_num_threads = intra_op_threads
        if not intra_op_spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        wanted = resolve_providers(providers)
        try:
            graph_model = onnx.load(onnx_path, load_external_data=False)
        except Exception as exc:  # protobuf's DecodeError, or anything onnx raises on a file that is not a model
            raise ModelFolderError(f"onnxruntime cannot load {onnx_path}: it is not an ONNX model ({exc})") from exc
        # On CPU, steps of one activation row run the kernels of several unless asked not to (row_pad.py).
        self.row_pads = False
        # Whether a step of a single activation row runs the several-row kernels too (Engine.decode sets it per call).
        self.lone_rows_invariant = False
        source: str | bytes = str(onnx_path)
        one_row_kernels = has_one_row_kernels(graph_model.graph)
        if row_invariant and one_row_kernels and wanted[0] == "CPUExecutionProvider":
            why_not = add_row_pads(graph_model)
            self.row_pads = not why_not
            if self.row_pads:
                source = graph_model.SerializeToString()
                options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
            else:
                log.warning("one-row steps keep their own kernels (%s): a row's bits may depend on its batch", why_not)
        try:
            self.session = ort.InferenceSession(source, options, providers=wanted)
        except Exception as exc:  # onnxruntime raises untyped errors
            raise ModelFolderError(f"onnxruntime cannot load {onnx_path}: {exc}") from exc
        del source
        in_use = self.session.get_providers()
        if "CUDAExecutionProvider" in wanted and "CUDAExecutionProvider" not in in_use:
            if providers.strip().lower() != "auto" and wanted[0] == "CUDAExecutionProvider":
                raise ModelFolderError(f"providers {providers!r}: onnxruntime could not start CUDA (in use: {in_use})")
            log.warning("onnxruntime could not start its CUDA provider (see its message above); running on CPU")
        log.info("onnxruntime providers in use: %s (asked for %s)", ", ".join(in_use), ", ".join(wanted))
        self.device = "cuda" if in_use[0] == "CUDAExecutionProvider" else "cpu"
        # Whether every step gives a row the same bits in any batch (row_pad.py; measured on CPU only).
        self.row_invariant = row_invariant and self.device == "cpu" and (self.row_pads or not one_row_kernels)
        if self.row_pads:
            log.info("row-invariant steps: one-row steps can run the several-row kernels (graph rows padded)")

        inputs = {i.name: i for i in self.session.get_inputs()}
        outputs = {o.name: o for o in self.session.get_outputs()}
        for needed in ("input_ids", "attention_mask"):
            if needed not in inputs:
                raise ModelFolderError(f"model.onnx has no {needed!r} input (inputs: {sorted(inputs)})")
        if "logits" not in outputs:
            raise ModelFolderError(f"model.onnx has no 'logits' output (outputs: {sorted(outputs)})")
        layers = sorted({int(m.group(1)) for n in inputs if (m := _PAST.match(n))})
        if not layers or layers != list(range(len(layers))):
            raise ModelFolderError(f"model.onnx has no past_key_values.<i>.key|value inputs (inputs: {sorted(inputs)})")
        self.past_names = [f"past_key_values.{i}.{kind}" for i in layers for kind in ("key", "value")]
        self.present_names = [f"present.{i}.{kind}" for i in layers for kind in ("key", "value")]
        missing = [n for n in self.past_names if n not in inputs] + [n for n in self.present_names if n not in outputs]
        if missing:
            raise ModelFolderError(f"model.onnx lacks {missing[:4]} (each layer needs past and present key and value)")
        past0 = inputs[self.past_names[0]]
        if past0.type not in _ONNX_DTYPES or len(past0.shape) != 4:
            raise ModelFolderError(
                f"unsupported KV input {past0.name}: {past0.type} {past0.shape} "
                "(want float or float16 [batch, kv_heads, past, head_dim])"
            )
        kv_dtype = _ONNX_DTYPES[past0.type]
        self.ids_dtype = _INT_DTYPES.get(inputs["input_ids"].type, np.dtype(np.int64))
        self.mask_dtype = _INT_DTYPES.get(inputs["attention_mask"].type, np.dtype(np.int64))
        self.has_position_ids = "position_ids" in inputs
        self.pos_dtype = np.dtype(np.int64)
        if self.has_position_ids:
            self.pos_dtype = _INT_DTYPES.get(inputs["position_ids"].type, self.pos_dtype)
        self.kv_dtype = kv_dtype
        # A graph that keeps only some positions' logits names them in this input (muestra's exporter).
        self.has_logits_positions = LOGITS_POSITIONS in inputs
        self.output_names = ["logits", *self.present_names]
        # "node <name>, <op>" of the first node that quantizes activations to int8 before the KV, or "": on such a
        # graph a drafted position's KV is not a one-token step's (int8_activations.py). External data stays unread.
        quantizer = int8_activations_before_kv(graph_model.graph, self.present_names)
        del graph_model
        self.int8_before_kv = describe_quantizer(quantizer) if quantizer is not None else ""
        self._binding: ort.IOBinding | None = None

        # The graph's dims may be symbolic: one real two-token step tells vocab, kv heads, head dim,
        # and whether logits come for every position or only the last, for sure. A shared buffer
        # must be sized before the step, from config.json where the graph leaves a dim symbolic.
        heads, head_dim = past0.shape[1], past0.shape[3]
        if not isinstance(heads, int):
            heads = int(config.get("num_key_value_heads") or config.get("num_attention_heads") or 1)
        if not isinstance(head_dim, int):
            attention_heads = config.get("num_attention_heads") or 1
            head_dim = int(config.get("head_dim") or (config.get("hidden_size") or attention_heads) // attention_heads)
        shared = self.storage_cls.shares_buffer
        probe_past = [np.zeros((1, heads, 4 if shared else 0, head_dim), kv_dtype) for _ in self.past_names]
        past_values = [self.to_device(a) for a in probe_past]
        binding = self._bind(
            np.zeros((1, 2), np.int64), np.ones((1, 2), np.int64), np.arange(2)[None, :], past_values, shared
        )
        try:
            self.session.run_with_iobinding(binding)
        except Exception as exc:  # onnxruntime raises untyped errors
            raise ModelFolderError(
                f"a two-token test step failed ({self.storage_cls.storage} KV layout): {exc}"
            ) from exc
        logits, *presents = binding.get_outputs()
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        self.logits_all = logits.shape()[1] != 1
        # Whether a step can give the logits of several of its positions (speculative verification).
        self.multi_position_logits = self.logits_all or self.has_logits_positions
        present_shape = presents[0].shape()
        self.num_kv_heads, self.head_dim = int(present_shape[1]), int(present_shape[3])
        vocab = int(logits.shape()[-1])

        limit, limit_source = folder_config.context_length, folder_config.context_source
        if context_length > 0 and limit > 0 and context_length > limit:
            raise ModelFolderError(f"context_length {context_length} exceeds the model's {limit} ({limit_source})")
        context = context_length or limit
        if context <= 0:
            raise ModelFolderError(f"the folder gives no context length ({limit_source}); set context_length")
        eos = generation_config.get("eos_token_id", config.get("eos_token_id"))
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else []))

        self.context_length = context
        onnx_files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.startswith("model.onnx"))
        storage = self.storage_cls.storage
        layout = f"{storage}:{len(layers)}x{self.num_kv_heads}x{self.head_dim}"
        self.info = ModelInfo(
            name=name or folder.resolve().name,
            fingerprint=model_fingerprint(onnx_files, kv_dtype, layout),
            context_length=context,
            vocab_size=vocab,
            eos_token_ids=eos_ids,
            num_layers=len(layers),
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            kv_dtype=kv_dtype,
            storage=storage,
            has_position_ids=self.has_position_ids,
            generation_config_json=json.dumps(generation_config, sort_keys=True),
            providers=tuple(in_use),
        )
        self.kv_bytes_per_token = self.info.kv_bytes_per_token

    def to_device(self, array: np.ndarray) -> ort.OrtValue:
        """An OrtValue on the session's device (on CPU it shares the array's memory)."""
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device, 0)

    def empty_row_past(self) -> list[np.ndarray]:
        """A row's KV before its first token: one [kv_heads, 0, head_dim] array per past input."""
        return [np.zeros((self.num_kv_heads, 0, self.head_dim), self.kv_dtype) for _ in self.past_names]

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray | None,
        past: list[ort.OrtValue],
        share: bool = False,
        last: np.ndarray | None = None,
        every_position: bool = False,
    ) -> tuple[np.ndarray, list[ort.OrtValue], int]:
        """One step: each row's last logits (float32 [rows, vocab]), the presents, microseconds.

        `share` binds each past buffer as its present too (the graph writes in place); `last`
        gives each row's position of its last token in the step (default: the step's last).
        `every_position` returns the logits after every new position instead ([rows, new, vocab];
        only where multi_position_logits).
        """
        keep = np.arange(input_ids.shape[1], dtype=np.int64) if every_position else _LAST
        binding = self._bind(input_ids, attention_mask, position_ids, past, share, keep)
        started = time.perf_counter()
        self.session.run_with_iobinding(binding)
        forward_us = int((time.perf_counter() - started) * 1e6)
        values = binding.get_outputs()
        # The binding must not keep the past (or these presents) alive once the batch drops them.
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        logits = values[0].numpy()
        if every_position:
            if not self.has_logits_positions:  # a graph that gives every position's logits
                logits = logits[:, -input_ids.shape[1] :]
            return np.array(logits, dtype=np.float32), list(values[1:]), forward_us
        if last is None or logits.shape[1] == 1:
            picked = logits[:, -1, :]
        else:
            picked = logits[np.arange(logits.shape[0]), last, :]
        return np.array(picked, dtype=np.float32), list(values[1:]), forward_us

    def _bind(self, input_ids, attention_mask, position_ids, past, share: bool = False, keep=None) -> ort.IOBinding:
        # One binding, reused: creating one costs more than a small model's whole step.
        if self._binding is None:
            self._binding = self.session.io_binding()
        binding = self._binding
        binding.bind_cpu_input("input_ids", input_ids.astype(self.ids_dtype, copy=False))
        binding.bind_cpu_input("attention_mask", attention_mask.astype(self.mask_dtype, copy=False))
        if self.has_position_ids:
            binding.bind_cpu_input("position_ids", position_ids.astype(self.pos_dtype, copy=False))
        if self.has_logits_positions:
            binding.bind_cpu_input(LOGITS_POSITIONS, _LAST if keep is None else keep)
        if self.row_pads:
            binding.bind_cpu_input(ROW_PADS, pads(input_ids.size, self.lone_rows_invariant))
        for name, value in zip(self.past_names, past, strict=True):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output("logits", "cpu")
        for name, value in zip(self.present_names, past, strict=True):
            if share:
                binding.bind_ortvalue_output(name, value)
            else:
                binding.bind_output(name, self.device)
        return binding
