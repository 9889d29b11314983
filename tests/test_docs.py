"""The documentation says what the code does: the guide's examples run, and every public name has a docstring.

Code blocks: every fenced ```` ```python ```` block at the start of a line in ``docs/**/*.md`` is
executed, page by page: a page's blocks run in order in one fresh interpreter and one namespace (a
later block may use what an earlier one defined), in an empty temporary directory, with the in-tree
package on the path. A block that cannot run here (it needs a Spark cluster, Databricks, a
TensorFlowOnSpark program's ``map_fun`` context, the network) says so on the line before its fence:

    <!-- docs-test: skip (needs a cluster of executors) -->

and the reason in brackets is required. Blocks in other languages (``bash``, ``text``, ``pycon``) are
not run. A failing block is reported as ``page.md:LINE``, with the block's traceback.

Docstrings: every name in the ``__all__`` of the modules the API reference renders has a docstring as
mkdocstrings sees it (griffe, the same loader `make docs` uses), so the reference has no empty entries.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python(\s.*)?$")
SKIP = re.compile(r"^<!-- docs-test: skip \((?P<reason>[^)]+)\) -->$")
PAGE_TIMEOUT = 240  # s: a page's blocks together (one of them may start a local Spark)

# The modules whose __all__ the API reference renders (docs/api/*.md), as the issue lists them.
API_MODULES = (
    "sparkgrad",
    "sparkgrad.nn",
    "sparkgrad.spark",
    "sparkgrad.hvd",
    "sparkgrad.hvd.torch",
    "sparkgrad.torch",
    "sparkgrad.data",
    "sparkgrad.databricks",
    "sparkgrad.mlflow",
    "sparkgrad.summary",
    "sparkgrad.errors",
    "sparkgrad.TFCluster",
    "sparkgrad.TFNode",
)


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to docs/
    line: int  # 1-based line of the block's first code line
    code: str
    skip: str | None  # the reason given, or None when the block runs


def blocks_of(path: pathlib.Path, root: pathlib.Path = DOCS) -> list[Block]:
    """The ```python blocks of one page, with their skip markers; an unclosed fence is an error."""
    rel = str(path.relative_to(root))
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        if not FENCE.match(lines[i]):
            i += 1
            continue
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = SKIP.match(lines[j]) if j >= 0 else None
        if j >= 0 and lines[j].startswith("<!-- docs-test") and marker is None:
            raise ValueError(f"{rel}:{j + 1}: a skip marker reads <!-- docs-test: skip (reason) -->")
        end = i + 1
        while end < len(lines) and lines[end] != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{rel}:{i + 1}: ```python block is never closed")
        out.append(Block(rel, i + 2, "\n".join(lines[i + 1 : end]) + "\n", marker["reason"] if marker else None))
        i = end + 1
    return out


def _pages() -> list[pathlib.Path]:
    return sorted(p for p in DOCS.rglob("*.md") if any(b.skip is None for b in blocks_of(p)))


# Runs the blocks handed on stdin in one namespace; each compiled under its page and line so that a
# traceback points into the Markdown file.
RUNNER = """
import json, sys, traceback
ns = {"__name__": "__main__"}
for b in json.load(sys.stdin):
    code = compile("\\n" * (b["line"] - 1) + b["code"], b["page"], "exec")
    try:
        exec(code, ns)
    except BaseException:
        print(f"docs-test: block at {b['page']}:{b['line']} failed", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_guide_code_blocks_run(page, tmp_path):
    runnable = [dataclasses.asdict(b) for b in blocks_of(page) if b.skip is None]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("MPLBACKEND", "Agg")
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(runnable),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=PAGE_TIMEOUT,
    )
    assert proc.returncode == 0, f"{page.relative_to(DOCS)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def test_blocks_are_found_and_skips_need_a_reason(tmp_path):
    page = tmp_path / "docs" / "p.md"
    page.parent.mkdir()
    page.write_text(
        "intro\n```python\nx = 1\n```\n\n<!-- docs-test: skip (needs a cluster) -->\n\n```python\ncluster()\n```\n"
        "```bash\nmake demo\n```\n"
    )
    found = blocks_of(page, root=page.parent)
    assert [(b.line, b.code, b.skip) for b in found] == [(3, "x = 1\n", None), (9, "cluster()\n", "needs a cluster")]
    page.write_text("<!-- docs-test: skip -->\n```python\nx\n```\n")
    with pytest.raises(ValueError, match="p.md:1: a skip marker reads"):
        blocks_of(page, root=page.parent)
    page.write_text("```python\nx\n")
    with pytest.raises(ValueError, match="p.md:1: ```python block is never closed"):
        blocks_of(page, root=page.parent)


def test_every_page_has_runnable_or_explained_blocks():
    """Every page parses (no unclosed fence, no marker without a reason); the guide runs something."""
    pages = sorted(DOCS.rglob("*.md"))
    assert pages, "docs/ has no pages"
    for p in pages:
        blocks_of(p)
    assert _pages(), "no page of docs/ has a code block that runs"


def _griffe_package():
    griffe = pytest.importorskip("griffe", reason="griffe comes with the docs extra (mkdocstrings-python)")
    return griffe, griffe.load("sparkgrad", search_paths=[str(ROOT / "python")], resolve_aliases=True)


def test_every_public_name_has_a_docstring():
    griffe, package = _griffe_package()
    import importlib

    missing = []
    for name in API_MODULES:
        module = importlib.import_module(name)
        rendered = package if name == "sparkgrad" else package[name.removeprefix("sparkgrad.")]
        assert rendered.docstring and rendered.docstring.value.strip(), f"module {name} has no docstring"
        if not hasattr(module, "__all__"):
            missing.append(f"{name} (no __all__: the reference renders what __all__ lists)")
            continue
        for member in module.__all__:
            try:
                obj = rendered[member]
                if isinstance(obj, griffe.Alias):
                    obj = obj.final_target
            except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                missing.append(f"{name}.{member} (not found by a static reading of the module)")
                continue
            if not (obj.docstring and obj.docstring.value.strip()):
                missing.append(f"{name}.{member}")
    assert not missing, f"public names without a docstring: {missing}"
