"""`alignflow hosts check|trust`: is every host reachable, and what runs there; trust a host's key."""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from alignflow.config.hosts import Host, Inventory

hosts_app = typer.Typer(help="Check the hosts of an inventory; trust a host's SSH key.", no_args_is_help=True)
_HOSTS_OPTION = typer.Option(Path("hosts.yaml"), "--hosts", help="The inventory (hosts.yaml).")


def check_host(host: Host) -> dict[str, Any]:
    """Reachability, latency and snapshot of one host, as a JSON-able dict (never raises for a host problem)."""
    from alignflow.errors import AlignflowError
    from alignflow.transport import open_transport

    result: dict[str, Any] = {"name": host.name, "role": host.role, "transport": host.transport,
                              "reachable": False, "reason": None, "connect_ms": None, "latency_ms": None,
                              "snapshot": None, "summary": None}
    try:
        with open_transport(host) as t:
            start = time.perf_counter()
            t.run(["true"], timeout_s=host.connect_timeout_s + 30)
            result["connect_ms"] = round((time.perf_counter() - start) * 1e3, 1)
            warm = []
            for _ in range(5):
                start = time.perf_counter()
                t.run(["true"], timeout_s=30)
                warm.append(time.perf_counter() - start)
            result["latency_ms"] = round(statistics.median(warm) * 1e3, 1)
            result["reachable"] = True
            snap = t.snapshot()
            result["snapshot"] = snap.model_dump(mode="json")
            result["summary"] = snap.summary()
    except AlignflowError as exc:
        result["reason"] = f"{type(exc).__name__}: {exc}"
    return result


def register(app: typer.Typer) -> None:
    app.add_typer(hosts_app, name="hosts")


@hosts_app.command("check")
def check_cmd(
    hosts: Path = _HOSTS_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a table."),
) -> None:
    """For every host: reachable or not (and why), latency, role, snapshot summary. Exit 1 if any is unreachable."""
    from alignflow.config.hosts import load_hosts

    inventory = load_hosts(hosts)
    with ThreadPoolExecutor(max_workers=min(8, len(inventory.hosts))) as pool:
        results = list(pool.map(check_host, inventory.hosts.values()))
    if as_json:
        typer.echo(json.dumps({"hosts": results}, indent=2))
    else:
        table = Table(title=f"hosts in {hosts}")
        for col in ("host", "role", "transport", "status", "connect", "latency", "snapshot / reason"):
            table.add_column(col, overflow="fold")
        for r in results:
            table.add_row(
                r["name"], r["role"], r["transport"],
                "[green]reachable[/]" if r["reachable"] else "[red]UNREACHABLE[/]",
                f"{r['connect_ms']:.0f} ms" if r["connect_ms"] is not None else "-",
                f"{r['latency_ms']:.1f} ms" if r["latency_ms"] is not None else "-",
                r["summary"] if r["reachable"] else r["reason"],
            )
        Console().print(table)
    raise typer.Exit(0 if all(r["reachable"] for r in results) else 1)


def _trust_target(inventory: Inventory, name: str) -> Host:
    """A host of the inventory, or `<host>-jump`: the jump host that `<host>`'s proxy_jump gives by address."""
    base = name[: -len("-jump")] if name.endswith("-jump") else None
    if name not in inventory.hosts and base in inventory.hosts:
        jump = inventory.hosts[base].jump_host()
        if jump is not None:
            return jump
    return inventory.get(name)


@hosts_app.command("trust")
def trust_cmd(
    name: str = typer.Argument(..., help="Host name in the inventory."),
    hosts: Path = _HOSTS_OPTION,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask; trust the keys the host presents now."),
) -> None:
    """Fetch the keys the host presents, show their fingerprints, and add them to the host's known_hosts.

    Exit 0 trusted (or already trusted), 1 when the keys cannot be fetched or are not accepted, 2 on a usage or
    configuration error.
    """
    from alignflow.config.hosts import load_hosts
    from alignflow.transport.hostkeys import trust, trusted_keys
    from alignflow.transport.keyscan import fetch_host_keys
    from alignflow.transport.openssh import known_host_name, known_hosts_path

    host = _trust_target(load_hosts(hosts), name)
    if host.transport != "ssh":
        typer.echo(f"{name}: uses the {host.transport} transport; there is no host key to trust", err=True)
        raise typer.Exit(1)
    presented = fetch_host_keys(host)
    known = trusted_keys(host)
    where = known_host_name(host)
    typer.echo(f"{name} ({where}) presents:")
    for k in presented:
        typer.echo(f"  {k.kind:24s} {k.fingerprint}")
    if {(k.kind, k.base64) for k in presented} <= {(k.kind, k.base64) for k in known}:
        typer.echo(f"already trusted in {known_hosts_path(host)}")
        raise typer.Exit(0)
    if known:
        typer.echo(f"WARNING: {known_hosts_path(host)} holds DIFFERENT key(s) for {where}:", err=True)
        for k in known:
            typer.echo(f"  {k.kind:24s} {k.fingerprint}", err=True)
        typer.echo("If the host was not reinstalled, this may be a man-in-the-middle attack.", err=True)
    if not yes and not typer.confirm(f"Trust these keys for {name}?", default=False):
        typer.echo("nothing changed", err=True)
        raise typer.Exit(1)
    path = trust(host, presented)
    typer.echo(f"trusted: {len(presented)} key(s) for {where} written to {path}")
