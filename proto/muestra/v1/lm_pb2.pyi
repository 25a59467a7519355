from muestra.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OutputKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_KIND_UNSPECIFIED: _ClassVar[OutputKind]
    LOGITS: _ClassVar[OutputKind]
    TOP_N: _ClassVar[OutputKind]
    ARGMAX: _ClassVar[OutputKind]
OUTPUT_KIND_UNSPECIFIED: OutputKind
LOGITS: OutputKind
TOP_N: OutputKind
ARGMAX: OutputKind

class DescribeModelRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KvLayout(_message.Message):
    __slots__ = ("num_layers", "num_kv_heads", "head_dim", "dtype", "storage")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: _common_pb2.DType
    storage: str
    def __init__(self, num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., dtype: _Optional[_Union[_common_pb2.DType, str]] = ..., storage: _Optional[str] = ...) -> None: ...

class ServiceLoad(_message.Message):
    __slots__ = ("batches", "rows", "kv_bytes", "kv_budget_bytes")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    batches: int
    rows: int
    kv_bytes: int
    kv_budget_bytes: int
    def __init__(self, batches: _Optional[int] = ..., rows: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., kv_budget_bytes: _Optional[int] = ...) -> None: ...

class DescribeModelResponse(_message.Message):
    __slots__ = ("model", "fingerprint", "context_length", "vocab_size", "eos_token_ids", "providers", "kv", "load", "max_batch_rows", "generation_config_json", "max_greedy_steps", "max_draft_tokens", "samplers", "row_invariant")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    MAX_GREEDY_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLERS_FIELD_NUMBER: _ClassVar[int]
    ROW_INVARIANT_FIELD_NUMBER: _ClassVar[int]
    model: str
    fingerprint: str
    context_length: int
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    providers: _containers.RepeatedScalarFieldContainer[str]
    kv: KvLayout
    load: ServiceLoad
    max_batch_rows: int
    generation_config_json: str
    max_greedy_steps: int
    max_draft_tokens: int
    samplers: _containers.RepeatedCompositeFieldContainer[SamplerSource]
    row_invariant: bool
    def __init__(self, model: _Optional[str] = ..., fingerprint: _Optional[str] = ..., context_length: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., providers: _Optional[_Iterable[str]] = ..., kv: _Optional[_Union[KvLayout, _Mapping]] = ..., load: _Optional[_Union[ServiceLoad, _Mapping]] = ..., max_batch_rows: _Optional[int] = ..., generation_config_json: _Optional[str] = ..., max_greedy_steps: _Optional[int] = ..., max_draft_tokens: _Optional[int] = ..., samplers: _Optional[_Iterable[_Union[SamplerSource, _Mapping]]] = ..., row_invariant: _Optional[bool] = ...) -> None: ...

class SamplerSource(_message.Message):
    __slots__ = ("name", "distribution", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    distribution: str
    version: str
    def __init__(self, name: _Optional[str] = ..., distribution: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class RowSampler(_message.Message):
    __slots__ = ("chain_json", "rng_json", "state_json", "prompt_ids", "output_ids")
    CHAIN_JSON_FIELD_NUMBER: _ClassVar[int]
    RNG_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    chain_json: str
    rng_json: str
    state_json: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    output_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, chain_json: _Optional[str] = ..., rng_json: _Optional[str] = ..., state_json: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., output_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class OutputSpec(_message.Message):
    __slots__ = ("kind", "top_n", "allowed_tokens")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    kind: OutputKind
    top_n: int
    allowed_tokens: bytes
    def __init__(self, kind: _Optional[_Union[OutputKind, str]] = ..., top_n: _Optional[int] = ..., allowed_tokens: _Optional[bytes] = ...) -> None: ...

class PrefixBlocks(_message.Message):
    __slots__ = ("block_size", "block_hashes", "cached_blocks", "write", "write_on_leave")
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    WRITE_ON_LEAVE_FIELD_NUMBER: _ClassVar[int]
    block_size: int
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    cached_blocks: int
    write: bool
    write_on_leave: bool
    def __init__(self, block_size: _Optional[int] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., cached_blocks: _Optional[int] = ..., write: _Optional[bool] = ..., write_on_leave: _Optional[bool] = ...) -> None: ...

class PrefillRow(_message.Message):
    __slots__ = ("request_id", "input_ids", "output", "prefix", "suppressed_token_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    SUPPRESSED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    input_ids: _containers.RepeatedScalarFieldContainer[int]
    output: OutputSpec
    prefix: PrefixBlocks
    suppressed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., input_ids: _Optional[_Iterable[int]] = ..., output: _Optional[_Union[OutputSpec, _Mapping]] = ..., prefix: _Optional[_Union[PrefixBlocks, _Mapping]] = ..., suppressed_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[PrefillRow]
    def __init__(self, rows: _Optional[_Iterable[_Union[PrefillRow, _Mapping]]] = ...) -> None: ...

class BatchOutput(_message.Message):
    __slots__ = ("logits", "rows")
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    logits: _common_pb2.Tensor
    rows: _containers.RepeatedCompositeFieldContainer[RowOutput]
    def __init__(self, logits: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., rows: _Optional[_Iterable[_Union[RowOutput, _Mapping]]] = ...) -> None: ...

class RowOutput(_message.Message):
    __slots__ = ("logits_row", "argmax", "top_ids", "top_logits", "logsumexp", "cached_tokens", "greedy_ids", "positions", "accepted_drafts", "cache_tier", "rng_json", "state_json", "sampler_error")
    LOGITS_ROW_FIELD_NUMBER: _ClassVar[int]
    ARGMAX_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGITS_FIELD_NUMBER: _ClassVar[int]
    LOGSUMEXP_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GREEDY_IDS_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    CACHE_TIER_FIELD_NUMBER: _ClassVar[int]
    RNG_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_ERROR_FIELD_NUMBER: _ClassVar[int]
    logits_row: int
    argmax: int
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logits: _containers.RepeatedScalarFieldContainer[float]
    logsumexp: float
    cached_tokens: int
    greedy_ids: _containers.RepeatedScalarFieldContainer[int]
    positions: int
    accepted_drafts: int
    cache_tier: str
    rng_json: str
    state_json: str
    sampler_error: str
    def __init__(self, logits_row: _Optional[int] = ..., argmax: _Optional[int] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logits: _Optional[_Iterable[float]] = ..., logsumexp: _Optional[float] = ..., cached_tokens: _Optional[int] = ..., greedy_ids: _Optional[_Iterable[int]] = ..., positions: _Optional[int] = ..., accepted_drafts: _Optional[int] = ..., cache_tier: _Optional[str] = ..., rng_json: _Optional[str] = ..., state_json: _Optional[str] = ..., sampler_error: _Optional[str] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("forward_us", "total_us")
    FORWARD_US_FIELD_NUMBER: _ClassVar[int]
    TOTAL_US_FIELD_NUMBER: _ClassVar[int]
    forward_us: int
    total_us: int
    def __init__(self, forward_us: _Optional[int] = ..., total_us: _Optional[int] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("batch_id", "output", "timing")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    output: BatchOutput
    timing: Timing
    def __init__(self, batch_id: _Optional[str] = ..., output: _Optional[_Union[BatchOutput, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class DecodeBatch(_message.Message):
    __slots__ = ("batch_id", "next_ids", "outputs", "draft_lengths", "draft_ids", "rollback", "samplers")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_IDS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    SAMPLERS_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    next_ids: _containers.RepeatedScalarFieldContainer[int]
    outputs: _containers.RepeatedCompositeFieldContainer[OutputSpec]
    draft_lengths: _containers.RepeatedScalarFieldContainer[int]
    draft_ids: _containers.RepeatedScalarFieldContainer[int]
    rollback: _containers.RepeatedScalarFieldContainer[int]
    samplers: _containers.RepeatedCompositeFieldContainer[RowSampler]
    def __init__(self, batch_id: _Optional[str] = ..., next_ids: _Optional[_Iterable[int]] = ..., outputs: _Optional[_Iterable[_Union[OutputSpec, _Mapping]]] = ..., draft_lengths: _Optional[_Iterable[int]] = ..., draft_ids: _Optional[_Iterable[int]] = ..., rollback: _Optional[_Iterable[int]] = ..., samplers: _Optional[_Iterable[_Union[RowSampler, _Mapping]]] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("batches", "tokens_per_row", "greedy_steps", "stop_token_ids", "row_invariant")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_ROW_FIELD_NUMBER: _ClassVar[int]
    GREEDY_STEPS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ROW_INVARIANT_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[DecodeBatch]
    tokens_per_row: int
    greedy_steps: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    row_invariant: bool
    def __init__(self, batches: _Optional[_Iterable[_Union[DecodeBatch, _Mapping]]] = ..., tokens_per_row: _Optional[int] = ..., greedy_steps: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., row_invariant: _Optional[bool] = ...) -> None: ...

class DecodeResponse(_message.Message):
    __slots__ = ("batch_id", "output", "timing")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    output: BatchOutput
    timing: Timing
    def __init__(self, batch_id: _Optional[str] = ..., output: _Optional[_Union[BatchOutput, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class FilterRequest(_message.Message):
    __slots__ = ("batch_id", "rows")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    rows: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, batch_id: _Optional[str] = ..., rows: _Optional[_Iterable[int]] = ...) -> None: ...

class FilterResponse(_message.Message):
    __slots__ = ("batch_id", "num_rows")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    num_rows: int
    def __init__(self, batch_id: _Optional[str] = ..., num_rows: _Optional[int] = ...) -> None: ...

class ClearRequest(_message.Message):
    __slots__ = ("batch_ids",)
    BATCH_IDS_FIELD_NUMBER: _ClassVar[int]
    batch_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, batch_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ClearResponse(_message.Message):
    __slots__ = ("load",)
    LOAD_FIELD_NUMBER: _ClassVar[int]
    load: ServiceLoad
    def __init__(self, load: _Optional[_Union[ServiceLoad, _Mapping]] = ...) -> None: ...

class BatchStepRequest(_message.Message):
    __slots__ = ("decode", "filter", "clear")
    DECODE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    decode: DecodeRequest
    filter: FilterRequest
    clear: ClearRequest
    def __init__(self, decode: _Optional[_Union[DecodeRequest, _Mapping]] = ..., filter: _Optional[_Union[FilterRequest, _Mapping]] = ..., clear: _Optional[_Union[ClearRequest, _Mapping]] = ...) -> None: ...

class BatchStepResponse(_message.Message):
    __slots__ = ("decode", "filter", "clear")
    DECODE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    decode: DecodeResponse
    filter: FilterResponse
    clear: ClearResponse
    def __init__(self, decode: _Optional[_Union[DecodeResponse, _Mapping]] = ..., filter: _Optional[_Union[FilterResponse, _Mapping]] = ..., clear: _Optional[_Union[ClearResponse, _Mapping]] = ...) -> None: ...
