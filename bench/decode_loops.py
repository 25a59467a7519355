"""The greedy decode loops bench/decode.py compares; each has prefill(prompts) and decode(state, steps).

decode() times only its steps and returns (seconds, tokens chosen per row, the state to go on from),
so a long prompt is run once and its decode steps measured many times.
"""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort

from muestra.cli.launch import ServiceProcess
from muestra.lm.export.checks import last_position
from muestra.v1 import lm_pb2, lm_pb2_grpc

PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider"]}
_KV_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def _session(path: Path, threads: int, device: str = "cpu") -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=PROVIDERS[device])
    if session.get_providers()[0] != PROVIDERS[device][0]:
        raise RuntimeError(f"onnxruntime runs {path} on {session.get_providers()}, not {PROVIDERS[device]}")
    return session


class BareLoop:
    """The baseline: session.run() with numpy feeds; the presents are fed back as the next past."""

    def __init__(self, onnx_dir: Path, threads: int) -> None:
        self.session = _session(onnx_dir / "model.onnx", threads)
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.has_positions = "position_ids" in inputs
        self.past_names = [n for n in inputs if n.startswith("past_key_values.")]
        self.present_names = [n.replace("past_key_values", "present") for n in self.past_names]
        _, self.heads, _, self.head_dim = inputs[self.past_names[0]].shape

    def feeds(self, ids: np.ndarray, past_length: int) -> dict:
        rows, width = ids.shape
        feeds = {"input_ids": ids, "attention_mask": np.ones((rows, past_length + width), np.int64)}
        feeds.update(last_position(self.session))
        if self.has_positions:
            feeds["position_ids"] = np.tile(np.arange(past_length, past_length + width), (rows, 1))
        return feeds

    def prefill(self, prompts: np.ndarray):
        empty = np.zeros((prompts.shape[0], self.heads, 0, self.head_dim), np.float32)
        logits, *past = self.session.run(None, {**self.feeds(prompts, 0), **dict.fromkeys(self.past_names, empty)})
        return logits[:, -1].argmax(-1), past

    def decode(self, state, steps: int):
        token, past = state
        tokens = []
        started = time.perf_counter()
        for _ in range(steps):
            feeds = {**self.feeds(token[:, None], past[0].shape[2]), **dict(zip(self.past_names, past, strict=True))}
            logits, *past = self.session.run(None, feeds)
            token = logits[:, -1].argmax(-1)
            tokens.append(token)
        return time.perf_counter() - started, np.stack(tokens, 1).tolist(), (token, past)


class IoBindingLoop(BareLoop):
    """The same graph with IO binding: the presents stay OrtValues and are bound as the next past."""

    def prefill(self, prompts: np.ndarray):
        token, past = super().prefill(prompts)
        return token, [ort.OrtValue.ortvalue_from_numpy(a) for a in past]

    def decode(self, state, steps: int):
        token, past = state
        tokens = []
        started = time.perf_counter()
        binding = self.session.io_binding()  # one, reused: making one per step costs ~2 ms here
        for _ in range(steps):
            for name, value in self.feeds(token[:, None], past[0].shape()[2]).items():
                binding.bind_cpu_input(name, value)
            for name, value in zip(self.past_names, past, strict=True):
                binding.bind_ortvalue_input(name, value)
            for name in ["logits", *self.present_names]:
                binding.bind_output(name, "cpu")
            self.session.run_with_iobinding(binding)
            logits, *past = binding.get_outputs()
            binding.clear_binding_outputs()
            token = logits.numpy()[:, -1].argmax(-1)
            tokens.append(token)
        return time.perf_counter() - started, np.stack(tokens, 1).tolist(), (token, past)


class SharedBufferLoop:
    """A bare loop over a GroupQueryAttention graph (our fused export, or onnxruntime-genai's): one
    preallocated buffer per layer is bound as both past and present, so a step appends in place.
    On `device` "cuda" the buffers are CUDA OrtValues: no KV crosses to the host per step."""

    def __init__(self, model_dir: Path, threads: int, capacity: int = 2048, device: str = "cpu") -> None:
        self.session = _session(model_dir / "model.onnx", threads, device)
        self.device = device
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.has_positions = "position_ids" in inputs
        self.past_names = [n for n in inputs if n.startswith("past_key_values.")]
        self.present_names = [n.replace("past_key_values", "present") for n in self.past_names]
        if (model_dir / "genai_config.json").is_file():
            config = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
            self.heads, self.head_dim = config["num_key_value_heads"], config["head_size"]
        else:
            _, self.heads, _, self.head_dim = inputs[self.past_names[0]].shape
        self.kv_dtype = _KV_DTYPES[inputs[self.past_names[0]].type]
        self.capacity = capacity
        self.binding = self.session.io_binding()

    def _step(self, ids: np.ndarray, total: int, buffers: list[ort.OrtValue]) -> np.ndarray:
        binding = self.binding
        binding.clear_binding_outputs()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", np.ones((ids.shape[0], total), np.int64))
        if self.has_positions:
            width = ids.shape[1]
            binding.bind_cpu_input("position_ids", np.tile(np.arange(total - width, total), (ids.shape[0], 1)))
        for name, value in last_position(self.session).items():
            binding.bind_cpu_input(name, value)
        binding.bind_output("logits", "cpu")
        for past, present, buffer in zip(self.past_names, self.present_names, buffers, strict=True):
            binding.bind_ortvalue_input(past, buffer)
            binding.bind_ortvalue_output(present, buffer)
        self.session.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()[:, -1].argmax(-1)

    def prefill(self, prompts: np.ndarray):
        shape = (prompts.shape[0], self.heads, self.capacity, self.head_dim)
        # One array each: on CPU an OrtValue shares its array's memory.
        buffers = [
            ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, self.kv_dtype), self.device, 0) for _ in self.past_names
        ]
        return self._step(prompts, prompts.shape[1], buffers), prompts.shape[1], buffers

    def decode(self, state, steps: int):
        token, length, buffers = state
        if length + steps > self.capacity:
            raise ValueError(f"the shared buffer holds {self.capacity} positions")
        tokens = []
        started = time.perf_counter()
        for _ in range(steps):
            length += 1
            token = self._step(token[:, None], length, buffers)
            tokens.append(token)
        return time.perf_counter() - started, np.stack(tokens, 1).tolist(), (token, length, buffers)


class ServiceLoop:
    """The lm service as a real process, driven over gRPC with ARGMAX outputs.

    With `burst` > 1, each Decode runs up to that many greedy steps (DecodeRequest.greedy_steps), as the
    gateway drives greedy rows; with 1, a call per token."""

    def __init__(
        self, onnx_dir: Path, threads: int, log_dir: Path, providers: str = "cpu", burst: int = 1, process=None
    ) -> None:
        args = ["--model", str(onnx_dir), "--providers", providers, "--intra-op-threads", str(threads)]
        self.burst = burst
        self.owns_process = process is None
        self.process = process or ServiceProcess(
            "lm", [*args, "--max-batch-rows", "64", "--log-level", "WARNING"], log_dir
        )
        self.channel = grpc.insecure_channel(self.process.address)
        self.stub = lm_pb2_grpc.LanguageModelStub(self.channel)

    def prefill_reply(self, prompts: np.ndarray) -> lm_pb2.PrefillResponse:
        argmax = lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX)
        rows = [lm_pb2.PrefillRow(input_ids=p.tolist(), output=argmax) for p in prompts]
        return self.stub.Prefill(lm_pb2.PrefillRequest(rows=rows))

    def prefill(self, prompts: np.ndarray):
        self.stub.Clear(lm_pb2.ClearRequest())  # states of earlier measurements
        reply = self.prefill_reply(prompts)
        return reply.batch_id, [r.argmax for r in reply.output.rows]

    def step(self, request: lm_pb2.DecodeRequest) -> lm_pb2.DecodeResponse:
        return self.stub.Decode(request)

    def decode(self, state, steps: int):
        batch_id, token = state
        tokens = []
        started = time.perf_counter()
        while len(tokens) < steps:
            burst = min(self.burst, steps - len(tokens))
            batches = [lm_pb2.DecodeBatch(batch_id=batch_id, next_ids=token)]
            reply = self.step(lm_pb2.DecodeRequest(batches=batches, greedy_steps=burst if burst > 1 else 0))
            batch_id, token = reply.batch_id, [r.argmax for r in reply.output.rows]
            if burst > 1:
                tokens.extend(zip(*(r.greedy_ids for r in reply.output.rows), strict=True))
            else:
                tokens.append(token)
        return time.perf_counter() - started, [list(t) for t in zip(*tokens, strict=True)], (batch_id, token)

    def close(self) -> None:
        self.channel.close()
        if self.owns_process:
            self.process.stop()


class StreamLoop(ServiceLoop):
    """The lm driven as the gateway drives it: decode steps over one BatchSteps stream (a message
    each way per step), not a unary Decode call per step."""

    def __init__(self, onnx_dir: Path, threads: int, log_dir: Path, providers: str = "cpu", **kwargs) -> None:
        super().__init__(onnx_dir, threads, log_dir, providers, **kwargs)
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.replies = self.stub.BatchSteps(iter(self.requests.get, None))

    def step(self, request: lm_pb2.DecodeRequest) -> lm_pb2.DecodeResponse:
        self.requests.put(lm_pb2.BatchStepRequest(decode=request))
        return next(self.replies).decode

    def close(self) -> None:
        self.requests.put(None)
        super().close()


class TorchLoop:
    """transformers generate(do_sample=False); a logits processor stamps the time of every step."""

    def __init__(self, hf_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()

    def prefill(self, prompts: np.ndarray):
        return prompts

    def decode(self, prompts: np.ndarray, steps: int):
        import torch
        from transformers import LogitsProcessor

        stamps: list[float] = []

        class Stamp(LogitsProcessor):
            def __call__(self, input_ids, scores):
                stamps.append(time.perf_counter())
                return scores

        ids = torch.from_numpy(prompts)
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=steps + 1,
                min_new_tokens=steps + 1,
                pad_token_id=0,
                logits_processor=[Stamp()],
            )
        # Stamp 0 follows the prompt's forward; each later one follows one decode step.
        return stamps[-1] - stamps[0], out[:, prompts.shape[1] + 1 :].tolist(), prompts
