"""The scheduler's side of the tokenizer: a step's new ids as text deltas, stop strings, finished beams.

Every call has a deadline (`timeout_s`); a tokenizer that fails or does not answer in time raises
TokenizerFailed, and the scheduler ends the requests that were waiting on it.

The DetokenizeSteps stream has one owner: a task that sends the exchanges queued to it one at a
time, in the order they were queued. The scheduler's loop (a new request's first token) and its
overlap task (the step the lm has just left) both queue theirs. A caller that is cancelled while
its exchange is in flight leaves it to finish (the stream stays in step) and drops the reply.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from muestra.gateway.engine.clients.backends import TextModel
from muestra.gateway.engine.clients.errors import failed_message
from muestra.gateway.engine.clients.progress import Progress
from muestra.gateway.engine.clients.step_stream import StepStream
from muestra.gateway.engine.generation.request import Sequence
from muestra.runtime.errors import Unavailable
from muestra.v1 import gateway_pb2, tokenizer_pb2

# What a decode ends with while its ids end inside a UTF-8 character (the stream sends no text then).
REPLACEMENT_CHARACTER = "\ufffd"


def readable_token(text: str, data: bytes) -> str:
    """A token's text for logprobs: as decoded when its bytes are whole characters, else vLLM's form for part of a
    character, "bytes:" and the bytes as escapes ("bytes:\\xf0\\x9f")."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        if not data:
            return text
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


class TokenizerFailed(Unavailable):
    """The tokenizer failed or timed out on a call that serves a whole step."""

    def __init__(self, model: TextModel, exc: grpc.aio.AioRpcError) -> None:
        super().__init__(failed_message(f"tokenizer of {model.name!r}", exc))
        self.status = exc.code()


class Detokenizer:
    def __init__(self, model: TextModel, progress: Progress, timeout_s: float) -> None:
        self.model = model
        self.progress = progress
        self.timeout_s = timeout_s
        # DetokenizeStep runs every step: on one open stream, not a call each time, owned by one task.
        self.stream = StepStream(model.tokenizer.DetokenizeSteps, f"tokenizer of {model.name!r}", timeout_s=timeout_s)
        self.exchanges: asyncio.Queue[tuple[tokenizer_pb2.DetokenizeStepRequest, asyncio.Future]] = asyncio.Queue()
        self.owner: asyncio.Task | None = None

    async def close(self) -> None:
        """Stop the owner task (exchanges still queued fail as cancelled) and close the stream."""
        if self.owner is not None:
            self.owner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.owner
            self.owner = None
        while not self.exchanges.empty():
            self.exchanges.get_nowait()[1].cancel()
        self.stream.close()

    async def _exchange(self, request: tokenizer_pb2.DetokenizeStepRequest) -> tokenizer_pb2.DetokenizeStepResponse:
        """The reply to one DetokenizeStep, sent by the stream's owner task after those queued before it."""
        if self.owner is None or self.owner.done():
            self.owner = asyncio.get_running_loop().create_task(self._own_stream(), name=self.stream.what)
        reply: asyncio.Future = asyncio.get_running_loop().create_future()
        self.exchanges.put_nowait((request, reply))
        return await reply

    async def _own_stream(self) -> None:
        while True:
            request, reply = await self.exchanges.get()
            if reply.cancelled():
                continue  # its caller was gone before it was sent
            try:
                result = await self.stream.step(request)
            except Exception as exc:  # noqa: BLE001 - the caller raises it; the owner goes on with the next exchange
                if not reply.done():
                    reply.set_exception(exc)
            else:
                if not reply.done():
                    reply.set_result(result)
            finally:
                if not reply.done():  # the owner itself was cancelled
                    reply.cancel()

    async def step(self, rows: list) -> None:
        """One DetokenizeStep for every row with new ids; stream the text, apply stop strings."""
        active = [
            row
            for row in rows
            if isinstance(row, Sequence) and not row.done_sent and (row.detok.pending or row.finished or row.unsent_ids)
        ]
        if not active:
            return
        request = tokenizer_pb2.DetokenizeStepRequest(
            model=self.model.tokenizer_model,
            streams=[
                row.detok.next_stream(
                    final=row.finished,
                    request_id=row.request.request_id,
                    skip_special_tokens=False if row.request.special_tokens_in_text else None,
                )
                for row in active
            ],
            skip_special_tokens=True,
        )
        with self.progress.waiting_for(self.stream.what + " DetokenizeSteps"):
            try:
                reply = await self._exchange(request)
            except grpc.aio.AioRpcError as exc:
                raise TokenizerFailed(self.model, exc) from exc
        await self.name_logprob_tokens(active)
        # Generated ids already turned into text before this step (the stop strings found none in it).
        emitted = {id(row): row.detok.read_offset - (len(row.detok.ids) - len(row.generated)) for row in active}
        for row, delta in zip(active, reply.deltas, strict=True):
            text = row.stops.feed(row.detok.apply(delta))
            if row.stops.matched is not None:
                if len(row.generated) - emitted[id(row)] > 1 and not row.request.cancelled:
                    await self._end_at_stop(row, emitted[id(row)])
                row.finish(gateway_pb2.STOP, row.stops.matched)
            elif row.finished:
                text += row.stops.flush()
            if row.request.cancelled:
                row.emit_done()
                continue
            # With stop strings, ids whose text waits for a later id (it ends inside a character) wait with it:
            # a stop string found in that text may end the row before them.
            waiting = len(row.detok.ids) - row.detok.read_offset if row.request.stop and not row.finished else 0
            row.emit_text(text, hold=waiting)
            if row.finished:
                row.emit_done()

    async def _end_at_stop(self, row: Sequence, emitted: int) -> None:
        """A stop string matched in the text of several ids (a step that took drafted tokens, or ids whose text
        waited for a later id to complete a character): the row ends at the id that completed it, as it would
        one id at a time. That is the first id after which the text is whole (it does not end inside a
        character, so the stream would have sent it) and holds a stop string; the ids after it are dropped."""
        taken = len(row.generated) - emitted
        tail = row.detok.ids[: len(row.detok.ids) - len(row.generated)]  # the prompt ids that give context
        texts = await self.decode([tail, *(tail + row.generated[: emitted + j] for j in range(1, taken + 1))])
        texts = [text[len(texts[0]) :] for text in texts[1:]]
        needed = next(
            (
                j
                for j, text in enumerate(texts, 1)
                if not text.endswith(REPLACEMENT_CHARACTER) and any(stop in text for stop in row.request.stop)
            ),
            taken,
        )
        drop = taken - needed
        if drop:
            del row.generated[-drop:]
            row.unsent_ids = row.unsent_ids[:-drop]
            row.unsent_logprobs = row.unsent_logprobs[: len(row.unsent_ids)]
            # What ended the row later in the step (EOS, max_tokens) came after the stop string.
            row.finish_reason = gateway_pb2.FINISH_REASON_UNSPECIFIED

    async def decode(self, sequences: list[list[int]]) -> list[str]:
        """Each id list as text (special tokens skipped): one Decode call."""
        vocab = self.model.tokenizer_vocab_size
        request = tokenizer_pb2.DecodeTokensRequest(
            model=self.model.tokenizer_model,
            sequences=[tokenizer_pb2.TokenIds(ids=[i for i in ids if i < vocab]) for ids in sequences],
            skip_special_tokens=True,
        )
        return list((await self._decode(request)).texts)

    async def name_logprob_tokens(self, rows: list[Sequence]) -> None:
        """Fill in the text of each token listed with logprobs (one Decode call for all of them)."""
        entries = [entry for row in rows for entry in row.unsent_logprobs if not entry.token]
        if not entries:
            return
        every = {e.token_id for e in entries} | {t.token_id for e in entries for t in e.top}
        ids = sorted(i for i in every if i < self.model.tokenizer_vocab_size)
        reply = await self._decode(
            tokenizer_pb2.DecodeTokensRequest(
                model=self.model.tokenizer_model, sequences=[tokenizer_pb2.TokenIds(ids=[i]) for i in ids],
                raw_bytes=True,
            )
        )  # fmt: skip
        raw = reply.raw if len(reply.raw) == len(ids) else [text.encode() for text in reply.texts]  # an older tokenizer
        named = {i: (readable_token(text, data), data) for i, text, data in zip(ids, reply.texts, raw, strict=True)}
        for entry in entries:
            entry.token, entry.token_bytes = named.get(entry.token_id, ("", b""))
            for alternative in entry.top:
                alternative.token, alternative.token_bytes = named.get(alternative.token_id, ("", b""))

    async def _decode(self, request: tokenizer_pb2.DecodeTokensRequest) -> tokenizer_pb2.DecodeTokensResponse:
        with self.progress.waiting_for(f"tokenizer of {self.model.name!r} Decode"):
            try:
                return await self.model.tokenizer.Decode(request, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise TokenizerFailed(self.model, exc) from exc
