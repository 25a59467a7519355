"""`muestra chat`: an interactive conversation with a text model through its chat template.

Each answer streams as it is generated. Ctrl-C stops the current answer (the request is cancelled;
the chat goes on, and the part already shown stays in the history); Ctrl-D or /exit ends the chat.
A line that starts with one / is a command: an unknown one is refused with the list, never sent to the
model; `//text` sends `/text`.

Before each turn the history is fitted into the model's context: while the prompt (counted by the
gateway's Tokenize on the chat-templated messages) plus --max-tokens exceeds the context length the
gateway reports, the oldest exchange is dropped; the system message never is.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from muestra.cli.arguments import integer, stderr_is_terminal
from muestra.cli.endpoints import api_key, gateway_address
from muestra.cli.errors import CliError
from muestra.cli.generate import add_sampling_arguments, sampling_kwargs
from muestra.client import Client, MuestraError

EXIT_COMMANDS = ("/exit", "/quit")
COMMANDS = ("/reset", "/help", *EXIT_COMMANDS)
COMMANDS_HELP = (
    "/reset starts over (keeping --system), /exit or Ctrl-D ends, Ctrl-C stops an answer, "
    "// sends a message that starts with /"
)


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "chat",
        help="chat with a text model (/reset starts over; Ctrl-C stops an answer, Ctrl-D or /exit ends)",
        description=f"Chat with a text model. At the prompt: {COMMANDS_HELP}, /help shows this. "
        "The oldest exchanges are dropped when the history and --max-tokens no longer fit the model's context.",
    )
    parser.add_argument("--system", default="", help="system message that opens the conversation (never dropped)")
    parser.add_argument("--max-tokens", type=integer(1), default=256, help="most tokens per answer (default 256)")
    add_sampling_arguments(parser)
    parser.set_defaults(run=run)


def _text_model(client: Client, name: str) -> tuple[str, int]:
    """The model the chat talks to and its context length (asking also checks that the gateway is reachable)."""
    text_models = {m.name: m.context_length for m in client.list_models() if m.kind == "text"}
    if not text_models:
        raise CliError(f"the gateway at {client.address} serves no text model")
    if name and name not in text_models:
        raise CliError(f"--model: unknown text model {name!r}; known: {', '.join(text_models)}")
    name = name or next(iter(text_models))
    return name, text_models[name]


@dataclasses.dataclass
class Fit:
    """The messages to send (None: even the system message and the newest one do not fit), and what it took."""

    messages: list[dict] | None
    dropped: int
    prompt_tokens: int
    context_length: int


def fit_history(messages: list[dict], max_tokens: int, count: Callable[[list[dict]], tuple[int, int]]) -> Fit:
    """Drop the oldest exchanges (never the system message) until the prompt plus max_tokens fits the context.

    count(messages) gives the prompt's tokens and the context length. The history is cut at a user
    message, so that what is left still starts the way a conversation does.
    """
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(system) :]
    first = 0
    while True:
        prompt_tokens, context_length = count(system + turns[first:])
        if prompt_tokens + max_tokens <= context_length:
            return Fit(system + turns[first:], first, prompt_tokens, context_length)
        if first >= len(turns) - 1:
            return Fit(None, first, prompt_tokens, context_length)
        first += 1
        while first < len(turns) - 1 and turns[first]["role"] != "user":
            first += 1


def _note(text: str) -> None:
    """A dim line on standard error (plain when it is not a terminal)."""
    print(f"\x1b[2m{text}\x1b[0m" if stderr_is_terminal() else text, file=sys.stderr, flush=True)


def _answer(client: Client, messages: list[dict], kwargs: dict) -> str:
    """Stream one answer to stdout; the text shown (all of it, or up to Ctrl-C)."""
    generation, text = None, ""
    try:
        generation = client.generate(messages=messages, **kwargs)
        for delta in generation:
            text += delta.text
            sys.stdout.write(delta.text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        if generation is not None:
            generation.cancel()
        sys.stdout.write(" [stopped]")
    sys.stdout.write("\n")
    sys.stdout.flush()
    done = generation.completions.get(0) if generation is not None else None
    if done is not None and done.error:
        print(f"muestra chat: {done.error}", file=sys.stderr)
    return text


def run(args) -> int:
    args.gateway = gateway_address(args.gateway)
    kwargs = sampling_kwargs(args)
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    with Client(args.gateway, api_key=api_key(args.api_key)) as client:
        kwargs["model"], context_length = _text_model(client, args.model)
        if context_length and args.max_tokens >= context_length:
            raise CliError(f"--max-tokens {args.max_tokens} leaves no room in {kwargs['model']}'s context of "
                           f"{context_length} tokens; give fewer", 2)  # fmt: skip

        def count(candidate: list[dict]) -> tuple[int, int]:
            reply = client.tokenize(messages=candidate, model=kwargs["model"])
            return len(reply.ids), reply.context_length

        print(f"muestra chat with {kwargs['model']} (context {context_length} tokens): {COMMANDS_HELP}",
              file=sys.stderr)  # fmt: skip
        system = [{"role": "system", "content": args.system}] if args.system else []
        messages = list(system)
        while True:
            try:
                line = input("> ")
            except EOFError:
                print()
                return 0
            except KeyboardInterrupt:  # at the prompt: a fresh line, as a shell does
                print()
                continue
            command = line.strip()
            if command in EXIT_COMMANDS:
                return 0
            if command == "/help":
                _note(COMMANDS_HELP)
                continue
            if command == "/reset":
                messages = list(system)
                _note("(the conversation starts over" + (", with the system message)" if system else ")"))
                continue
            if not command:
                continue
            if command.startswith("//"):
                line = command[1:]
            elif command.startswith("/"):
                first = command.split()[0]
                why = f"{first} takes nothing after it" if first in COMMANDS else f"unknown command {first}"
                print(
                    f"muestra chat: {why}; the commands are {', '.join(COMMANDS)} (// sends a message that starts "
                    "with /)",
                    file=sys.stderr,
                )
                continue
            try:
                try:
                    fit = fit_history([*messages, {"role": "user", "content": line}], args.max_tokens, count)
                except KeyboardInterrupt:  # before the answer began: stopped as an answer is, with nothing shown
                    print(" [stopped]", flush=True)
                    messages += [{"role": "user", "content": line}, {"role": "assistant", "content": ""}]
                    continue
                if fit.messages is None:
                    what = "this message and the system message take" if system else "this message takes"
                    print(
                        f"muestra chat: {what} {fit.prompt_tokens} tokens; with --max-tokens {args.max_tokens} "
                        "that exceeds the context "
                        f"of {fit.context_length}: send a shorter message",
                        file=sys.stderr,
                    )
                    continue
                if fit.dropped:
                    plural = "s" if fit.dropped != 1 else ""
                    _note(f"(dropped the oldest {fit.dropped} message{plural} to fit the context of "
                          f"{fit.context_length} tokens)")  # fmt: skip
                messages = fit.messages[:-1]  # what was dropped stays dropped
                answer = _answer(client, fit.messages, kwargs)
            except MuestraError as exc:
                print(f"muestra chat: {exc}", file=sys.stderr)
                continue
            messages += [{"role": "user", "content": line}, {"role": "assistant", "content": answer}]
