"""The body of POST /v1/responses, as OpenAI documents it, plus muestra's sampling extensions.

Input items, tools and text.format stay loose here (dicts): response_items.py reads them and names the exact
field (`input[2].type`, `tools[0].type`) of anything it cannot serve, rather than pydantic's union errors.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from muestra.gateway.http.openai.schemas import UINT32_MAX, UINT64_MAX, SamplingExtensions, _Body


class TextOptions(_Body):
    """text: the output's format ({"type": "text" | "json_object" | "json_schema", ...}) and verbosity."""

    format: dict[str, Any] | None = None
    verbosity: str | None = None


class StreamOptions(_Body):
    include_obfuscation: bool | None = None  # accepted: muestra pads nothing


class ResponsesRequest(SamplingExtensions):
    """POST /v1/responses."""

    model: str = ""
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = Field(None, max_length=128)
    max_output_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = Field(None, max_length=256)
    truncation: Literal["disabled", "auto"] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # Fields muestra refuses by name unless they ask for nothing (response_items.refuse_unserved).
    reasoning: dict[str, Any] | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    max_tool_calls: int | None = Field(None, ge=1, le=UINT32_MAX)
    service_tier: str | None = None  # accepted and ignored, as on chat completions
    # Extensions, as on chat completions (and SamplingExtensions').
    seed: int | None = Field(None, ge=0, le=UINT64_MAX)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None


class InputItemsQuery(_Body):
    """GET /v1/responses/{id}/input_items's query."""

    limit: int = Field(20, ge=1, le=100)
    order: Literal["asc", "desc"] = "desc"
    after: str | None = None
    before: str | None = None
    include: list[str] | None = None
