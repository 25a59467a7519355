"""Draft-model speculation (vLLM's and llama.cpp's "draft model"): a smaller served model with the same
tokenizer guesses the next tokens greedily, and the target model verifies them.

    speculation: {"proposer": "draft_model", "params": {"model": "smollm2-int4"}}

For each step loop of the target (one per lm replica) the proposer holds one batch on one replica of the
draft model, under a lease of its own, with a row per drafting completion. A round is one Decode there:
every row drops the draft tokens its target rejected (DecodeBatch.rollback), feeds its pending token, and
runs k+1 greedy steps (a burst in the lm: one call). The first k argmaxes are the row's draft; the draft
KV keeps k of them, so that whatever the target accepts, the next round feeds exactly one token.

A row's first draft needs its prompt and text so far in the draft model's KV: that Prefill runs in the
background on a batch of the row's own, so the target's step loop never waits on it, and the row goes on
without drafts meanwhile. At the round after it is ready, the tokens the row took meanwhile are fed (a
Decode of several tokens per row, or several) and the row joins the shared batch. Rows that stop asking
(finished, or paused by the adaptive policy) leave the batch, and their KV with them.

The draft model changes how fast a text comes, never which text: the target's sampler chain judges every
draft. If the draft model's lm fails or is slow, the rows step without drafts and the proposer tries again
after BACKOFF_S, with a new lease (the lm frees the old one's batches).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Sequence

import numpy as np

from muestra.gateway.engine.clients.lm import LmClient, LmFailed
from muestra.gateway.engine.clients.progress import Progress
from muestra.plugin import ADAPTIVE, MAX_DRAFT_TOKENS, REQUIRED, DraftProposer, DraftRow, String
from muestra.runtime.errors import InvalidArgument, MuestraError
from muestra.v1 import lm_pb2

log = logging.getLogger("muestra.gateway.proposers.draft_model")

# After a failure of the draft model's lm, its rows go without drafts this long.
BACKOFF_S = 5.0
# Most tokens one catch-up Decode feeds (the lm's default max_tokens_per_row is 32), and most a row may
# have taken while its Prefill ran and still join (more: it loads again).
CATCH_UP_TOKENS = 16
MAX_CATCH_UP = 64
# A row whose Prefill the draft model's lm refused tries again after taking this many tokens.
RETRY_TOKENS = 32
# A call to the draft model's lm that takes longer fails: the target's step waits on the round.
MAX_TIMEOUT_S = 10.0

ARGMAX = lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX)


@dataclasses.dataclass
class RowDraft:
    """What the draft model's KV holds for one completion (DraftRow.state["draft_model"])."""

    session: DraftSession
    epoch: int
    # "loading": a Prefill or catch-up of its own batch is running; "ready": its own batch holds ids[:held];
    # "merged": it is a row of the session's shared batch, which holds ids[:held] and then `speculative`;
    # "refused": the draft lm refused its Prefill (its KV budget is full): it loads again at retry_at ids;
    # "dropped": no KV.
    status: str = "loading"
    own_batch: str = ""
    held: int = 0
    speculative: list[int] = dataclasses.field(default_factory=list)
    # Set when the row stopped asking while its background work ran: free its batch when that ends.
    abandoned: bool = False
    retry_at: int = 0


class DraftSession:
    """One step loop's drafts on one replica of the draft model: a lease, a shared batch and its rows."""

    def __init__(self, model, replica, timeout_s: float, name: str) -> None:
        self.model = model
        self.replica = replica
        self.name = name
        self._new_client = lambda: LmClient(replica, Progress(), timeout_s)
        self.client = self._new_client()
        self.epoch = 0
        self.batch_id = ""
        self.rows: list[RowDraft] = []
        # Rows with batches of their own (loading or ready).
        self.pending: dict[int, RowDraft] = {}
        self.failed_until = 0.0
        self.tasks: set[asyncio.Task] = set()

    def reset(self) -> None:
        """Forget every batch: the lease's stream is closed, so the lm frees them all."""
        self.client.close()
        self.client = self._new_client()
        self.epoch += 1
        self.batch_id = ""
        self.rows = []
        self.pending = {}

    def failed(self, exc: Exception) -> None:
        log.warning("draft model %s (%s) failed: %s; no drafts from it for %.0f s", self.model.name,
                    self.replica.address, exc, BACKOFF_S)  # fmt: skip
        self.failed_until = time.monotonic() + BACKOFF_S
        self.reset()

    def state(self, row: DraftRow) -> RowDraft | None:
        """The row's draft KV in this session, or None (none, or lost with an earlier lease)."""
        draft = row.state.get("draft_model")
        if draft is None or draft.session is not self or draft.epoch != self.epoch or draft.status == "dropped":
            return None
        return draft

    async def propose(self, rows: Sequence[DraftRow]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in rows]
        if time.monotonic() < self.failed_until:
            return drafts
        # Greedy steps of this round: one more than the longest draft, so the KV keeps every draft token.
        steps = min(max(row.max_tokens for row in rows) + 1, self.replica.max_greedy_steps)
        # Ids past the shared tokenizer's are the draft model's padding: a draft ends before one.
        vocab = self.model.tokenizer_vocab_size or self.model.vocab_size
        asking = {id(self.state(row)) for row in rows if self.state(row) is not None}
        self._forget_absent(asking)
        keep: list[tuple[int, RowDraft, int, int]] = []  # (row index, state, rollback, next id)
        joining: list[tuple[int, RowDraft, int]] = []  # (row index, state, next id)
        for index, row in enumerate(rows):
            ids = row.ids
            if (
                ids.size < 2
                or int(ids.max()) >= self.model.vocab_size
                or ids.size - 1 + steps > self.model.context_length
            ):
                continue
            draft = self.state(row)
            if draft is None:
                self._load(row)
            elif draft.status == "merged":
                fed = _common(draft.speculative, ids[draft.held :])
                fed = min(fed, ids.size - draft.held - 1)  # the pending token is fed this round
                if ids.size - (draft.held + fed) == 1:
                    keep.append((index, draft, len(draft.speculative) - fed, int(ids[-1])))
                else:  # it took tokens the draft KV never saw (it did not ask for a while): load it again
                    draft.status = "dropped"
                    self._load(row)
            elif draft.status == "refused":
                if ids.size >= draft.retry_at:
                    self._load(row)
            elif draft.status == "ready":
                if ids.size - 1 - draft.held > MAX_CATCH_UP:
                    self.pending.pop(id(draft), None)
                    self._spawn(self._clear([draft.own_batch]))
                    self._load(row)
                else:
                    joining.append((index, draft, int(ids[-1])))
        if not keep and not joining:
            await self._filter([])
            return drafts
        try:
            for index, draft, _ in joining:
                await self._catch_up(rows[index], draft)
            await self._filter([draft for _, draft, *_ in keep])
            batches = []
            if keep:
                batches.append(lm_pb2.DecodeBatch(
                    batch_id=self.batch_id, next_ids=[n for *_, n in keep], outputs=[ARGMAX] * len(keep),
                    rollback=[r for _, _, r, _ in keep],
                ))  # fmt: skip
            for _, draft, next_id in joining:
                batches.append(lm_pb2.DecodeBatch(batch_id=draft.own_batch, next_ids=[next_id], outputs=[ARGMAX]))
            reply = await self.client.decode(lm_pb2.DecodeRequest(batches=batches, greedy_steps=steps))
        except MuestraError as exc:
            self.failed(exc)
            return drafts
        self.batch_id = reply.batch_id
        self.rows = []
        for (index, draft, *_), out in zip([*keep, *joining], reply.output.rows, strict=True):
            greedy = [int(t) for t in out.greedy_ids]
            if draft.status == "ready":
                self.pending.pop(id(draft), None)
                draft.status, draft.own_batch = "merged", ""
            draft.held = rows[index].ids.size
            draft.speculative = greedy[: steps - 1]
            drafts[index] = list(itertools.takewhile(lambda t: t < vocab, greedy[: rows[index].max_tokens]))
            self.rows.append(draft)
        return drafts

    def _forget_absent(self, asking: set[int]) -> None:
        """Rows that do not ask this round lose their draft KV (the shared batch is filtered below)."""
        for key, draft in list(self.pending.items()):
            if key not in asking:
                del self.pending[key]
                if draft.status == "ready":
                    self._spawn(self._clear([draft.own_batch]))
                draft.abandoned = True
                draft.status = "dropped"
        for draft in self.rows:
            if id(draft) not in asking:
                draft.status = "dropped"

    async def _filter(self, keep: list[RowDraft]) -> None:
        """The shared batch with the rows of `keep` alone, in that order."""
        if [id(d) for d in keep] == [id(d) for d in self.rows]:
            return
        for draft in self.rows:
            if all(draft is not k for k in keep):
                draft.status = "dropped"
        if not keep:
            batch_id, self.batch_id, self.rows = self.batch_id, "", []
            if batch_id:
                self._spawn(self._clear([batch_id]))
            return
        order = {id(d): i for i, d in enumerate(self.rows)}
        self.batch_id = await self.client.filter(self.batch_id, [order[id(d)] for d in keep])
        self.rows = list(keep)

    def _load(self, row: DraftRow) -> None:
        """Prefill the row's ids but its pending token, on a batch of its own, in the background."""
        draft = RowDraft(self, self.epoch)
        row.state["draft_model"] = draft
        self.pending[id(draft)] = draft
        prefill = lm_pb2.PrefillRequest(rows=[lm_pb2.PrefillRow(
            request_id=f"draft-{next(_ids)}", input_ids=row.ids[:-1].tolist(), output=ARGMAX,
        )])  # fmt: skip
        self._spawn(self._background(draft, row.ids.size - 1, self.client.prefill(prefill)))

    async def _catch_up(self, row: DraftRow, draft: RowDraft) -> None:
        """Feed what the row took while its own batch loaded (a greedy row runs bursts meanwhile), but its
        pending token, so that it joins this round."""
        while draft.held < row.ids.size - 1:
            missing = row.ids[draft.held : -1][:CATCH_UP_TOKENS]
            batch = lm_pb2.DecodeBatch(batch_id=draft.own_batch, next_ids=missing.tolist(), outputs=[ARGMAX])
            reply = await self.client.decode(lm_pb2.DecodeRequest(batches=[batch], tokens_per_row=missing.size))
            draft.own_batch, draft.held = reply.batch_id, draft.held + missing.size

    async def _background(self, draft: RowDraft, held: int, call) -> None:
        epoch = self.epoch
        try:
            reply = await call
        except MuestraError as exc:
            if epoch == self.epoch:
                self.pending.pop(id(draft), None)
                if isinstance(exc, LmFailed):
                    draft.status = "dropped"
                    self.failed(exc)
                else:  # refused for this row alone (the draft lm's KV is full, say): it tries again later
                    log.info("draft model %s refused a row: %s", self.model.name, exc)
                    draft.status, draft.retry_at = "refused", held + 1 + RETRY_TOKENS
            return
        if epoch != self.epoch:
            return
        draft.own_batch, draft.held = reply.batch_id, held
        if draft.abandoned:
            await self._clear([draft.own_batch])
            return
        draft.status = "ready"

    async def _clear(self, batch_ids: list[str]) -> None:
        try:
            await self.client.clear(batch_ids)
        except MuestraError as exc:
            log.info("freeing draft batches on %s: %s", self.replica.address, exc)

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=f"draft model {self.name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.client.close()


_ids = itertools.count()


def _common(speculative: list[int], ids: np.ndarray) -> int:
    """How many of the draft KV's speculative tokens the row actually took (a common prefix)."""
    n = min(len(speculative), ids.size)
    if n == 0:
        return 0
    same = np.asarray(speculative[:n]) == ids[:n]
    return n if same.all() else int(np.argmin(same))


class DraftModelProposer(DraftProposer):
    name = "draft_model"
    description = "A smaller served model with the same tokenizer drafts greedily; the target verifies."
    parameters = {
        "model": String(REQUIRED, "The served text model that drafts (same tokenizer as the target).", max_length=256),
        "max_draft_tokens": MAX_DRAFT_TOKENS,
        "adaptive": ADAPTIVE,
    }

    def __init__(self) -> None:
        self._models = None
        self._timeout_s = MAX_TIMEOUT_S
        # (step loop, draft model name) -> its session; and a counter that spreads loops over replicas.
        self._sessions: dict[tuple[int, str], tuple[object, DraftSession]] = {}
        self._spread = itertools.count()

    def attach(self, models, lm_timeout_s: float) -> None:
        """Keep the gateway's served models (a ModelRegistry), where draft models are found."""
        self._models = models
        self._timeout_s = min(lm_timeout_s, MAX_TIMEOUT_S)

    def check_target(self, params: dict, model) -> None:
        """InvalidArgument naming speculation.params.model unless params["model"] is another served text model
        with the same tokenizer as `model` (a TextModel)."""
        field = "speculation.params.model"
        name = params["model"]
        served = self._models.text if self._models is not None else {}
        if name not in served:
            known = ", ".join(sorted(served)) or "none"
            raise InvalidArgument(field, f"{name!r} is not a served text model (served: {known})")
        if name == model.name:
            raise InvalidArgument(field, f"{name!r} is the model being sampled; name a smaller one")
        draft = served[name]
        if (draft.tokenizer_vocab_size, draft.special_token_ids, draft.eos_token_ids) != (
            model.tokenizer_vocab_size, model.special_token_ids, model.eos_token_ids
        ):  # fmt: skip
            raise InvalidArgument(
                field,
                f"{name!r} has another tokenizer than {model.name!r} ({draft.tokenizer_vocab_size} against "
                f"{model.tokenizer_vocab_size} ids, or other special or end ids); a draft model must share it",
            )

    async def propose(self, rows: Sequence[DraftRow]) -> list[list[int]]:
        by_model: dict[str, list[int]] = {}
        for index, row in enumerate(rows):
            by_model.setdefault(row.params["model"], []).append(index)
        drafts: list[list[int]] = [[] for _ in rows]
        for name, indices in by_model.items():
            session = self._session(rows[indices[0]].group, name)
            if session is None:
                continue
            for index, draft in zip(indices, await session.propose([rows[i] for i in indices]), strict=True):
                drafts[index] = draft
        return drafts

    def idle(self, group: object) -> None:
        for key in [k for k in self._sessions if k[0] == id(group)]:
            self._sessions.pop(key)[1].close()

    def _session(self, group: object, name: str) -> DraftSession | None:
        key = (id(group), name)
        if key not in self._sessions:
            model = self._models.text.get(name) if self._models is not None else None
            if model is None:
                return None
            replica = model.replicas[next(self._spread) % len(model.replicas)]
            # The group is kept with its session so that its id is not reused while the session lives.
            self._sessions[key] = (group, DraftSession(model, replica, self._timeout_s, name))
        return self._sessions[key][1]
