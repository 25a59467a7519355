"""`muestra plugins`: the plugins and what each registers, from the running gateway or this environment.

With --gateway, or when `muestra up` is running (or MUESTRA_GATEWAY_ADDR is set), the gateway's own
plugins (ListPlugins, ListSamplers and ListConstraints; schedulers as its diffusion services list them);
else, or with --local, the plugins installed in this Python environment, with the error of each that
failed to load or to register.
"""

from __future__ import annotations

import importlib.util
import json
import os

from muestra.cli.endpoints import api_key, gateway_address, running_stack
from muestra.cli.errors import CliError


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "plugins", help="list sampler, constraint, proposer and scheduler plugins (of the running gateway)"
    )
    parser.add_argument("--gateway", default=None, help="ask this gateway [MUESTRA_GATEWAY_ADDR, else `muestra up`'s]")
    parser.add_argument("--local", action="store_true", help="list this environment's plugins, not a gateway's")
    parser.add_argument("--api-key", default=None, help="API key [MUESTRA_API_KEY]")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run)


def _row(
    name, distribution, version, disabled, samplers, schedulers, constraints=(), errors=None, proposers=()
) -> dict:
    return {
        "name": name,
        "distribution": distribution,
        "version": version,
        "disabled": disabled,
        "samplers": samplers,
        "schedulers": schedulers,
        "constraints": list(constraints),
        "proposers": list(proposers),
        "errors": dict(errors or {}),
    }


def _constraint(name: str, description: str, parameter_schema: dict) -> dict:
    return {"name": name, "description": description, "parameter_schema": parameter_schema}


def _local() -> list[dict]:
    try:
        from muestra.gateway.engine.constraints.registry import ConstraintRegistry
        from muestra.gateway.engine.proposers.registry import ProposerRegistry
        from muestra.gateway.engine.sampling import SamplerRegistry
    except ImportError:
        raise CliError("muestra-gateway is not installed here; ask a gateway with --gateway ADDRESS") from None
    # Every kind's registry loads from the same import of each entry point (muestra.plugin.manager).
    samplers = SamplerRegistry.load()
    rows = {
        plugin.name: _row(
            plugin.name, plugin.distribution, plugin.version, plugin.disabled,
            [
                {"name": entry.name, "description": entry.sampler.description,
                 "argmax_invariant": entry.sampler.argmax_invariant, "kind": entry.kind}
                for entry in map(samplers.lookup, plugin.samplers)
            ],
            [],
            errors=plugin.errors,
        )
        for plugin in samplers.plugins()
    }  # fmt: skip

    def row_of(entry) -> dict:
        return rows.setdefault(entry.plugin, _row(entry.plugin, entry.distribution, entry.version, False, [], []))

    constraints = ConstraintRegistry.load()
    for entry in constraints.list():
        row_of(entry)["constraints"].append(
            _constraint(entry.name, entry.constraint.description, entry.constraint.parameter_schema)
        )
    proposers = ProposerRegistry.load()
    for entry in proposers.list():
        row_of(entry)["proposers"].append({"name": entry.name, "description": entry.proposer.description})
    registries = [constraints, proposers]
    if importlib.util.find_spec("muestra.diffusion") is not None:
        from muestra.diffusion.registry import SchedulerRegistry

        schedulers = SchedulerRegistry.load()
        for entry in schedulers.entries():  # in registration order, as the diffusion service lists them
            row_of(entry)["schedulers"].append({"name": entry.name, "aliases": list(entry.aliases)})
        registries.append(schedulers)
    for registry in registries:
        for plugin, errors in registry.errors.items():
            if plugin in rows:
                rows[plugin]["errors"].update(errors)
    return list(rows.values())


def _remote(address: str, key: str | None) -> list[dict]:
    from muestra.client import Client
    from muestra.v1 import gateway_pb2

    with Client(address, api_key=key) as client:
        samplers = {s.name: s for s in client.list_samplers()}
        # The client has no list_constraints yet; the same unary call its list_* methods make.
        constraints = {
            c.name: c
            for c in client._unary(client._stub.ListConstraints, gateway_pb2.ListConstraintsRequest()).constraints
        }
        plugins = client.list_plugins()

    def sampler(name: str) -> dict:
        info = samplers.get(name)
        return {
            "name": name,
            "description": info.description if info else "",
            "argmax_invariant": info.argmax_invariant if info else False,
        }

    def constraint(name: str) -> dict:
        info = constraints.get(name)
        schema = json.loads(info.parameter_schema) if info and info.parameter_schema else {}
        return _constraint(name, info.description if info else "", schema)

    return [
        _row(
            p.name, p.distribution, p.version, p.disabled,
            [sampler(name) for name in p.samplers], [{"name": name} for name in p.schedulers],
            [constraint(name) for name in p.constraints],
            proposers=[{"name": name} for name in p.proposers],
        )
        for p in plugins
    ]  # fmt: skip


def _print(rows: list[dict]) -> None:
    for row in rows:
        state = " (disabled)" if row["disabled"] else ""
        print(f"{row['name']}  {row['distribution']} {row['version']}{state}".rstrip())
        for s in row["samplers"]:
            print(f"  sampler   {s['name']:<20} {s['description']}".rstrip())
        for c in row["constraints"]:
            print(f"  constraint {c['name']:<19} {c['description']}".rstrip())
            for key, schema in c["parameter_schema"].get("properties", {}).items():
                required = " (required)" if key in c["parameter_schema"].get("required", ()) else ""
                print(f"    {key}: {json.dumps(schema, sort_keys=True)}{required}")
        for p in row["proposers"]:
            print(f"  proposer  {p['name']:<20} {p.get('description', '')}".rstrip())
        for s in row["schedulers"]:
            aliases = f"(also {', '.join(s['aliases'])})" if s.get("aliases") else ""
            print(f"  scheduler {s['name']:<20} {aliases}".rstrip())
        for hook, error in row["errors"].items():
            print(f"  failed in {hook}: {error}")
        registered = row["samplers"] or row["schedulers"] or row["constraints"] or row["proposers"]
        if not registered and not row["errors"]:
            print("  (registers nothing here)")


def run(args) -> int:
    remote = not args.local and (args.gateway or os.environ.get("MUESTRA_GATEWAY_ADDR") or running_stack())
    if remote:
        args.gateway = gateway_address(args.gateway)
        rows = _remote(args.gateway, api_key(args.api_key))
    else:
        rows = _local()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print(rows)
    return 0
