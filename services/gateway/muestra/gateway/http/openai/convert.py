"""OpenAI request bodies as the engine's requests (TextRequest) and the diffusion service's (ImageRequest).

Each converter also returns `renames`: gateway field name -> the body parameter it came from, so that an
error the gateway raises (say on `samplers[1].params.top_p`) names what the client sent (`top_p`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace

from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

from muestra.gateway.engine.requests import Message, Step, TextRequest
from muestra.gateway.http.errors import bad_request
from muestra.gateway.http.openai.schemas import ChatCompletionRequest, CompletionRequest, ImageGenerationRequest
from muestra.gateway.http.openai.tools import template_tool_calls, tool_inputs
from muestra.v1 import diffusion_pb2

# OpenAI's and the extensions' sampling fields, in transformers' processor order; the first four are
# kept in front of greedy when temperature is 0.
_PROCESSORS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
)
_BEFORE_GREEDY = set(_PROCESSORS[:4])
# Values that change nothing; a client that sends every default still gets plain sampling.
# top_k -1 and 0 mean "off" in vLLM.
_NEUTRAL = {
    "repetition_penalty": (1,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "temperature": (1,),
    "top_k": (0, -1),
    "top_p": (1,),
    "min_p": (0,),
    "typical_p": (1,),
}
_SIZE = re.compile(r"^([1-9][0-9]{0,5})x([1-9][0-9]{0,5})$")


def sampler_chain(body) -> tuple[list[dict], dict[str, str]]:
    """The chain for a body: its explicit `samplers`, else one built from temperature/top_p/... (0: greedy).

    No sampling field at all gives an empty chain: the model's generation_config.json decides (as in vLLM).
    """
    if body.samplers:
        return [{"name": s.name, "params": s.params} for s in body.samplers], {}
    given = {name: getattr(body, name) for name in _PROCESSORS if getattr(body, name) is not None}
    if not given:
        return [], {}
    greedy = given.get("temperature") == 0
    steps = [
        name
        for name in _PROCESSORS
        if name in given and given[name] not in _NEUTRAL[name] and (not greedy or name in _BEFORE_GREEDY)
    ]
    chain = [{"name": name, "params": {name: given[name]}} for name in steps]
    chain.append({"name": "greedy" if greedy else "sample", "params": {}})
    return chain, {f"samplers[{i}]": name for i, name in enumerate(steps)}


def _routing_hint(body) -> str:
    """OpenAI's prompt_cache_key, else the end user's id (any length: a long one goes by its digest)."""
    if body.prompt_cache_key or not body.user:
        return body.prompt_cache_key or ""
    return body.user if len(body.user) <= 64 else hashlib.blake2b(body.user.encode(), digest_size=16).hexdigest()


def _base_request(body, max_tokens: int, logprobs: bool, top_logprobs: int) -> TextRequest:
    chain, _ = sampler_chain(body)
    speculation = None
    if body.speculation is not None:
        asked = body.speculation
        speculation = Step(asked) if isinstance(asked, str) else Step(asked.proposer, dict(asked.params or {}))
    return TextRequest(
        model=body.model,
        max_tokens=max_tokens,
        samplers=tuple(Step(spec["name"], dict(spec["params"])) for spec in chain),
        n=body.n,
        seed=body.seed,
        stop=(body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ()),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        ignore_eos=body.ignore_eos,
        allow_special_tokens=body.allow_special_tokens,
        include_stop_str_in_output=body.include_stop_str_in_output,
        speculation=speculation,
        prompt_cache_key=_routing_hint(body),
    )


def _choice_grammar(choices: list[str]) -> str:
    """vLLM's guided_choice as a Lark alternation (a JSON string is a Lark string literal)."""
    return "start: " + " | ".join(json.dumps(choice) for choice in choices)


def _lark(field: str, grammar: str) -> str:
    """vLLM's grammar fields as Lark: a Lark grammar (it has a `start:` rule) as it is, GBNF converted, as vLLM's
    guidance backend does (llguidance's any_to_lark)."""
    try:
        return any_to_lark(grammar)
    except GbnfToLarkError as exc:
        raise bad_request(field, f"is neither a Lark grammar (no `start:` rule) nor GBNF: {exc}") from None


def _json_schema_text(schema) -> str:
    """The schema as JSON text, which keeps the order of its properties (the generated JSON follows it)."""
    return schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)


def _given_constraints(body) -> list[tuple[str, str, dict, dict[str, str]]]:
    """Every output constraint the body asks for: (field, constraint kind, params, renames of its fields)."""
    given = []
    fmt = body.response_format
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object":
            given.append(("response_format", "json_object", {}, {}))
        elif fmt.type == "json_schema":
            if fmt.json_schema is None or fmt.json_schema.schema_ is None:
                raise bad_request("response_format.json_schema.schema", "is required with type 'json_schema'")
            schema = {"schema": _json_schema_text(fmt.json_schema.schema_), "strict": bool(fmt.json_schema.strict)}
            given.append(("response_format", "json_schema", schema, {"params.schema": "json_schema.schema"}))
        else:
            raise bad_request(
                "response_format.type", f"{fmt.type!r} is not supported; use text, json_object or json_schema"
            )
    if body.guided_json is not None:
        given.append(("guided_json", "json_schema", {"schema": _json_schema_text(body.guided_json)}, {}))
    if body.guided_regex is not None:
        given.append(("guided_regex", "regex", {"pattern": body.guided_regex}, {}))
    if body.guided_choice is not None:
        given.append(("guided_choice", "grammar", {"lark": _checked_choices("guided_choice", body.guided_choice)}, {}))
    if body.guided_grammar is not None:
        given.append(("guided_grammar", "grammar", {"lark": _lark("guided_grammar", body.guided_grammar)}, {}))
    outputs = body.structured_outputs
    if outputs is not None:
        if outputs.json_ is not None:
            given.append(("structured_outputs.json", "json_schema", {"schema": _json_schema_text(outputs.json_)}, {}))
        if outputs.regex is not None:
            given.append(("structured_outputs.regex", "regex", {"pattern": outputs.regex}, {}))
        if outputs.choice is not None:
            lark = _checked_choices("structured_outputs.choice", outputs.choice)
            given.append(("structured_outputs.choice", "grammar", {"lark": lark}, {}))
        if outputs.grammar is not None:
            lark = _lark("structured_outputs.grammar", outputs.grammar)
            given.append(("structured_outputs.grammar", "grammar", {"lark": lark}, {}))
        if outputs.json_object:
            given.append(("structured_outputs.json_object", "json_object", {}, {}))
    return given


def _checked_choices(field: str, choices: list[str]) -> str:
    if not choices:
        raise bad_request(field, "must hold at least one choice")
    for i, choice in enumerate(choices):
        if not choice:
            raise bad_request(f"{field}[{i}]", "is empty; every choice needs at least one character")
    return _choice_grammar(choices)


def _constraint(body, tool_grammar: str | None = None) -> tuple[Step | None, dict[str, str]]:
    """The body's one output constraint (or the tools' grammar), and the renames of its fields.

    More than one is a 400 naming them all."""
    given = _given_constraints(body)
    if tool_grammar is not None:
        if given:
            raise bad_request(
                given[0][0],
                "cannot be combined with tools unless tool_choice is 'none' (the tools constrain the answer)",
            )
        given = [("tools", "grammar", {"lark": tool_grammar}, {})]
    if not given:
        return None, {}
    if len(given) > 1:
        fields = ", ".join(field for field, *_ in given)
        raise bad_request(given[1][0], f"give one output constraint, not several ({fields})")
    field, name, params, inner = given[0]
    renames = {"constraint": field, "constraint.params": field}
    renames.update({f"constraint.{key}": f"{field}.{value}" for key, value in inner.items()})
    return Step(name, params), renames


def _check_stream_options(body) -> None:
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options", "is only allowed when stream is true")


def completion_requests(body: CompletionRequest, max_prompts: int) -> tuple[list[TextRequest], dict[str, str]]:
    """One TextRequest per prompt (a list prompt gives several), and the renames."""
    _check_stream_options(body)
    if body.suffix:
        raise bad_request("suffix", "is not supported", "unsupported_parameter")
    if body.best_of is not None and body.best_of != body.n:
        raise bad_request("best_of", "is not supported (only best_of equal to n)", "unsupported_parameter")
    if body.echo and body.logprobs is not None:
        raise bad_request("echo", "with logprobs is not supported (prompt logprobs are not computed)")
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if not prompts:
        raise bad_request("prompt", "is empty")
    if not all(isinstance(p, str) for p in prompts):
        raise bad_request("prompt", "token-id prompts are not supported; send text", "unsupported_parameter")
    if len(prompts) > max_prompts:
        raise bad_request("prompt", f"holds {len(prompts)} prompts; the limit is {max_prompts}")
    logprobs = body.logprobs is not None
    base = _base_request(body, body.max_tokens or 0, logprobs, body.logprobs or 0)
    constraint, constraint_renames = _constraint(body)
    requests = [
        replace(base, prompt=prompt, add_special_tokens=body.add_special_tokens, constraint=constraint)
        for prompt in prompts
    ]
    _, renames = sampler_chain(body)
    return requests, {**renames, **constraint_renames, "top_logprobs": "logprobs"}


def _message_text(index: int, content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for k, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise bad_request(
                f"messages[{index}].content[{k}]", f"{part.type!r} parts are not supported; only text parts are"
            )
        texts.append(part.text)
    return "\n".join(texts)


def chat_request(body: ChatCompletionRequest) -> tuple[TextRequest, dict[str, str]]:
    _check_stream_options(body)
    if body.functions or body.function_call not in (None, "none", "auto"):
        name = "functions" if body.functions else "function_call"
        raise bad_request(name, "the deprecated functions are not supported; use tools", "unsupported_parameter")
    tools_json, tool_grammar = tool_inputs(body)
    if body.modalities is not None and body.modalities != ["text"]:
        raise bad_request("modalities", "only ['text'] is supported", "unsupported_parameter")
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs", "needs logprobs to be true")
    max_tokens = body.max_completion_tokens or body.max_tokens or 0
    messages = tuple(
        Message(
            role=m.role,
            content=_message_text(i, m.content),
            name=m.name or "",
            tool_calls_json=template_tool_calls(m),
            tool_call_id=m.tool_call_id or "",
        )
        for i, m in enumerate(body.messages)
    )
    constraint, constraint_renames = _constraint(body, tool_grammar)
    request = replace(
        _base_request(body, max_tokens, body.logprobs, body.top_logprobs or 0),
        messages=messages, tools_json=tools_json, constraint=constraint,
    )  # fmt: skip
    _, renames = sampler_chain(body)
    renames.update(constraint_renames)
    renames["tools_json"] = "tools"
    if body.max_completion_tokens:
        renames["max_tokens"] = "max_completion_tokens"
    return request, renames


def image_request(body: ImageGenerationRequest) -> tuple[diffusion_pb2.ImageRequest, dict[str, str]]:
    if body.response_format == "url":
        raise bad_request("response_format", "'url' is not supported; use 'b64_json'", "unsupported_parameter")
    width = height = 0
    if body.size not in (None, "auto"):
        match = _SIZE.match(body.size)
        if match is None:
            raise bad_request("size", f"must be 'WIDTHxHEIGHT' in pixels (e.g. '512x512') or 'auto', got {body.size!r}")
        width, height = int(match.group(1)), int(match.group(2))
    request = diffusion_pb2.ImageRequest(
        model=body.model,
        prompt=body.prompt,
        negative_prompt=body.negative_prompt or "",
        width=width,
        height=height,
        steps=body.steps or 0,
        sampler=body.sampler or "",
        num_images=body.n,
    )
    if body.guidance_scale is not None:
        request.guidance_scale = body.guidance_scale
    if body.seed is not None:
        request.seed = body.seed
    for name in ("partial_images", "preview_every"):
        if getattr(body, name) is not None and not body.stream:
            raise bad_request(name, "needs stream to be true")
    if body.partial_images is not None and body.preview_every is not None:
        raise bad_request("partial_images", "cannot be given with preview_every; give one of them")
    if body.preview_every is not None:
        request.preview_every = body.preview_every
    elif body.partial_images:
        request.preview_every = 1  # the gateway forwards only the evenly spaced ones
    return request, {"num_images": "n", "width": "size", "height": "size"}
