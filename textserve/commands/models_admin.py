"""`textserve models load|unload|reload`: the client side of the Admin service, for the CLI.

Imported only when one of these actions runs, so that listing needs no grpc.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from google.protobuf.json_format import MessageToDict

from textserve import connect
from textserve.cli import CliError
from textserve.client import AdminClient, ClientError
from textserve.v1 import admin_pb2, classifier_pb2

_ACTION_WORDS = {
    admin_pb2.VersionEvent.ACTION_LOADED: "loaded",
    admin_pb2.VersionEvent.ACTION_UNLOADED: "unloading (finishing its requests)",
    admin_pb2.VersionEvent.ACTION_REFUSED: "refused",
}


def describe_event(event: admin_pb2.VersionEvent) -> str:
    word = _ACTION_WORDS.get(event.action, "changed")
    reason = f": {event.reason}" if event.reason else ""
    return f"{event.model} version {event.version} {word}{reason}"


def describe_model(model: classifier_pb2.ModelSummary) -> str:
    name = classifier_pb2.ModelState.Name
    states = ", ".join(
        f"{v.version} {name(v.state).removeprefix('MODEL_STATE_').lower()}" for v in model.versions
    )
    serving = f"serving {model.ready_version}" if model.ready_version else "serving nothing"
    default = " (default)" if model.is_default else ""
    return f"{model.name}{default}: {serving}; versions: {states or 'none'}"


def _print(
    args: argparse.Namespace,
    response: Any,
    events: Iterable[admin_pb2.VersionEvent],
    models: Iterable[classifier_pb2.ModelSummary],
) -> None:
    if args.json:
        print(json.dumps(MessageToDict(response, preserving_proto_field_name=True), indent=2))
        return
    lines = [describe_event(e) for e in events] or ["no change"]
    print("\n".join([*lines, *(describe_model(m) for m in models)]))


def run_admin(args: argparse.Namespace) -> int:
    action: str = args.action
    if action in ("load", "unload") and not args.name:
        raise CliError(f"`textserve models {action}` needs the model: {action} NAME [VERSION]")
    if action == "reload" and args.name is not None:
        raise CliError("`textserve models reload` takes no model name (it scans every model)")
    if args.version is not None and args.version < 1:
        raise CliError(f"the version must be a positive integer, got {args.version}")
    options = connect.client_options(args)
    with AdminClient(args.server, timeout=args.timeout, **options) as admin:
        try:
            if action == "load":
                response: Any = admin.load_model(args.name, args.version)
                _print(args, response, response.events, [response.model])
            elif action == "unload":
                response = admin.unload_model(args.name, args.version)
                _print(args, response, response.events, [response.model])
            else:
                response = admin.reload_repository()
                _print(args, response, response.events, response.models)
        except ClientError as exc:
            if exc.code == "FAILED_PRECONDITION":  # the version was refused: not a usage error
                print(f"textserve models {action}: {exc.message}", file=sys.stderr)
                return 1
            hint = {
                "UNIMPLEMENTED": " (start the server with --enable-admin)",
                "UNAVAILABLE": f" (is a server listening on {args.server}?)",
                "UNAUTHENTICATED": f" (pass --token-file or set ${connect.TOKEN_ENV})",
            }.get(exc.code, "")
            raise CliError(f"{exc}{hint}") from None
    return 0
