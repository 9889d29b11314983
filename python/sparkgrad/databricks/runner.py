"""Runs a Databricks notebook source file on local Spark, cell by cell, in one namespace.

The namespace has ``spark``, ``sc``, ``dbutils`` (sparkgrad.databricks.dbutils),
``display``, ``displayHTML`` and ``getArgument``, and ``__name__ == "__main__"``
(so functions defined in cells are shipped to executors by value, as on
Databricks). ``%md`` cells are skipped; ``%run ./other`` runs the other
notebook's cells in the same namespace; ``%pip`` cells are refused unless
``allow_pip`` (then pip runs in this interpreter) or ``skip_pip`` (then they
are reported and skipped); other magics (``%sh``, ``%sql``, ``%fs``, ...) are
refused. ``dbutils.notebook.run`` starts a child run (fresh namespace, its own
widgets, the same Spark and DBFS root) and returns its exit value.

A cell that raises ends the run with NotebookError (notebook, cell number,
first line, traceback, with line numbers of the source file). A notebook that
names no file ends it with NotebookNotFoundError naming the file looked for:
the notebook to run (found missing before Spark starts), or a ``%run`` or
``dbutils.notebook.run`` target (then with the calling notebook and cell).
Each run has a deadline; when it passes, the cell running gets an exception
raised in it (delivered at its next Python bytecode: a call blocked in C
returns first) and the run ends with NotebookTimeout naming the notebook and
the cell.
Nesting (%run and notebook.run) is bounded by ``max_depth``.
"""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkgrad.databricks.dbutils import DBUtils, FileSystem, NotebookExit, NotebookWorkflow, Secrets, Widgets
from sparkgrad.databricks.notebook import Cell, CellKind, Notebook, read_notebook, resolve_path
from sparkgrad.errors import InvalidArgumentError, NotebookError, NotebookNotFoundError, NotebookTimeout

DEFAULT_TIMEOUT = 3600.0  # s, per top-level run
DEFAULT_MASTER = "local[4]"  # 1 ps + 2 workers + a feeding slot
MAX_DEPTH = 8
DISPLAY_ROWS = 20
LOG_VALUE_CHARS = 200  # of an exit value, in the progress log
PIP_HINT = "pass allow_pip=True (sparkgrad notebook run --allow-pip) to run pip in this Python, or skip_pip=True"


@dataclass(frozen=True)
class NotebookResult:
    """What `run_notebook` returns once the notebook ended (by its last cell or by ``dbutils.notebook.exit``)."""

    path: str
    """The notebook file that ran."""
    exit_value: str | None  # dbutils.notebook.exit's value; None if the notebook ran to its end
    """The string the notebook passed to ``dbutils.notebook.exit``; None if it ran to its end."""
    cells_run: int  # code cells executed (not %md, not skipped %pip)
    """Code cells executed (``%md`` cells and skipped ``%pip`` cells not counted)."""
    seconds: float
    """Wall-clock duration of the run."""
    namespace: dict = field(compare=False, repr=False)
    """The notebook's global namespace after the run: what its cells defined, for tests to inspect."""


@dataclass(frozen=True)
class _Options:
    dbfs_root: str
    run_dir: str
    allow_pip: bool
    skip_pip: bool
    log: Callable[[str], None]
    environ: Mapping[str, str]
    max_depth: int


class _CellTimeout(BaseException):
    """Raised asynchronously in the running cell when its run's deadline passes (one subclass per run)."""


class _Watchdog:
    """Raises ``exc_type`` in thread ``thread_id`` at ``deadline`` (time.monotonic), unless disarmed first."""

    def __init__(self, thread_id: int, deadline: float, exc_type: type[BaseException]) -> None:
        self._lock = threading.Lock()
        self._armed = True
        self._thread_id, self._exc_type = thread_id, exc_type
        self._timer = (
            threading.Timer(max(0.0, deadline - time.monotonic()), self._fire) if deadline < math.inf else None
        )
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._armed:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self._thread_id), ctypes.py_object(self._exc_type)
                )

    def disarm(self) -> None:
        with self._lock:
            self._armed = False
        if self._timer is not None:
            self._timer.cancel()


class _Display:
    """display(): a DataFrame's first rows, a matplotlib figure saved as PNG in the run folder, else repr."""

    def __init__(self, run_dir: str) -> None:
        self._run_dir = run_dir
        self._count = 0

    def _file(self, suffix: str) -> str:
        self._count += 1
        os.makedirs(self._run_dir, exist_ok=True)
        return os.path.join(self._run_dir, f"display-{self._count:03d}{suffix}")

    def __call__(self, obj: Any, *args: Any, **kwargs: Any) -> None:
        if hasattr(obj, "savefig"):  # a matplotlib Figure
            path = self._file(".png")
            obj.savefig(path)
            print(f"[display] figure saved to {path}")
        elif hasattr(obj, "show") and hasattr(obj, "schema"):  # a Spark DataFrame
            obj.show(DISPLAY_ROWS, truncate=False)
        elif hasattr(obj, "head") and hasattr(obj, "to_string"):  # a pandas DataFrame
            print(obj.head(DISPLAY_ROWS).to_string())
        else:
            print(repr(obj))

    def html(self, html: str) -> None:
        path = self._file(".html")
        with open(path, "w", encoding="utf-8") as f:
            f.write(html)
        print(f"[displayHTML] saved to {path}")


def _cell_failure(
    cls: type, nb: Notebook, cell: Cell | None, message: str, tb: str = "", **details: object
) -> NotebookError:
    """A NotebookError (or subclass) about ``cell`` of ``nb`` (None: before its first cell)."""
    return cls(
        f"{nb.path}: {message}",
        path=nb.path,
        cell=cell.number if cell is not None else None,
        first_line=cell.first_line if cell is not None else "",
        remote_traceback=tb,
        **details,
    )


def _cell_traceback(exc: BaseException) -> str:
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # drop the runner's exec frame
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _cell_error(nb: Notebook, cell: Cell, exc: BaseException) -> NotebookError:
    text = _cell_traceback(exc)
    return _cell_failure(
        NotebookError, nb, cell, f"cell {cell.number} failed: {cell.first_line}\n{text.rstrip()}", text
    )


def _not_found(nb: Notebook, cell: Cell, missing: NotebookNotFoundError, tb: str = "") -> NotebookError:
    """The NotebookNotFoundError of ``cell`` of ``nb``, whose %run or dbutils.notebook.run named no file."""
    where = f"cell {cell.number} ({cell.first_line})"
    return _cell_failure(
        NotebookNotFoundError, nb, cell, f"{where}: no notebook at {missing.missing}", tb, missing=missing.missing
    )


class _Runner:
    def __init__(self, spark: Any, options: _Options) -> None:
        self._spark = spark
        self._opt = options
        self._display = _Display(options.run_dir)

    def run(self, nb: Notebook, params: Mapping[str, str], deadline: float, depth: int) -> NotebookResult:
        """One run (top level or dbutils.notebook.run): a fresh namespace and widgets, its own watchdog."""
        if depth > self._opt.max_depth:
            raise NotebookError(
                f"{nb.path}: notebooks nested more than {self._opt.max_depth} deep", path=nb.path, cell=None
            )
        folder = os.path.dirname(os.path.abspath(nb.path))

        def run_child(child: str, timeout: float, arguments: Mapping[str, str]) -> str | None:
            own = time.monotonic() + timeout if timeout > 0 else math.inf
            # A missing child raises NotebookNotFoundError (cell None): _cell names the calling cell.
            result = self.run(read_notebook(resolve_path(child, folder)), arguments, min(deadline, own), depth + 1)
            return result.exit_value

        widgets = Widgets(params)
        dbutils = DBUtils(
            widgets, FileSystem(self._opt.dbfs_root), NotebookWorkflow(run_child), Secrets(self._opt.environ)
        )
        ns: dict[str, Any] = {
            "__name__": "__main__",
            "spark": self._spark,
            "sc": self._spark.sparkContext,
            "dbutils": dbutils,
            "display": self._display,
            "displayHTML": self._display.html,
            "getArgument": widgets.getArgument,
        }
        timeout_type = type("_RunTimeout", (_CellTimeout,), {})
        started = time.monotonic()
        watchdog = _Watchdog(threading.get_ident(), deadline, timeout_type)
        self._opt.log(f"{nb.name}: {len(nb.cells)} cells")
        ran = [0]  # code cells run, %run-included ones too
        exit_value = None
        try:
            self._cells(nb, ns, deadline, depth, timeout_type, ran)
        except NotebookExit as stop:
            exit_value = stop.value
        finally:
            watchdog.disarm()
        seconds = time.monotonic() - started
        shown = (
            exit_value
            if exit_value is None or len(exit_value) <= LOG_VALUE_CHARS
            else exit_value[:LOG_VALUE_CHARS] + "..."
        )
        self._opt.log(
            f"{nb.name}: done in {seconds:.1f} s" + (f", exit value {shown}" if exit_value is not None else "")
        )
        return NotebookResult(nb.path, exit_value, ran[0], seconds, ns)

    def _cells(self, nb: Notebook, ns: dict, deadline: float, depth: int, timeout_type: type, ran: list[int]) -> None:
        cell = None
        try:
            for cell in nb.cells:
                if time.monotonic() > deadline:
                    raise timeout_type
                self._cell(nb, cell, ns, deadline, depth, timeout_type, ran)
        except timeout_type:
            where = f"cell {cell.number} ({cell.first_line})" if cell is not None else "before its first cell"
            raise _cell_failure(NotebookTimeout, nb, cell, f"the run's timeout passed in {where}") from None

    def _cell(
        self, nb: Notebook, cell: Cell, ns: dict, deadline: float, depth: int, timeout_type: type, ran: list[int]
    ) -> None:
        """Runs one cell, counting the code cells run in ran[0]."""
        if cell.kind == CellKind.MARKDOWN:
            return
        self._opt.log(f"{nb.name}: cell {cell.number}/{len(nb.cells)}: {cell.first_line[:100]}")
        if cell.kind == CellKind.PIP:
            ran[0] += self._pip(nb, cell, deadline, timeout_type)
            return
        if cell.kind == CellKind.RUN:
            args = cell.magic_args
            if len(args) != 1:
                raise self._refuse(
                    nb, cell, "%run takes one notebook path here (pass widget values with dbutils.notebook.run)"
                )
            if depth + 1 > self._opt.max_depth:
                raise self._refuse(nb, cell, f"notebooks nested more than {self._opt.max_depth} deep")
            try:
                included = read_notebook(resolve_path(args[0], os.path.dirname(os.path.abspath(nb.path))))
            except NotebookNotFoundError as exc:
                raise _not_found(nb, cell, exc) from None
            self._cells(included, ns, deadline, depth + 1, timeout_type, ran)
            return
        if cell.kind == CellKind.OTHER_MAGIC:
            raise self._refuse(nb, cell, "the local runner runs Python, %md, %run and %pip cells only")
        try:
            # Blank lines before the cell: tracebacks give the line numbers of the source file.
            code = compile("\n" * max(0, cell.line - 1) + cell.source, nb.path, "exec")
            exec(code, ns)  # noqa: S102 - running the notebook's cells is this module's purpose
        except NotebookExit:
            ran[0] += 1
            raise
        except NotebookNotFoundError as exc:
            if exc.cell is not None:  # a cell of a deeper notebook named no file: that notebook failed
                raise _cell_error(nb, cell, exc) from exc
            raise _not_found(nb, cell, exc, _cell_traceback(exc)) from exc  # this cell's notebook.run did
        except Exception as exc:  # noqa: BLE001 - any error of a cell ends the run, named by its cell
            raise _cell_error(nb, cell, exc) from exc
        except SystemExit as exc:
            raise _cell_error(nb, cell, exc) from None
        ran[0] += 1

    @staticmethod
    def _refuse(nb: Notebook, cell: Cell, why: str) -> NotebookError:
        return _cell_failure(NotebookError, nb, cell, f"cell {cell.number} ({cell.first_line}): {why}")

    def _pip(self, nb: Notebook, cell: Cell, deadline: float, timeout_type: type) -> int:
        if self._opt.skip_pip and not self._opt.allow_pip:
            self._opt.log(f"{nb.name}: skipped cell {cell.number}: {cell.first_line} (skip_pip)")
            return 0
        if not self._opt.allow_pip:
            raise self._refuse(nb, cell, f"%pip cells do not run by default: {PIP_HINT}")
        remaining = deadline - time.monotonic()
        cmd = [sys.executable, "-m", "pip", *cell.magic_args]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=None if remaining == math.inf else remaining
            )
        except subprocess.TimeoutExpired:
            raise timeout_type from None  # _cells reports it as the run's timeout in this cell
        print(proc.stdout, end="")
        if proc.returncode != 0:
            raise self._refuse(nb, cell, f"pip exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
        return 1


def local_spark(master: str = DEFAULT_MASTER) -> tuple[Any, bool]:
    """(session, created): the active SparkSession if there is one, else a new local one on ``master``
    bound to 127.0.0.1 whose Python workers run this interpreter (unless PYSPARK_PYTHON says otherwise)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    builder = (
        SparkSession.builder.master(master)
        .appName("sparkgrad-notebook")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if "PYSPARK_PYTHON" in os.environ:  # the user's choice of the workers' interpreter
        session = builder.getOrCreate()
    else:
        # The workers run this interpreter, as they do on Databricks (the notebook's own Python), also when
        # the runner was started by the console script's path without its venv on PATH. PySpark reads the
        # workers' interpreter from PYSPARK_PYTHON once, when the context starts (spark.pyspark.python is
        # read by spark-submit alone): set for that start, then taken back.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        try:
            session = builder.getOrCreate()
        finally:
            del os.environ["PYSPARK_PYTHON"]
    session.sparkContext.setLogLevel("ERROR")
    return session, True


def default_dbfs_root() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "sparkgrad", "dbfs")


def run_notebook(
    path: str,
    params: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    spark: Any = None,
    dbfs_root: str | None = None,
    allow_pip: bool = False,
    skip_pip: bool = False,
    run_dir: str | None = None,
    log: Callable[[str], None] | None = None,
    master: str = DEFAULT_MASTER,
    max_depth: int = MAX_DEPTH,
) -> NotebookResult:
    """Runs the Databricks notebook source file ``path`` on local Spark, cell by cell, in one namespace.

    The namespace has ``spark``, ``sc``, ``dbutils`` (a local one: widgets, fs, notebook, secrets from
    environment variables), ``display``, ``displayHTML`` and ``getArgument``. ``%md`` cells are skipped,
    ``%run ./other`` runs the other notebook's cells in the same namespace, ``dbutils.notebook.run``
    starts a child run; ``%pip`` cells are refused unless ``allow_pip`` or ``skip_pip``, and other
    magics (``%sh``, ``%sql``, ``%fs``, ...) are refused.

    ```python
    result = run_notebook("notebooks/02_scheduled_training_job.py", {"epochs": "1"}, timeout=600)
    print(result.exit_value)
    ```

    Args:
        path: The notebook: a Databricks source file, whose first line is ``# Databricks notebook source``.
        params: Widget values, as a job's parameters (every value a string); they override the
            notebook's widget defaults.
        timeout: Seconds the whole run may take, children included (> 0). When it passes, the running
            cell gets an exception at its next Python bytecode (a call blocked in C returns first).
        spark: The session to use; None takes the active one, else starts a local one on ``master``
            and stops it after the run.
        dbfs_root: The local folder that ``dbfs:/`` and ``/dbfs/`` name (default
            ``~/.cache/sparkgrad/dbfs``).
        allow_pip: Run ``%pip`` cells with pip in this interpreter.
        skip_pip: Report ``%pip`` cells and skip them.
        run_dir: Where ``display()`` saves matplotlib figures and ``displayHTML()`` its HTML (default: a new
            temporary folder); DataFrames are printed.
        log: Called with one line per cell as the run goes.
        master: Spark master of a session the runner starts (default ``local[4]``: a ps, two workers
            and a feeding slot).
        max_depth: Bound on the nesting of ``%run`` and ``dbutils.notebook.run``.

    Returns:
        The `NotebookResult`.

    Raises:
        InvalidArgumentError: ``timeout`` is not positive.
        NotebookError: A cell raised or used a refused magic; names the notebook, the cell number, its
            first line and the traceback (with the source file's line numbers).
        NotebookNotFoundError: No file at ``path`` (found before any Spark starts), or a missing
            ``%run`` or ``dbutils.notebook.run`` target (then naming the calling notebook and cell).
        NotebookTimeout: The run exceeded ``timeout``; names the notebook and the cell.
    """
    if not timeout > 0:
        raise InvalidArgumentError(f"timeout must be > 0 seconds, not {timeout}")
    nb = read_notebook(path)
    options = _Options(
        dbfs_root=os.path.abspath(dbfs_root or default_dbfs_root()),
        run_dir=run_dir or tempfile.mkdtemp(prefix="sparkgrad-notebook-"),
        allow_pip=allow_pip,
        skip_pip=skip_pip,
        log=log or (lambda line: None),
        environ=dict(os.environ),
        max_depth=max_depth,
    )
    os.makedirs(options.dbfs_root, exist_ok=True)
    session, own = local_spark(master) if spark is None else (spark, False)
    try:
        return _Runner(session, options).run(nb, dict(params or {}), time.monotonic() + float(timeout), 0)
    finally:
        if own:
            session.stop()
