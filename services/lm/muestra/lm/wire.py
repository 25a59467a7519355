"""The lm's wire: a request's fields into the engine's inputs (checked against its limits), its results into replies."""

from __future__ import annotations

import time

import numpy as np

from muestra.lm.engine_io import DecodeInput, Load, PrefillInput, StepResult
from muestra.lm.limits import Limits
from muestra.lm.sampling import LmSamplers, SampledRow
from muestra.runtime.errors import InvalidArgument, check_limit
from muestra.runtime.logs import valid_request_id
from muestra.runtime.step_streams import LEASE_HEADER
from muestra.v1 import lm_pb2


def lease_of(context) -> str:
    """The caller's lease (metadata x-muestra-lease), or '' for calls made without one."""
    for key, value in (context.invocation_metadata() or ()) if context is not None else ():
        if key == LEASE_HEADER:
            if not valid_request_id(value):
                raise InvalidArgument(LEASE_HEADER, "must be 1-64 characters of [A-Za-z0-9._:/+=-]")
            return value
    return ""


def _ids(values) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=len(values))


def prefill_rows(request: lm_pb2.PrefillRequest, limits: Limits) -> list[PrefillInput]:
    """A Prefill's rows, with their outputs, allowed-token masks and suppressed ids checked."""
    check_limit("rows", len(request.rows), 1, limits.max_batch_rows)
    return [
        PrefillInput(
            request_id=row.request_id,
            input_ids=_ids(row.input_ids),
            output=limits.check_output(f"rows[{i}].output", row.output.kind, row.output.top_n),
            allowed=limits.check_allowed(f"rows[{i}].output.allowed_tokens", row.output.allowed_tokens),
            suppressed=limits.check_suppressed(f"rows[{i}].suppressed_token_ids", row.suppressed_token_ids),
        )
        for i, row in enumerate(request.rows)
    ]


def decode_batches(request: lm_pb2.DecodeRequest, limits: Limits, samplers: LmSamplers | None) -> list[DecodeInput]:
    """A Decode's batches, with their outputs, masks, drafts and sampler chains checked (parsed here, on the loop)."""
    check_limit("batches", len(request.batches), 1, limits.max_batch_rows)
    items = []
    for i, batch in enumerate(request.batches):
        specs = [
            limits.check_output(f"batches[{i}].outputs[{j}]", spec.kind, spec.top_n)
            for j, spec in enumerate(batch.outputs)
        ]
        allowed = [
            limits.check_allowed(f"batches[{i}].outputs[{j}].allowed_tokens", spec.allowed_tokens)
            for j, spec in enumerate(batch.outputs)
        ]
        items.append(
            DecodeInput(
                batch.batch_id,
                _ids(batch.next_ids),
                specs or None,
                allowed or None,
                _drafts(i, batch),
                _ids(batch.rollback) if batch.rollback else None,
                _samplers(samplers, i, batch),
            )
        )
    return items


def _drafts(i: int, batch: lm_pb2.DecodeBatch) -> list[np.ndarray] | None:
    """A DecodeBatch's draft ids split per row by its draft_lengths, or None when it has none."""
    if not batch.draft_lengths and not batch.draft_ids:
        return None
    total = sum(batch.draft_lengths)
    if total != len(batch.draft_ids):
        raise InvalidArgument(
            f"batches[{i}].draft_ids", f"got {len(batch.draft_ids)} ids; draft_lengths add up to {total}"
        )
    ids = _ids(batch.draft_ids)
    ends = np.cumsum(np.fromiter(batch.draft_lengths, dtype=np.int64, count=len(batch.draft_lengths)))
    return np.split(ids, ends[:-1]) if len(ends) else []


def _samplers(samplers: LmSamplers | None, i: int, batch: lm_pb2.DecodeBatch) -> list[SampledRow | None] | None:
    """The batch's sampled rows (DecodeBatch.samplers), parsed and checked."""
    if not batch.samplers:
        return None
    if samplers is None:
        raise InvalidArgument(f"batches[{i}].samplers", "this lm runs no samplers (it was started with none)")
    return [
        samplers.row(f"batches[{i}].samplers[{j}]", row) if row.chain_json else None
        for j, row in enumerate(batch.samplers)
    ]


def batch_ids(request: lm_pb2.BatchStepRequest) -> list[str]:
    """The batches a BatchSteps message names (for its log lines)."""
    kind = request.WhichOneof("step")
    if kind == "decode":
        return [b.batch_id for b in request.decode.batches]
    if kind == "filter":
        return [request.filter.batch_id]
    if kind == "clear":
        return list(request.clear.batch_ids)
    return []


def sampled_states(result: StepResult, output: lm_pb2.BatchOutput) -> None:
    """Each sampled row's generator and sampler state after its picks, or why its chain failed."""
    errors = result.sampler_errors or [None] * len(output.rows)
    for row, error, out in zip(result.sampled, errors, output.rows, strict=True):
        if row is None:
            continue
        if error:
            out.sampler_error = error
            del out.greedy_ids[-1]  # the step where it failed picked nothing for it
            continue
        try:
            out.rng_json, out.state_json = row.state()
        except (TypeError, ValueError) as exc:  # a plugin kept state that JSON cannot carry
            out.sampler_error = f"sampler chain failed: its state cannot go back to the gateway as JSON ({exc})"


def service_load(load: Load) -> lm_pb2.ServiceLoad:
    return lm_pb2.ServiceLoad(
        batches=load.batches, rows=load.rows, kv_bytes=load.kv_bytes, kv_budget_bytes=load.kv_budget_bytes
    )


def step_timing(result: StepResult, started: float) -> lm_pb2.Timing:
    return lm_pb2.Timing(forward_us=result.forward_us, total_us=int((time.perf_counter() - started) * 1e6))
