"""Sampled bursts: rows whose tokens the lm picks with their own sampler chains, several steps per Decode.

The gateway runs a sampled row's chain after every step, a round trip and a row of full logits per token. A
row whose chain has only samplers that declare `runs_in_lm` can instead be sent with its chain, its
generator's state, its sampler state and its ids (DecodeBatch.samplers): the lm then picks its tokens itself
with the same plugin code, loaded from the same entry points, through the same `pick_tokens`, on the same
float32 logits it would have shipped, so the tokens are those the gateway would have picked. The state
goes back with the reply (RowOutput.rng_json, state_json) and the gateway goes on from it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence

import numpy as np

from muestra.plugin import (
    LogitsProcessor,
    ModelInfo,
    RowContext,
    Sampler,
    SamplerParamError,
    TokenSelector,
    group_rows,
    pick_tokens,
)
from muestra.plugin.builtins import load_samplers
from muestra.runtime.errors import InvalidArgument, check_limit
from muestra.v1 import lm_pb2

log = logging.getLogger("muestra.lm.sampling")
# Longest chain, and largest chain or state JSON, a row may send.
MAX_CHAIN_LENGTH = 32
MAX_JSON_BYTES = 64 * 1024
# Validated chains kept by their JSON text (most requests share a few: the model's default, a client's own).
CHAINS_KEPT = 256


@dataclasses.dataclass(frozen=True)
class LmChain:
    """A validated chain: its samplers in order (processors, then the selector) and their params."""

    samplers: tuple[Sampler, ...]
    params: tuple[dict, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """Rows whose chains have the same samplers in the same order are picked together."""
        return tuple(id(sampler) for sampler in self.samplers)


@dataclasses.dataclass
class SampledRow:
    """A row of a Decode whose tokens its chain picks: the chain and the row's context (ids, rng, state)."""

    chain: LmChain
    context: RowContext

    def state(self) -> tuple[str, str]:
        """The generator's and the samplers' state as JSON, as RowOutput carries them back."""
        return json.dumps(self.context.rng.bit_generator.state), json.dumps(self.context.state)


class LmSamplers:
    """The samplers this service may run (those registered with runs_in_lm) and the chains it has validated.

    Rows are parsed on the server's event loop only; the model thread only picks with what they hold."""

    def __init__(self, samplers: Mapping[str, tuple[Sampler, str, str]], model: ModelInfo) -> None:
        # name -> (sampler, distribution, version)
        self._samplers = dict(samplers)
        self.model = model
        self._chains: collections.OrderedDict[str, LmChain] = collections.OrderedDict()

    @classmethod
    def load(cls, model: ModelInfo, env: Mapping[str, str] | None = None) -> LmSamplers:
        """Every sampler the plugins register that declares runs_in_lm (MUESTRA_DISABLE_PLUGINS applies)."""
        _, registered = load_samplers(env)
        runnable = {
            entry.name: (entry.value, entry.distribution, entry.version)
            for entry in registered
            if entry.value.runs_in_lm and isinstance(entry.value, (LogitsProcessor, TokenSelector))
        }
        log.info("samplers run in sampled bursts: %s", ", ".join(sorted(runnable)) or "none")
        return cls(runnable, model)

    def sources(self) -> list[lm_pb2.SamplerSource]:
        return [
            lm_pb2.SamplerSource(name=name, distribution=dist, version=version)
            for name, (_, dist, version) in sorted(self._samplers.items())
        ]

    def row(self, field: str, message: lm_pb2.RowSampler) -> SampledRow:
        """A RowSampler as a SampledRow; InvalidArgument naming the field when any part of it is unusable."""
        chain = self.chain(f"{field}.chain_json", message.chain_json)
        rng = np.random.Generator(np.random.PCG64())
        state = _json_object(f"{field}.rng_json", message.rng_json)
        try:
            if state.get("bit_generator") != "PCG64":
                raise ValueError("not a PCG64 state")
            rng.bit_generator.state = state
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            raise InvalidArgument(f"{field}.rng_json", f"must be numpy's PCG64 state as JSON ({exc})") from None
        prompt = np.asarray(message.prompt_ids, dtype=np.int64)
        output = np.asarray(message.output_ids, dtype=np.int64)
        check_limit(f"{field}.output_ids", prompt.size + output.size, 0, self.model.context_length)
        for name, ids in (("prompt_ids", prompt), ("output_ids", output)):
            if ids.size and int(ids.max()) >= self.model.vocab_size:
                raise InvalidArgument(
                    f"{field}.{name}", f"ids must be below the vocabulary size {self.model.vocab_size}"
                )
        context = RowContext(prompt, rng, output)
        context.state = _json_object(f"{field}.state_json", message.state_json) if message.state_json else {}
        return SampledRow(chain, context)

    def chain(self, field: str, text: str) -> LmChain:
        if text in self._chains:
            self._chains.move_to_end(text)
            return self._chains[text]
        check_limit(field, len(text.encode()), 1, MAX_JSON_BYTES)
        specs = _json(field, text)
        if not isinstance(specs, list) or not specs:
            raise InvalidArgument(
                field, 'must be a JSON list of {"name", "params"} objects, processors then a selector'
            )
        check_limit(field, len(specs), 1, MAX_CHAIN_LENGTH)
        samplers, params = [], []
        for i, spec in enumerate(specs):
            name = spec.get("name") if isinstance(spec, dict) else None
            if not isinstance(name, str) or name not in self._samplers:
                raise InvalidArgument(
                    f"{field}[{i}].name",
                    f"{name!r} does not run in this lm; it runs: {', '.join(sorted(self._samplers)) or 'none'}",
                )
            sampler = self._samplers[name][0]
            last = i == len(specs) - 1
            if isinstance(sampler, TokenSelector) != last:
                what = "the last sampler must pick the token" if last else "only the last sampler may pick the token"
                raise InvalidArgument(f"{field}[{i}]", f"{what} ({name!r})")
            given = spec.get("params") or {}
            if not isinstance(given, dict):
                raise InvalidArgument(f"{field}[{i}].params", "must be a JSON object")
            try:
                params.append(sampler.validate(given, self.model))
            except SamplerParamError as exc:
                raise InvalidArgument(f"{field}[{i}].params.{exc.field}", f"{exc.message} (sampler {name!r})") from None
            samplers.append(sampler)
        chain = LmChain(tuple(samplers), tuple(params))
        self._chains[text] = chain
        if len(self._chains) > CHAINS_KEPT:
            self._chains.popitem(last=False)
        return chain


def _json(field: str, text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(field, f"is not JSON: {exc}") from None


def _json_object(field: str, text: str) -> dict:
    check_limit(field, len(text.encode()), 0, MAX_JSON_BYTES)
    value = _json(field, text)
    if not isinstance(value, dict):
        raise InvalidArgument(field, "must be a JSON object")
    return value


def pick(rows: Sequence[SampledRow | None], logits: np.ndarray) -> tuple[np.ndarray, list[str | None]]:
    """Each sampled row's next token from its chain over its row of `logits` (appended to its context), as
    the gateway's runner picks it: rows with the same samplers together, a group that fails retried row by
    row so only the failing rows fail. Returns int64 [rows] (-1 where no token: no chain, or it failed) and
    each row's error (None when it picked)."""
    tokens = np.full(len(rows), -1, dtype=np.int64)
    errors: list[str | None] = [None] * len(rows)
    sampled = [i for i, row in enumerate(rows) if row is not None]
    for _, members in group_rows([rows[i].chain.shape for i in sampled]):
        index = [sampled[m] for m in members]
        saved = [rows[i].context.snapshot() for i in index]
        try:
            tokens[index] = _run(rows, index, logits)
        except Exception:  # noqa: BLE001 - retried row by row below, where it is logged
            for i, snapshot in zip(index, saved, strict=True):
                rows[i].context.restore(snapshot)
            for i in index:
                try:
                    tokens[i] = _run(rows, [i], logits)[0]
                except Exception as exc:
                    log.exception("sampler chain %s failed", [s.name for s in rows[i].chain.samplers])
                    errors[i] = f"sampler chain failed: {exc}"
    for i in sampled:
        if errors[i] is None:
            rows[i].context.append(int(tokens[i]))
    return tokens, errors


def _run(rows: Sequence[SampledRow], index: list[int], logits: np.ndarray) -> np.ndarray:
    chain = rows[index[0]].chain
    params = [[rows[i].chain.params[position] for i in index] for position in range(len(chain.samplers))]
    scores = logits[index].astype(np.float32, copy=False)  # indexing by a list copies already
    tokens, _ = pick_tokens(chain.samplers, params, scores, [rows[i].context for i in index])
    return tokens
