"""Spreading requests over a text model's lm replicas.

A request goes to the healthy replica that holds the longest prefix of its prompt: every replica's
prompts, and its finished rows (prompt and answer: where a conversation stands), are remembered by the
chained hashes of their blocks of --affinity-tokens tokens, so a conversation's next turn returns to the
replica whose hot tier holds its KV. Without such a replica, requests sharing a `prompt_cache_key` (or
OpenAI `user`) go where the last one went; otherwise to the least-loaded healthy replica.

A health loop takes failing replicas out and puts them back when they recover, and re-resolves DNS names so
that `--scale lm=N` or a headless Service adds replicas without a restart. Busy is not unhealthy: a replica
that answers its health check late while it computes stays in (the deadlines of its own calls catch one that
is stuck), and so does a lone replica that is only slow.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from muestra.gateway.engine.clients.backends import LmReplica, TextModel, expand_target
from muestra.gateway.engine.generation.request import GenerationRequest
from muestra.gateway.engine.generation.scheduler import ReplicaScheduler
from muestra.runtime.channels import service_channel
from muestra.runtime.errors import Unavailable
from muestra.runtime.prefix_hash import block_hashes
from muestra.v1 import lm_pb2, lm_pb2_grpc

log = logging.getLogger("muestra.gateway.generation.routing")
AFFINITY_ENTRIES = 65536
# Health checks of an idle replica that time out in a row before it leaves the rotation.
SLOW_CHECKS = 3


def prefix_key(prompt_ids: list[int], tokens: int) -> bytes:
    head = prompt_ids[:tokens]
    return hashlib.blake2b(b"".join(i.to_bytes(4, "little") for i in head), digest_size=16).digest()


class SequenceAffinity:
    """Which replica holds the KV of which token sequences, by the chained hashes of their blocks (and of
    prompts too short for one), and where each prompt_cache_key went last; least recently used forgotten."""

    def __init__(self, fingerprint: str, block_size: int, entries: int = AFFINITY_ENTRIES) -> None:
        self.fingerprint = fingerprint
        self.block_size = block_size
        self.entries = entries
        self._sequences: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._hints: collections.OrderedDict[str, str] = collections.OrderedDict()

    def keys(self, ids: list[int]) -> list[bytes]:
        """The keys of a sequence's prefixes, shortest first (a sequence shorter than a block is one key)."""
        return block_hashes(self.fingerprint, ids, self.block_size) or [prefix_key(ids, self.block_size)]

    def holder(self, keys: list[bytes], hint: str, candidates: set[str]) -> str | None:
        """The candidate that holds the longest of these prefixes, else the one the hint went to, else None."""
        for key in reversed(keys):
            address = self._sequences.get(key)
            if address in candidates:
                return address
        address = self._hints.get(hint) if hint else None
        return address if address in candidates else None

    def record(self, keys: list[bytes], address: str, hint: str = "") -> None:
        for key in keys:
            _remember(self._sequences, key, address, self.entries)
        if hint:
            _remember(self._hints, hint, address, self.entries)


def _remember(table: collections.OrderedDict, key, value: str, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)


class Router:
    """The replicas of one text model, with their schedulers, health and prefix affinity."""

    def __init__(self, model: TextModel, config) -> None:
        self.model = model
        self.config = config
        self.schedulers: dict[str, ReplicaScheduler] = {}
        self.affinity = SequenceAffinity(model.fingerprint, config.affinity_tokens)
        self.targets = list(config_targets(model))
        for replica in model.replicas:
            self._add(replica)
        self.task: asyncio.Task | None = None

    def _add(self, replica: LmReplica) -> ReplicaScheduler:
        scheduler = ReplicaScheduler(
            self.model, replica, self.config, reroute=self.reroute, out_of_rotation=self.mark_unhealthy,
            finished=self.finished,
        )  # fmt: skip
        self.schedulers[replica.address] = scheduler
        return scheduler

    def waits_of(self, address: str) -> str:
        """What the scheduler of this replica is awaiting now (for errors), or ''."""
        scheduler = self.schedulers.get(address)
        return "; ".join(scheduler.progress.waits()) if scheduler is not None else ""

    def healthy(self) -> list[ReplicaScheduler]:
        return [s for s in self.schedulers.values() if s.healthy]

    # -- requests -----------------------------------------------------------------------------

    def submit(self, generation: GenerationRequest, exclude: ReplicaScheduler | None = None) -> None:
        self.start()
        candidates = [s for s in self.healthy() if s is not exclude]
        if not candidates:
            raise Unavailable(f"no healthy lm replica for model {self.model.name}")
        keys = self.affinity.keys(generation.prompt_ids)
        hint = generation.prompt_cache_key
        address = self.affinity.holder(keys, hint, {s.replica.address for s in candidates})
        chosen = self.schedulers[address] if address else min(candidates, key=lambda s: s.load())
        self.affinity.record(keys, chosen.replica.address, hint)
        chosen.submit(generation)

    def finished(self, scheduler: ReplicaScheduler, request: GenerationRequest, ids: list[int]) -> None:
        """A request's row left `scheduler`'s batch holding `ids` (its prompt and answer): that replica's hot
        tier keeps them, so a prompt that starts with them goes there."""
        self.affinity.record(self.affinity.keys(ids), scheduler.replica.address)

    def reroute(self, generation: GenerationRequest, failed: ReplicaScheduler) -> None:
        """`failed` could not start this request (its replica is down): send it elsewhere."""
        self.mark_unhealthy(failed)
        try:
            self.submit(generation, exclude=failed)
        except Unavailable as exc:
            generation.fail(exc)

    def mark_unhealthy(self, scheduler: ReplicaScheduler) -> None:
        if scheduler.healthy:
            log.warning("lm replica %s taken out of rotation", scheduler.replica.address)
        scheduler.healthy = False
        while scheduler.waiting:
            request = scheduler.waiting.popleft()
            if request.cancelled:
                request.out.put_nowait(None)
                continue
            try:
                self.submit(request, exclude=scheduler)
            except Unavailable as exc:
                request.fail(exc)

    def poke(self) -> None:
        for scheduler in self.schedulers.values():
            scheduler.poke()

    # -- health and discovery -----------------------------------------------------------------

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._watch(), name=f"router {self.model.name}")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            try:
                await self._discover()
                await asyncio.gather(*(self._check(s) for s in list(self.schedulers.values())))
            except Exception:  # the watch loop must survive anything a check throws
                log.exception("replica watch failed")

    async def _check(self, scheduler: ReplicaScheduler) -> None:
        stub = health_pb2_grpc.HealthStub(scheduler.replica.channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=self.config.health_timeout_s)
            ok = reply.status == health_pb2.HealthCheckResponse.SERVING
            scheduler.slow_checks = 0
        except grpc.aio.AioRpcError as exc:
            ok = False
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and scheduler.healthy and self._only_slow(scheduler):
                return
        if ok and not scheduler.healthy:
            # A replica back from a restart may run with other limits.
            try:
                info = await scheduler.replica.stub.Describe(
                    lm_pb2.DescribeModelRequest(), timeout=self.config.health_timeout_s
                )
            except grpc.aio.AioRpcError:
                return
            scheduler.replica.described(info)
            log.info("lm replica %s is healthy again", scheduler.replica.address)
            scheduler.healthy = True
        elif not ok and scheduler.healthy:
            self.mark_unhealthy(scheduler)

    def _only_slow(self, scheduler: ReplicaScheduler) -> bool:
        """A health check that timed out: whether the replica is only busy or slow, and stays in the rotation.

        A replica with work in flight answers late while it computes (the deadlines of its own calls catch one
        that is stuck); a lone replica stays whatever it does; an idle one leaves after SLOW_CHECKS in a row."""
        scheduler.slow_checks += 1
        if scheduler.has_work() or len(self.healthy()) == 1:
            if scheduler.slow_checks == 1:
                log.info(
                    "lm replica %s answers its health check late (busy, or the only replica), so it stays",
                    scheduler.replica.address,
                )
            return True
        return scheduler.slow_checks < SLOW_CHECKS

    async def _discover(self) -> None:
        """Add replicas that a DNS name now resolves to (after checking they serve the same model)."""
        for target in self.targets:
            for address in expand_target(target):
                if address in self.schedulers:
                    continue
                channel = service_channel(address, self.config.max_message_bytes, self.config.internal_token)
                stub = lm_pb2_grpc.LanguageModelStub(channel)
                try:
                    info = await stub.Describe(lm_pb2.DescribeModelRequest(), timeout=self.config.health_timeout_s)
                except grpc.aio.AioRpcError:
                    await channel.close()
                    continue
                if info.fingerprint != self.model.fingerprint:
                    log.error("lm at %s serves another model (%s); ignored", address, info.model)
                    await channel.close()
                    continue
                replica = LmReplica(address, stub, channel)
                replica.described(info)
                self.model.replicas.append(replica)
                self._add(replica)
                log.info("lm replica %s added to %s", address, self.model.name)


def config_targets(model: TextModel) -> list[str]:
    return list(model.targets) or [r.address for r in model.replicas]
