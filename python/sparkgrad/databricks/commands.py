"""The ``sparkgrad notebook`` subcommand.

    sparkgrad notebook run PATH [--param k=v ...] [--allow-pip | --skip-pip] [--timeout S]
                               [--dbfs-root DIR] [--master local[N]]
    sparkgrad notebook export SOURCE.py ... [--out DIR]

``run`` prints each cell's progress on stderr and the exit value on stdout;
a failing cell exits 1 with the cell's number, first line and traceback, a
notebook that names no file exits 1 naming it (before Spark starts).
``export`` writes the ``.ipynb`` copy of each source beside it (or in --out,
created if missing).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from sparkgrad.databricks.runner import DEFAULT_MASTER, DEFAULT_TIMEOUT
from sparkgrad.errors import InvalidArgumentError


def param(text: str) -> tuple[str, str]:
    """argparse type of a ``--param KEY=VALUE`` flag."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key, value


def params(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """The ``--param`` pairs as a dict; a key given twice is refused."""
    found = dict(pairs)
    if len(found) != len(pairs):
        raise InvalidArgumentError("a --param key is given twice")
    return found


def add_notebook_command(sub: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    p = sub.add_parser("notebook", help="run Databricks notebooks locally; export them as .ipynb")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = actions.add_parser("run", help="run a Databricks notebook source file on local Spark")
    r.add_argument("path", help="the notebook's .py source file")
    r.add_argument("--param", action="append", type=param, default=[], metavar="KEY=VALUE", help="a widget value")
    pip = r.add_mutually_exclusive_group()
    pip.add_argument("--allow-pip", action="store_true", help="run %%pip cells with this Python's pip")
    pip.add_argument("--skip-pip", action="store_true", help="skip %%pip cells (saying so) instead of refusing them")
    r.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds for the whole run (default %(default)g)"
    )
    r.add_argument("--dbfs-root", default=None, help="the folder dbfs:/ and /dbfs/ stand for")
    r.add_argument("--master", default=DEFAULT_MASTER, help="the local Spark master (default %(default)s)")
    e = actions.add_parser("export", help="write the .ipynb copy of notebook source files")
    e.add_argument("sources", nargs="+", help="notebook .py source files")
    e.add_argument("--out", default=None, help="output folder (default: beside each source)")

    def run(args: argparse.Namespace) -> int:
        if args.action == "export":
            from sparkgrad.databricks.notebook import export_ipynb

            for source in args.sources:
                print(export_ipynb(source, args.out))
            return 0
        from sparkgrad.databricks.runner import run_notebook

        widget_values = params(args.param)
        result = run_notebook(
            args.path,
            widget_values,
            args.timeout,
            dbfs_root=args.dbfs_root,
            allow_pip=args.allow_pip,
            skip_pip=args.skip_pip,
            master=args.master,
            log=lambda line: print(f"[notebook] {line}", file=sys.stderr, flush=True),
        )
        if result.exit_value is not None:
            print(result.exit_value)
        return 0

    return run
