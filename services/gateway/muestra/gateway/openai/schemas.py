"""Request bodies of the OpenAI-compatible endpoints, as OpenAI documents them, plus muestra's extra fields.

Ranges follow OpenAI's API reference; unknown fields are refused (as OpenAI does) rather than ignored.
Limits that depend on the gateway's settings (n, stop strings, prompt size) are checked by the gateway.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

UINT64_MAX = 2**64 - 1
# Counts and token ids travel as uint32 to the services: larger ones are refused here, by field.
UINT32_MAX = 2**32 - 1
TokenId = Annotated[int, Field(ge=0, le=UINT32_MAX)]


def _lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in a string anywhere in `value` (JSON's "\\ud800" decodes to one), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"U+{ord(value[exc.start]):04X}"
        return None
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return None
    for item in items:
        found = _lone_surrogate(item)
        if found is not None:
            return found
    return None


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_lone_surrogates(cls, value: Any) -> Any:
        # Text must be Unicode that UTF-8 can carry to the services; a lone surrogate is not.
        found = _lone_surrogate(value)
        if found is not None:
            raise ValueError(f"contains the lone surrogate {found}, which is not a Unicode character")
        return value


class StreamOptions(_Body):
    include_usage: bool = False


class SamplerStep(_Body):
    """One step of an explicit sampler chain (muestra extension), as the gRPC API takes it."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class _TextBody(_Body):
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
    # muestra extensions (vLLM spells the shared ones the same way).
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repetition_penalty: float | None = None
    samplers: list[SamplerStep] | None = None
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False


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


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ResponseFormat(_Body):
    type: str
    json_schema: Any = None


class ChatCompletionRequest(_TextBody):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
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
