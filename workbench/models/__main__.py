"""`python -m workbench.models prepare [NAME ...]`: convert models ahead of time; `list`: aliases."""

from __future__ import annotations

import argparse
import sys

from workbench.models.registry import ALIASES, DEFAULT_MODEL, resolve_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.models")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="convert/cache models so later loads are fast")
    prepare.add_argument("names", nargs="*", default=[DEFAULT_MODEL],
                         help=f"aliases, directories or .gguf files (default: {DEFAULT_MODEL})")
    commands.add_parser("list", help="list the model aliases")
    args = parser.parse_args(argv)
    if args.command == "list":
        for alias in ALIASES.values():
            print(f"{alias.name:24} {alias.kind:8} {alias.description}")
        return 0
    for name in args.names:
        try:
            spec = resolve_model(name)
        except (ValueError, FileNotFoundError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(f"{spec.name}: {spec.kind} model ready at {spec.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
