"""The ``sparkgrad`` command line.

    sparkgrad --version
    sparkgrad info              versions of the C core and its libraries
    sparkgrad databricks ...    deploy, jobs, fs, workspace (sparkgrad.databricks.cli_databricks)

Later subsystems add their subcommands through ``COMMANDS``: each entry names
a function that adds a subparser and returns the handler that runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from sparkgrad._version import __version__
from sparkgrad.errors import SparkgradError

Handler = Callable[[argparse.Namespace], int]


def _add_info(sub: argparse._SubParsersAction) -> Handler:
    sub.add_parser("info", help="print the versions of sparkgrad's C core and the libraries it links")

    def run(args: argparse.Namespace) -> int:
        import sparkgrad

        print(json.dumps(sparkgrad.build_info(), indent=2, sort_keys=True))
        return 0

    return run


def _add_convert(sub: argparse._SubParsersAction) -> Handler:
    from sparkgrad.data.convert import add_convert_command

    return add_convert_command(sub)


def _add_notebook(sub: argparse._SubParsersAction) -> Handler:
    from sparkgrad.databricks.commands import add_notebook_command

    return add_notebook_command(sub)


def _add_databricks(sub: argparse._SubParsersAction) -> Handler:
    from sparkgrad.databricks.cli_databricks import add_databricks_command

    return add_databricks_command(sub)


COMMANDS: dict[str, Callable[[argparse._SubParsersAction], Handler]] = {
    "info": _add_info,
    "convert": _add_convert,
    "notebook": _add_notebook,
    "databricks": _add_databricks,
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    parser = argparse.ArgumentParser(
        prog="sparkgrad", description="Distributed neural-network training on Spark and Databricks."
    )
    parser.add_argument("--version", action="version", version=f"sparkgrad {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    handlers = {name: add(sub) for name, add in COMMANDS.items()}
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return handlers[args.command](args)
    except SparkgradError as exc:
        print(f"sparkgrad {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
