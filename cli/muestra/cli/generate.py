"""`muestra generate PROMPT`: stream text from the gateway as it is produced (`-` reads the prompt from stdin)."""

from __future__ import annotations

import json
import sys

from muestra.cli.arguments import SEED, UINT64_MAX, address_type, integer, number
from muestra.cli.endpoints import api_key, gateway_address
from muestra.cli.errors import CliError
from muestra.client import Client

# The convenience flags; each becomes one step of the chain (see muestra.client.sampler_chain).
SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def add_sampling_arguments(parser) -> None:
    """The flags generate and chat share: model, sampling, seed, stops, gateway (each adds its --max-tokens)."""
    parser.add_argument("--model", default="", help="model name (default: the gateway's default)")
    parser.add_argument("--temperature", type=number(0.0, 100.0), default=None, help="0 means greedy")
    parser.add_argument("--top-p", type=number(0.0, 1.0, low_open=True), default=None)
    parser.add_argument("--top-k", type=integer(1, 1_000_000), default=None)
    parser.add_argument("--min-p", type=number(0.0, 1.0), default=None)
    parser.add_argument("--repetition-penalty", type=number(0.0, 100.0, low_open=True), default=None)
    parser.add_argument(
        "--sampler", nargs="+", action="append", default=[], metavar=("NAME", "KEY=VALUE"),
        help="one step of the sampler chain, e.g. --sampler top_k top_k=5 --sampler sample (repeatable, in order; "
        "values are JSON, else text; `muestra plugins` lists the samplers). Replaces --temperature/--top-*",
    )  # fmt: skip
    parser.add_argument("--seed", type=SEED, default=None, help=f"0 to {UINT64_MAX} (default: a random one)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument(
        "--draft", nargs="+", metavar=("PROPOSER", "KEY=VALUE"),
        help="speculative decoding: a draft proposer and its params, e.g. --draft ngram max_draft_tokens=8, or "
        "--draft off (default: the gateway's --speculation). The text for a seed is the same either way",
    )  # fmt: skip
    add_gateway_arguments(parser)


def add_gateway_arguments(parser) -> None:
    """--gateway and --api-key, which every command that talks to the gateway takes."""
    parser.add_argument(
        "--gateway", type=address_type("--gateway"), default=None,
        help="gateway HOST:PORT [MUESTRA_GATEWAY_ADDR, else the newest `muestra up`'s; `muestra up --list`]",
    )  # fmt: skip
    parser.add_argument("--api-key", default=None, help="API key [MUESTRA_API_KEY]")


def _param(step: str, item: str) -> tuple[str, object]:
    key, sep, text = item.partition("=")
    if not sep or not key:
        flag = step if step.startswith("--") else f"--sampler {step}"
        raise CliError(f"{flag}: {item!r} is not KEY=VALUE (a prompt goes before the flag, or after --)", 2)
    try:
        return key, json.loads(text)
    except ValueError:
        return key, text


def sampler_steps(raw: list[list[str]]) -> list[dict]:
    """[["top_k", "top_k=5"], ["sample"]] -> [{"name": "top_k", "params": {"top_k": 5}}, {"name": "sample", ...}]."""
    return [{"name": name, "params": dict(_param(name, item) for item in items)} for name, *items in raw]


def sampling_kwargs(args) -> dict:
    """The keyword arguments of Client.generate that the shared flags give."""
    flags = {name: getattr(args, name) for name in SAMPLING_FLAGS if getattr(args, name) is not None}
    if args.sampler and flags:
        given = ", ".join("--" + name.replace("_", "-") for name in flags)
        raise CliError(f"--sampler gives the whole chain; leave out {given} (or add them as --sampler steps)", 2)
    return dict(
        model=args.model,
        max_tokens=args.max_tokens,
        seed=args.seed,
        stop=args.stop,
        samplers=sampler_steps(args.sampler) or None,
        speculation=speculation_of(args.draft),
        **flags,
    )


def speculation_of(draft: list[str] | None) -> dict | None:
    """--draft ngram max_draft_tokens=8 -> {"proposer": "ngram", "params": {"max_draft_tokens": 8}}."""
    if not draft:
        return None
    proposer, *items = draft
    return {"proposer": proposer, "params": dict(_param(f"--draft {proposer}", item) for item in items)}


def add_parser(sub) -> None:
    parser = sub.add_parser("generate", help="stream a completion of a prompt from the gateway")
    parser.add_argument("prompt", nargs="?", help="prompt text; - reads it from standard input")
    parser.add_argument(
        "--max-tokens", type=integer(0), default=64, help="most tokens to generate (default 64; 0: up to the context)"
    )
    add_sampling_arguments(parser)
    parser.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS (up to --max-tokens)")
    parser.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    parser.add_argument("--json", action="store_true", help="print the final stats as JSON after the text")
    constrain = parser.add_mutually_exclusive_group()
    constrain.add_argument("--json-schema", metavar="FILE", help="the text is JSON valid against this JSON Schema file")
    constrain.add_argument("--regex", metavar="PATTERN", help="the whole text matches this regular expression")
    constrain.add_argument("--grammar", metavar="FILE", help="the text is in the language of this Lark grammar file")
    constrain.add_argument(
        "--constraint", nargs="+", metavar=("NAME", "KEY=VALUE"),
        help="a constraint kind by name with its params, e.g. --constraint choice 'choices=[\"yes\", \"no\"]' "
        "(values are JSON, else text; `muestra plugins` lists the kinds)",
    )  # fmt: skip
    parser.set_defaults(run=run)


def _read_file(flag: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except OSError as exc:
        raise CliError(f"{flag}: cannot read {path}: {exc.strerror}", 2) from None


def constraint_of(args) -> dict | None:
    """The request's constraint from --json-schema, --regex, --grammar or --constraint."""
    if args.json_schema is not None:
        return {"name": "json_schema", "params": {"schema": _read_file("--json-schema", args.json_schema)}}
    if args.regex is not None:
        return {"name": "regex", "params": {"pattern": args.regex}}
    if args.grammar is not None:
        return {"name": "grammar", "params": {"lark": _read_file("--grammar", args.grammar)}}
    if args.constraint:
        name, *items = args.constraint
        return {"name": name, "params": dict(_param(f"--constraint {name}", item) for item in items)}
    return None


def read_prompt(text: str) -> str:
    """The prompt argument, or standard input for `-` (without the final newline)."""
    if text != "-":
        return text
    prompt = sys.stdin.read()
    return prompt[:-1] if prompt.endswith("\n") else prompt


def run(args) -> int:
    args.gateway = gateway_address(args.gateway)
    kwargs = sampling_kwargs(args)
    if args.prompt is None:
        raise CliError("give a prompt, or - to read it from standard input", 2)
    constraint = constraint_of(args)
    prompt = read_prompt(args.prompt)
    messages = [{"role": "user", "content": prompt}] if args.chat else None
    with Client(args.gateway, api_key=api_key(args.api_key)) as client:
        generation = client.generate(
            None if args.chat else prompt,
            messages=messages,
            ignore_eos=args.ignore_eos,
            constraint=constraint,
            **kwargs,
        )
        try:
            for delta in generation:
                sys.stdout.write(delta.text)
                sys.stdout.flush()
        except KeyboardInterrupt:
            generation.cancel()
            print("\nmuestra generate: interrupted; the request was cancelled", file=sys.stderr)
            return 130
    sys.stdout.write("\n")
    done = generation.completions.get(0)
    if args.json and done is not None:
        print(json.dumps(done.__dict__, indent=2))
    if done is not None and done.error:
        raise CliError(done.error)
    return 0
