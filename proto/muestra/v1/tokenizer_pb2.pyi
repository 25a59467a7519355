from muestra.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenizerChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class DescribeTokenizerRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class DescribeTokenizerResponse(_message.Message):
    __slots__ = ("model", "models", "vocab_size", "bos_token_id", "eos_token_ids", "pad_token_id", "model_max_length", "has_chat_template", "backend", "max_text_bytes", "special_token_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PAD_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    HAS_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MAX_TEXT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    models: _containers.RepeatedScalarFieldContainer[str]
    vocab_size: int
    bos_token_id: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    pad_token_id: int
    model_max_length: int
    has_chat_template: bool
    backend: str
    max_text_bytes: int
    special_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., vocab_size: _Optional[int] = ..., bos_token_id: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., pad_token_id: _Optional[int] = ..., model_max_length: _Optional[int] = ..., has_chat_template: _Optional[bool] = ..., backend: _Optional[str] = ..., max_text_bytes: _Optional[int] = ..., special_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EncodeRequest(_message.Message):
    __slots__ = ("model", "texts", "add_special_tokens", "return_offsets")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETURN_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    model: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    add_special_tokens: bool
    return_offsets: bool
    def __init__(self, model: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., add_special_tokens: _Optional[bool] = ..., return_offsets: _Optional[bool] = ...) -> None: ...

class Encoding(_message.Message):
    __slots__ = ("ids", "tokens", "offset_starts", "offset_ends")
    IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_STARTS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_ENDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[str]
    offset_starts: _containers.RepeatedScalarFieldContainer[int]
    offset_ends: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Iterable[str]] = ..., offset_starts: _Optional[_Iterable[int]] = ..., offset_ends: _Optional[_Iterable[int]] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("encodings",)
    ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    encodings: _containers.RepeatedCompositeFieldContainer[Encoding]
    def __init__(self, encodings: _Optional[_Iterable[_Union[Encoding, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DecodeTokensRequest(_message.Message):
    __slots__ = ("model", "sequences", "skip_special_tokens", "raw_bytes")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_FIELD_NUMBER: _ClassVar[int]
    model: str
    sequences: _containers.RepeatedCompositeFieldContainer[TokenIds]
    skip_special_tokens: bool
    raw_bytes: bool
    def __init__(self, model: _Optional[str] = ..., sequences: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ..., skip_special_tokens: _Optional[bool] = ..., raw_bytes: _Optional[bool] = ...) -> None: ...

class DecodeTokensResponse(_message.Message):
    __slots__ = ("texts", "raw")
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    raw: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, texts: _Optional[_Iterable[str]] = ..., raw: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ApplyChatTemplateRequest(_message.Message):
    __slots__ = ("model", "messages", "add_generation_prompt", "tokenize", "tools_json")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZE_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    add_generation_prompt: bool
    tokenize: bool
    tools_json: str
    def __init__(self, model: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., add_generation_prompt: _Optional[bool] = ..., tokenize: _Optional[bool] = ..., tools_json: _Optional[str] = ...) -> None: ...

class ApplyChatTemplateResponse(_message.Message):
    __slots__ = ("text", "ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, text: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeStream(_message.Message):
    __slots__ = ("ids", "read_offset", "final", "request_id", "skip_special_tokens")
    IDS_FIELD_NUMBER: _ClassVar[int]
    READ_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    read_offset: int
    final: bool
    request_id: str
    skip_special_tokens: bool
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., read_offset: _Optional[int] = ..., final: _Optional[bool] = ..., request_id: _Optional[str] = ..., skip_special_tokens: _Optional[bool] = ...) -> None: ...

class DetokenizeStepRequest(_message.Message):
    __slots__ = ("model", "streams", "skip_special_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    streams: _containers.RepeatedCompositeFieldContainer[DetokenizeStream]
    skip_special_tokens: bool
    def __init__(self, model: _Optional[str] = ..., streams: _Optional[_Iterable[_Union[DetokenizeStream, _Mapping]]] = ..., skip_special_tokens: _Optional[bool] = ...) -> None: ...

class DetokenizeDelta(_message.Message):
    __slots__ = ("text", "prefix_advance", "read_advance")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_ADVANCE_FIELD_NUMBER: _ClassVar[int]
    READ_ADVANCE_FIELD_NUMBER: _ClassVar[int]
    text: str
    prefix_advance: int
    read_advance: int
    def __init__(self, text: _Optional[str] = ..., prefix_advance: _Optional[int] = ..., read_advance: _Optional[int] = ...) -> None: ...

class DetokenizeStepResponse(_message.Message):
    __slots__ = ("deltas",)
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    deltas: _containers.RepeatedCompositeFieldContainer[DetokenizeDelta]
    def __init__(self, deltas: _Optional[_Iterable[_Union[DetokenizeDelta, _Mapping]]] = ...) -> None: ...
