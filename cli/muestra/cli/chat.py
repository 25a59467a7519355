"""`muestra chat`: an interactive conversation with a text model through its chat template.

Each answer streams as it is generated. Ctrl-C stops the current answer (the request is cancelled;
the chat goes on, and the part already shown stays in the history); Ctrl-D or /exit ends the chat.
"""

from __future__ import annotations

import sys

from muestra.cli.endpoints import api_key, gateway_address
from muestra.cli.errors import CliError
from muestra.cli.generate import add_sampling_arguments, sampling_kwargs
from muestra.client import Client, MuestraError

EXIT_COMMANDS = ("/exit", "/quit")


def add_parser(sub) -> None:
    parser = sub.add_parser("chat", help="chat with a text model (Ctrl-C stops an answer, Ctrl-D or /exit ends)")
    parser.add_argument("--system", default="", help="system message that opens the conversation")
    add_sampling_arguments(parser)
    parser.set_defaults(run=run, max_tokens=256)


def _text_model(client: Client, name: str) -> str:
    """The model the chat talks to (asking the gateway also checks that it is reachable)."""
    text_models = [m.name for m in client.list_models() if m.kind == "text"]
    if not text_models:
        raise CliError(f"the gateway at {client.address} serves no text model")
    if name and name not in text_models:
        raise CliError(f"--model: unknown text model {name!r}; known: {', '.join(text_models)}")
    return name or text_models[0]


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
        kwargs["model"] = _text_model(client, args.model)
        print(f"muestra chat with {kwargs['model']}: Ctrl-C stops an answer, Ctrl-D or /exit ends", file=sys.stderr)
        messages = [{"role": "system", "content": args.system}] if args.system else []
        while True:
            try:
                line = input("> ")
            except EOFError:
                print()
                return 0
            except KeyboardInterrupt:  # at the prompt: a fresh line, as a shell does
                print()
                continue
            if line.strip() in EXIT_COMMANDS:
                return 0
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line})
            try:
                answer = _answer(client, messages, kwargs)
            except MuestraError as exc:
                print(f"muestra chat: {exc}", file=sys.stderr)
                messages.pop()
                continue
            messages.append({"role": "assistant", "content": answer})
