"""Request bodies of the OpenAI-compatible endpoints, as OpenAI documents them, plus muestra's extra fields.

Ranges follow OpenAI's API reference; unknown fields are refused (as OpenAI does) rather than ignored.
Limits that depend on the gateway's settings (n, stop strings, prompt size) are checked by the gateway.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

UINT64_MAX = 2**64 - 1
# Counts and token ids travel as uint32 to the services: larger ones are refused here, by field.
UINT32_MAX = 2**32 - 1
TokenId = Annotated[int, Field(ge=0, le=UINT32_MAX)]


# Numbers travel to the services as protobuf integers or doubles (sampler params): an integer of larger
# magnitude than any of them can hold is refused in every field, nested ones included.
INTEGER_LIMIT = UINT64_MAX


def _unfit(value: Any, where: str = "") -> str | None:
    """Why `value` (a field's JSON, at any depth) cannot reach the services, or None.

    A lone surrogate (JSON's "\\ud800" decodes to one) is not Unicode that UTF-8 can carry, and an
    integer beyond ±2^64 fits neither a protobuf integer nor, in a sampler's params, a double.
    `where` is the path inside the field, named in the message.
    """
    at = f" at {where}" if "[" in where or "." in where else ""  # the field itself is named by the caller
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"contains the lone surrogate U+{ord(value[exc.start]):04X}{at}, which is not a Unicode character"
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > INTEGER_LIMIT:
            digits = len(str(abs(value)))
            return f"holds an integer of {digits} digits{at}; integers must be within ±{INTEGER_LIMIT}"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _unfit(key, where) or _unfit(item, f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _unfit(item, f"{where}[{i}]")
            if found is not None:
                return found
    return None


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _fits_the_wire(cls, value: Any, info: ValidationInfo) -> Any:
        found = _unfit(value, info.field_name or "")
        if found is not None:
            raise ValueError(found)
        return value


class StreamOptions(_Body):
    include_usage: bool = False


class SamplerStep(_Body):
    """One step of an explicit sampler chain (muestra extension), as the gRPC API takes it."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class Speculation(_Body):
    """Speculative decoding for this request (muestra extension): a proposer's name ("ngram", or "off") and its
    params; the text for a seed is the same with or without it."""

    proposer: str
    params: dict[str, Any] = Field(default_factory=dict)


class JsonSchemaFormat(_Body):
    """response_format.json_schema: OpenAI's name, description, schema and strict (always enforced here)."""

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: str
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Body):
    """vLLM's structured_outputs: one of json (a JSON Schema), regex, choice, grammar, json_object."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class SamplingExtensions(_Body):
    """muestra's sampling fields beyond OpenAI's, on every text endpoint (vLLM spells the shared ones the same way)."""

    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repetition_penalty: float | None = None
    samplers: list[SamplerStep] | None = None
    ignore_eos: bool = False
    allow_special_tokens: bool = False
    speculation: Speculation | str | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False


class _TextBody(SamplingExtensions):
    """Fields that /v1/completions and /v1/chat/completions share."""

    model: str = ""
    n: int = Field(1, ge=1, le=UINT32_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=UINT64_MAX)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    max_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    user: str | None = None
    # Requests sharing it go to the lm replica that holds their cached KV (when no replica is known to hold more).
    prompt_cache_key: str | None = Field(None, max_length=256)
    # Output constraints (at most one of them): OpenAI's response_format, vLLM's guided_* and structured_outputs.
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputs | None = None


class CompletionRequest(_TextBody):
    """POST /v1/completions."""

    # Token-id prompts parse, so that the error can say they are not supported.
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: int | None = Field(16, ge=1, le=UINT32_MAX)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=UINT32_MAX)
    best_of: int | None = Field(None, ge=1, le=UINT32_MAX)
    suffix: str | None = None
    add_special_tokens: bool = True


class ContentPart(_Body):
    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None


class CalledFunction(_Body):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(_Body):
    """A call in an assistant message of the conversation so far."""

    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class ChosenFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: ChosenFunction


class ChatCompletionRequest(_TextBody):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # None: true, as in OpenAI
    functions: list[Any] | None = None
    function_call: Any = None
    modalities: list[str] | None = None
    # Accepted and ignored: they change nothing about the completion.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None


class ImageGenerationRequest(_Body):
    """POST /v1/images/generations."""

    prompt: str
    model: str = ""
    n: int = Field(1, ge=1, le=UINT32_MAX)
    size: str | None = None
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png"] | None = None
    quality: str | None = None
    style: str | None = None
    user: str | None = None
    # muestra extensions, named as diffusers and the gRPC ImageRequest name them.
    negative_prompt: str | None = None
    steps: int | None = Field(None, ge=1, le=UINT32_MAX)
    guidance_scale: float | None = None
    seed: int | None = Field(None, ge=0, le=UINT64_MAX)
    sampler: str | None = None
    # Streaming, as OpenAI's gpt-image-1 streams: partial images, then each image (server-sent events).
    stream: bool = False
    partial_images: int | None = Field(None, ge=0, le=3)
    # muestra extension: a preview every this many denoising steps (instead of partial_images).
    preview_every: int | None = Field(None, ge=0, le=UINT32_MAX)
