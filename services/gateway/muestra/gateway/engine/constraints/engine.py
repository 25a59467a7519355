"""The grammar engine behind every constraint kind: llguidance, one tokenizer per text model.

llguidance was chosen by measurement (docs/architecture.md, "Structured generation"): it compiles
JSON Schema, regex and Lark grammars, fills numpy bitmasks without torch, releases the GIL while
it works, and computes a row's mask in tens of microseconds.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import llguidance
import llguidance.numpy as llg_numpy
import numpy as np

from muestra.gateway.engine.clients.errors import failed_message
from muestra.gateway.engine.constraints.json_text import JsonText, JsonTokens
from muestra.gateway.engine.constraints.registry import ConstraintRegistry
from muestra.plugin import REQUIRED, Grammar, SamplerParamError
from muestra.runtime.errors import FailedPrecondition, InvalidArgument, Unavailable
from muestra.v1 import tokenizer_pb2

log = logging.getLogger("muestra.constraints")
COMPILED_CACHE_SIZE = 64
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclasses.dataclass(frozen=True)
class ConstraintLimits:
    """What one request's constraint may cost the gateway."""

    max_bytes: int = 256 * 1024  # the grammar's source (schema JSON, regex or Lark text)
    compile_timeout_s: float = 10.0


class CompiledConstraint:
    """A request's compiled grammar in its start state; each completion advances a copy of it."""

    def __init__(
        self, name: str, matcher: llguidance.LLMatcher, vocab_size: int, json_tokens: JsonTokens | None = None
    ) -> None:
        self.name = name
        self.matcher = matcher
        self.words = (vocab_size + 31) // 32
        self.json_tokens = json_tokens  # set when the text is JSON: its keys and numbers are then checked too

    def new_row(self) -> RowConstraint:
        return RowConstraint(self.matcher.deep_copy(), self.words, self.json_tokens)


class RowConstraint:
    """One completion's place in the grammar, and the tokens it may take next."""

    def __init__(self, matcher: llguidance.LLMatcher, words: int, json_tokens: JsonTokens | None = None) -> None:
        self.matcher = matcher
        self.json_tokens = json_tokens
        self.json = JsonText() if json_tokens is not None else None
        self.mask = np.zeros(words, dtype=np.int32)  # set by fill_masks before every step
        self.forced: int | None = None  # the only allowed next token, when there is one
        self.forced_count = 0
        self.closing = False  # steered to end by closing_masks at least once
        self.error = ""

    def consume(self, token: int) -> bool:
        """Advance by the chosen token; False (with .error) if the grammar does not allow it."""
        if token == self.forced:
            self.forced_count += 1
        if not self.matcher.consume_token(token):
            self.error = f"the constraint does not allow token {token}: {short_error(self.matcher.get_error())}"
            return False
        broken = self.json.feed(self.json_tokens.token_bytes[token]) if self.json is not None else ""
        if broken:
            self.error = f"the constraint does not allow token {token}: {broken}"
            return False
        return True

    @property
    def complete(self) -> bool:
        """The text is a whole sentence of the language and nothing may follow it."""
        return self.matcher.is_stopped()

    def mask_bytes(self) -> bytes:
        return self.mask.tobytes()


def short_error(message: str, limit: int = 600) -> str:
    """An engine error on one line: its first line and its `error:` lines, no parser-state dump or carets."""
    lines = [line.strip() for line in message.split("<state>", 1)[0].splitlines() if line.strip()]
    if not lines:
        return ""
    message = " ".join([lines[0], *(line for line in lines[1:] if line.startswith("error:"))])
    return message if len(message) <= limit else message[: limit - 1] + "…"


_executor: llguidance.LLExecutor | None = None


# A JSON row whose tokens left come within CLOSING_MARGIN, or the last CLOSING_SHARE of its max_tokens, of what
# closing its text takes (JsonText.closing_tokens, doubled: a quote or bracket is not always one token; an object
# may still need its required keys) is steered to end: see closing_masks.
CLOSING_MARGIN = 6
CLOSING_SHARE = 0.2


def closing_masks(rows: list[RowConstraint], masks: np.ndarray, tokens_left: list[int], max_tokens: list[int]) -> None:
    """Narrow the mask of each JSON row about to run out of tokens (max_tokens, or the context) to the tokens that
    close its string or containers where the grammar allows any, else (outside a string) to short values and
    separators (null, digits, commas): a model repeating itself inside an unbounded array or string then ends with a
    whole, valid text instead of being cut mid-value. Rows that end earlier never meet it: their texts are the
    same."""
    for i, row in enumerate(rows):
        margin = max(CLOSING_MARGIN, int(CLOSING_SHARE * max_tokens[i]))
        if row.json is None or tokens_left[i] > 2 * row.json.closing_tokens() + margin:
            continue
        for allowed in row.json.closing_steps(row.json_tokens):
            narrowed = masks[i] & allowed
            if narrowed.any():
                masks[i] = narrowed
                row.closing = True
                break


def fill_masks(
    rows: list[RowConstraint], tokens_left: list[int] | None = None, max_tokens: list[int] | None = None
) -> None:
    """Compute every row's next allowed-token mask (in parallel, without the GIL) and its forced token;
    `tokens_left` (per row) steers the JSON rows about to run out of tokens to end (closing_masks).

    A row whose grammar allows nothing (a dead end) gets an empty mask and an .error."""
    global _executor
    if not rows:
        return
    if _executor is None:
        _executor = llguidance.LLExecutor()
    masks = np.zeros((len(rows), rows[0].mask.size), dtype=np.int32)
    llg_numpy.fill_next_token_bitmask_par(_executor, [(row.matcher, i) for i, row in enumerate(rows)], masks)
    for i, row in enumerate(rows):
        if row.json is not None:
            row.json.remove_breaking(masks[i], row.json_tokens)
            remove_dead_keys(row, masks[i])
    if tokens_left is not None:
        closing_masks(rows, masks, tokens_left, max_tokens or tokens_left)
    counts = np.bitwise_count(masks.view(np.uint32)).sum(axis=1)
    for i, row in enumerate(rows):
        row.mask = masks[i]
        row.forced = None
        if counts[i] == 0:
            detail = short_error(row.matcher.get_error()) or (
                "every token the grammar allows would repeat a key or lengthen a number past its digits"
                if row.json is not None
                else "no token can continue the text"
            )
            row.error = f"the constraint reached a dead end: {detail}"
        elif counts[i] == 1:
            word = int(np.flatnonzero(masks[i])[0])
            row.forced = 32 * word + int(masks[i].view(np.uint32)[word]).bit_length() - 1


def remove_dead_keys(row: RowConstraint, mask: np.ndarray) -> None:
    """Clear the tokens that spell out a key the object already has when the grammar could only close it there:
    masking the closing quote alone would leave the row at a dead end one step later."""
    words = mask.view(np.uint32)
    for token in row.json.reaching_used_keys(row.json_tokens):
        if not words[token >> 5] >> (token & 31) & 1:
            continue
        ahead = row.matcher.deep_copy()
        ahead.consume_token(token)
        after = np.frombuffer(ahead.compute_bitmask(), dtype=np.uint8)
        if not np.any(after[: row.json_tokens.unquoted.size] & row.json_tokens.unquoted[: after.size]):
            words[token >> 5] &= ~np.uint32(1 << (token & 31))


def token_bytes(tokenizer: llguidance.LLTokenizer, vocab_size: int) -> list[bytes]:
    """Each token's bytes, for the model's whole vocabulary (ids past the tokenizer's are empty)."""
    known = [tokenizer.decode_bytes([i]) for i in range(min(tokenizer.vocab_size, vocab_size))]
    return known + [b""] * (vocab_size - len(known))


def grammar_text(grammar: Grammar) -> str:
    """The grammar as llguidance's LLMatcher takes it."""
    if grammar.kind == "json_schema":
        # No free whitespace between tokens: a sampled model could otherwise pad forever. A schema's
        # own "x-guidance" options still apply over these.
        return llguidance.LLMatcher.grammar_from_json_schema(grammar.source, defaults=JSON_OPTIONS)
    if grammar.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(grammar.source)
    if grammar.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(grammar.source)
    raise ValueError(f"unknown grammar kind {grammar.kind!r}")


class GrammarEngine:
    """Compiles one text model's constraints; fetches its tokenizer from the tokenizer service once."""

    def __init__(self, model, limits: ConstraintLimits, tokenizer_timeout_s: float) -> None:
        self.model = model
        self.limits = limits
        self.tokenizer_timeout_s = tokenizer_timeout_s
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._json_tokens: JsonTokens | None = None
        self._tokenizer_lock = asyncio.Lock()
        self._compiled: collections.OrderedDict[tuple[str, str], llguidance.LLMatcher] = collections.OrderedDict()
        # Compiles run here, so a slow one never holds up the event loop or the default executor.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="constraint-compile")

    async def tokenizer(self) -> llguidance.LLTokenizer:
        async with self._tokenizer_lock:
            if self._tokenizer is None:
                self._tokenizer = await self._load_tokenizer()
            return self._tokenizer

    async def _load_tokenizer(self) -> llguidance.LLTokenizer:
        model = self.model
        request = tokenizer_pb2.DescribeTokenizerRequest(model=model.tokenizer_model)
        try:
            call = model.tokenizer.ExportTokenizer(request, timeout=self.tokenizer_timeout_s)
            data = b"".join([chunk.data async for chunk in call])
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise FailedPrecondition(f"constraints are not available for {model.name!r}: {exc.details()}") from exc
            raise Unavailable(failed_message(f"tokenizer of {model.name!r}", exc)) from exc
        if model.tokenizer_vocab_size > model.vocab_size:
            raise FailedPrecondition(
                f"constraints are not available for {model.name!r}: its tokenizer has "
                f"{model.tokenizer_vocab_size} tokens, more than the model's {model.vocab_size} logits"
            )

        def build() -> llguidance.LLTokenizer:
            return llguidance.LLTokenizer(
                data.decode("utf-8"), n_vocab=model.vocab_size, eos_token=list(model.eos_token_ids) or None
            )

        tokenizer = await asyncio.get_running_loop().run_in_executor(self._pool, build)
        self._json_tokens = await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: JsonTokens(token_bytes(tokenizer, model.vocab_size))
        )
        log.info("grammar engine ready for %s (%d tokens)", model.name, tokenizer.vocab_size)
        return tokenizer

    async def compile(
        self, registry: ConstraintRegistry, name: str, params: Any, field: str = "constraint"
    ) -> CompiledConstraint:
        """Validate and compile a request's constraint; InvalidArgument names the field and the limit."""
        if name not in registry:
            known = ", ".join(registry.names()) or "none"
            raise InvalidArgument(f"{field}.name", f"unknown constraint kind {name!r}; registered: {known}")
        constraint = registry.get(name)
        try:
            checked = constraint.validate(params)
        except SamplerParamError as exc:
            raise InvalidArgument(f"{field}.params.{exc.field}", f"{exc.message} (constraint {name!r})") from None
        # The grammar's source is the kind's one required parameter, when it has one.
        required = [key for key, param in constraint.parameters.items() if param.default is REQUIRED]
        where = f"{field}.params" + (f".{required[0]}" if len(required) == 1 else "")
        try:
            grammar = constraint.grammar(checked)
            size = len(grammar.source.encode("utf-8"))
            if size > self.limits.max_bytes:
                raise InvalidArgument(
                    where, f"is {size} bytes as a {grammar.kind}; the limit is {self.limits.max_bytes}"
                )
            text = grammar_text(grammar)
        except SamplerParamError as exc:
            raise InvalidArgument(f"{field}.params.{exc.field}", f"{exc.message} (constraint {name!r})") from None
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(where, f"{exc} (constraint {name!r})") from None
        tokenizer = await self.tokenizer()
        key = (grammar.kind, grammar.source)
        matcher = self._compiled.get(key)
        if matcher is None:
            matcher = await self._compile(tokenizer, text, where, grammar.kind)
            self._compiled[key] = matcher
            while len(self._compiled) > COMPILED_CACHE_SIZE:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
        json_tokens = self._json_tokens if grammar.kind == "json_schema" else None
        return CompiledConstraint(name, matcher.deep_copy(), self.model.vocab_size, json_tokens)

    async def _compile(self, tokenizer, text: str, where: str, kind: str) -> llguidance.LLMatcher:
        limit = self.limits.compile_timeout_s
        work = asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: llguidance.LLMatcher(tokenizer, text, log_level=0)
        )
        try:
            matcher = await asyncio.wait_for(work, limit)
        except asyncio.TimeoutError:
            # The thread finishes on its own: llguidance bounds its work with fuel limits.
            raise InvalidArgument(where, f"did not compile within {limit:g} s (the gateway's limit)") from None
        if matcher.is_error():
            raise InvalidArgument(where, f"the {kind} does not compile: {short_error(matcher.get_error())}")
        return matcher
