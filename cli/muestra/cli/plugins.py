"""`muestra plugins`: the installed plugins and what each registers (in-process, or from a gateway)."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    parser = sub.add_parser("plugins", help="list installed sampler and scheduler plugins")
    parser.add_argument("--gateway", default=None, help="ask this running gateway instead of this environment")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run)


def _local() -> list[dict]:
    from muestra.gateway.sampling import SamplerRegistry

    registry = SamplerRegistry.load()
    samplers = {entry.name: entry for entry in registry.list()}
    rows = []
    for plugin in registry.plugins():
        rows.append(
            {
                "name": plugin.name,
                "distribution": plugin.distribution,
                "version": plugin.version,
                "disabled": plugin.disabled,
                "samplers": [
                    {"name": name, "argmax_invariant": samplers[name].argmax_invariant, "kind": samplers[name].kind}
                    for name in plugin.samplers
                ],
            }
        )
    return rows


def _remote(address: str) -> list[dict]:
    from muestra.client import Client

    with Client(address) as client:
        return [
            {
                "name": p.name,
                "distribution": p.distribution,
                "version": p.version,
                "disabled": p.disabled,
                "samplers": [{"name": s} for s in p.samplers],
            }
            for p in client.list_plugins()
        ]


def run(args) -> int:
    if args.gateway:
        rows = _remote(args.gateway)
    else:
        try:
            rows = _local()
        except ImportError:
            print("muestra plugins: muestra-gateway is not installed here; use --gateway ADDRESS")
            return 1
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        state = " (disabled)" if row["disabled"] else ""
        names = ", ".join(s["name"] for s in row["samplers"]) or "-"
        print(f"{row['name']:<20} {row['distribution']} {row['version']}{state}: {names}")
    return 0
