"""Databricks notebook source files (``.py``) as cells, and their ``.ipynb`` form.

The source format: the first line is ``# Databricks notebook source``, cells
are separated by a line ``# COMMAND ----------``, and a magic cell has every
line prefixed ``# MAGIC `` (``# MAGIC %md`` markdown, ``# MAGIC %pip ...``,
``# MAGIC %run ./other``). ``to_ipynb`` writes nbformat 4 JSON with markdown
cells for ``%md`` and code cells (magics kept as ``%pip``/``%run`` lines) for
the rest; ``from_ipynb`` reads it back. Both are deterministic: the same
source gives the same bytes.

Deliberately not handled: other languages' notebooks (``-- Databricks
notebook source`` for SQL, ``//`` for Scala), ``# DBTITLE`` cell titles
(kept as code lines), and Jupyter outputs (written empty, ignored on read).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from enum import Enum

from sparkgrad.errors import InvalidArgumentError, NotebookNotFoundError, SparkgradIOError

HEADER = "# Databricks notebook source"
SEPARATOR = "# COMMAND ----------"
MAGIC = "# MAGIC"


class CellKind(Enum):
    PYTHON = "python"
    MARKDOWN = "md"
    RUN = "run"
    PIP = "pip"
    OTHER_MAGIC = "magic"  # %sh, %sql, %fs, ...: not run by the local runner


@dataclass(frozen=True)
class Cell:
    """One cell. ``source`` is Python code, or a magic's text without the ``# MAGIC`` prefixes."""

    number: int  # 1-based, as Databricks shows them
    kind: CellKind
    source: str
    line: int  # 1-based line of the cell's first source line in the file

    @property
    def first_line(self) -> str:
        """The cell's first non-blank line, stripped."""
        return next((x.strip() for x in self.source.splitlines() if x.strip()), "")

    @property
    def magic_args(self) -> list[str]:
        """A magic cell's arguments: ``%run ./x`` -> ["./x"], ``%pip install a b`` -> ["install", "a", "b"]."""
        return shlex.split(self.first_line)[1:]


@dataclass(frozen=True)
class Notebook:
    """A parsed notebook: its file and its cells, in order."""

    path: str
    cells: tuple[Cell, ...]

    @property
    def name(self) -> str:
        """The file name without its folder and extension."""
        return os.path.splitext(os.path.basename(self.path))[0]


def _kind(magic_text: str) -> CellKind:
    word = magic_text.split(None, 1)[0] if magic_text.strip() else ""
    return {"%md": CellKind.MARKDOWN, "%run": CellKind.RUN, "%pip": CellKind.PIP}.get(word, CellKind.OTHER_MAGIC)


def _trim(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    while lines and not lines[0][1].strip():
        lines = lines[1:]
    while lines and not lines[-1][1].strip():
        lines = lines[:-1]
    return lines


def _unmagic(line: str) -> str | None:
    """``# MAGIC text`` -> "text", ``# MAGIC`` -> "", anything else -> None."""
    if line == MAGIC:
        return ""
    if line.startswith(MAGIC + " "):
        return line[len(MAGIC) + 1 :]
    return None


def parse_source(text: str, path: str = "<notebook>") -> Notebook:
    """The cells of a Databricks notebook source file (what Databricks exports as SOURCE).

    Cells are separated by ``# COMMAND ----------`` lines; a cell whose every line starts with
    ``# MAGIC`` is a magic cell (``%md``, ``%run``, ``%pip``, or another), its source the text without
    the prefixes.

    Args:
        text: The file's text; its first line must be ``# Databricks notebook source``.
        path: Names the notebook in the result and in errors.

    Returns:
        A ``Notebook`` with ``path`` and ``cells``; each cell has ``number`` (1-based, as Databricks
        shows them), ``kind``, ``source`` and ``line`` (1-based line of its first source line).

    Raises:
        InvalidArgumentError: The header line is missing.
    """
    lines = text.splitlines()
    if not lines or lines[0].strip() != HEADER:
        raise InvalidArgumentError(f"{path}: not a Databricks notebook source file (first line is not {HEADER!r})")
    chunks: list[list[tuple[int, str]]] = [[]]
    for lineno, line in enumerate(lines[1:], start=2):
        if line.rstrip() == SEPARATOR:
            chunks.append([])
        else:
            chunks[-1].append((lineno, line))
    cells = []
    for chunk in map(_trim, chunks):
        if not chunk:
            continue
        magic = [_unmagic(line) for _, line in chunk]
        number = len(cells) + 1
        if all(m is not None for m in magic):
            text_lines = [m for m in magic if m is not None]
            cells.append(Cell(number, _kind(text_lines[0]), "\n".join(text_lines), chunk[0][0]))
        else:
            cells.append(Cell(number, CellKind.PYTHON, "\n".join(line for _, line in chunk), chunk[0][0]))
    return Notebook(path, tuple(cells))


def resolve_path(path: str, base_dir: str | None = None) -> str:
    """A notebook path as Databricks names it (no extension, maybe relative) -> the ``.py`` file."""
    if not os.path.isabs(path) and base_dir is not None:
        path = os.path.join(base_dir, path)
    path = os.path.normpath(path)
    if not path.endswith(".py") and not os.path.isfile(path):
        path += ".py"
    return path


def read_notebook(path: str) -> Notebook:
    """Reads and parses the notebook source file ``path`` (see `parse_source`).

    Raises:
        NotebookNotFoundError: There is no such file; the error names the path.
        InvalidArgumentError: The file cannot be read or is not a notebook source file.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NotebookNotFoundError(
            f"no notebook at {path} ({exc.strerror})",
            path=path,
            cell=None,
            first_line="",
            remote_traceback="",
            missing=path,
        ) from None
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read notebook {path}: {exc}", path=path) from exc
    return parse_source(text, path)


def to_source(nb: Notebook) -> str:
    """The source text of a notebook (what Databricks exports as SOURCE)."""
    parts = []
    for cell in nb.cells:
        if cell.kind == CellKind.PYTHON:
            parts.append(cell.source)
        else:
            parts.append("\n".join(f"{MAGIC} {x}" if x else MAGIC for x in cell.source.splitlines()))
    return HEADER + "\n" + f"\n\n{SEPARATOR}\n\n".join(parts) + "\n"


def _lines(text: str) -> list[str]:
    out = text.splitlines(keepends=True)
    if out:
        out[-1] = out[-1].rstrip("\n")
    return out


def to_ipynb(nb: Notebook) -> dict:
    """The notebook as nbformat 4 JSON (a dict), for Jupyter.

    ``%md`` cells become markdown cells (without the ``%md`` line), every other cell a code cell without
    outputs.
    """
    cells = []
    for cell in nb.cells:
        if cell.kind == CellKind.MARKDOWN:
            body = cell.source.split("\n", 1)[1] if "\n" in cell.source else ""
            cells.append({"cell_type": "markdown", "metadata": {}, "source": _lines(body)})
        else:
            cells.append(
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "metadata": {},
                    "outputs": [],
                    "source": _lines(cell.source),
                }
            )
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def ipynb_text(nb: Notebook) -> str:
    """`to_ipynb` as the text written to disk: sorted keys, one-space indent, a final newline (stable diffs)."""
    return json.dumps(to_ipynb(nb), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def from_ipynb(data: dict, path: str = "<notebook>") -> Notebook:
    """A notebook from nbformat 4 JSON (``json.load`` of an ``.ipynb``).

    Markdown cells become ``%md`` cells, code cells starting with ``%pip``, ``%run`` or another magic
    become magic cells; the cells' ``line`` is 0.

    Args:
        data: The parsed JSON.
        path: Names the notebook.
    """
    cells = []
    for raw in data.get("cells", []):
        src = "".join(raw.get("source", [])) if isinstance(raw.get("source"), list) else raw.get("source", "")
        number = len(cells) + 1
        if raw.get("cell_type") == "markdown":
            cells.append(Cell(number, CellKind.MARKDOWN, "%md\n" + src if src else "%md", 0))
        elif src.lstrip().startswith("%"):
            cells.append(Cell(number, _kind(src.lstrip()), src, 0))
        else:
            cells.append(Cell(number, CellKind.PYTHON, src, 0))
    return Notebook(path, tuple(cells))


def export_ipynb(source: str, out_dir: str | None = None) -> str:
    """Converts a notebook source file to ``<name>.ipynb``, written with `ipynb_text`.

    Args:
        source: The notebook source file.
        out_dir: The folder to write to, created if missing (default: beside ``source``).

    Returns:
        The path of the ``.ipynb`` written.

    Raises:
        NotebookNotFoundError: ``source`` does not exist.
        SparkgradIOError: The file cannot be written.
    """
    nb = read_notebook(source)
    folder = out_dir or os.path.dirname(os.path.abspath(source))
    out = os.path.join(folder, nb.name + ".ipynb")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            f.write(ipynb_text(nb))
    except OSError as exc:
        raise SparkgradIOError(f"cannot write {out}: {exc}", path=out) from exc
    return out
