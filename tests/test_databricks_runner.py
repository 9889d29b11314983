"""The local notebook runner (sparkgrad.databricks): source format, dbutils, magics, failures, timeouts."""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest
from sparkgrad.databricks.dbutils import FileSystem, Widgets
from sparkgrad.databricks.notebook import CellKind, from_ipynb, ipynb_text, parse_source, to_ipynb, to_source
from sparkgrad.errors import (
    InvalidArgumentError,
    NotebookError,
    NotebookNotFoundError,
    NotebookTimeout,
    SparkgradIOError,
)

SEP = "\n# COMMAND ----------\n"


def write_notebook(folder, name: str, *cells: str) -> str:
    path = os.path.join(folder, name + ".py")
    with open(path, "w") as f:
        f.write("# Databricks notebook source\n" + SEP.join(textwrap.dedent(c).strip("\n") for c in cells) + "\n")
    return path


@pytest.fixture()
def run(spark, tmp_path):
    from sparkgrad.databricks import run_notebook

    def go(path, params=None, timeout=60, **kw):
        kw.setdefault("dbfs_root", str(tmp_path / "dbfs"))
        return run_notebook(path, params, timeout, spark=spark, run_dir=str(tmp_path / "run"), **kw)

    return go


def test_source_format_splits_cells_and_tells_magics_apart():
    nb = parse_source(
        "# Databricks notebook source\nx = 1\n\n# COMMAND ----------\n\n# MAGIC %md\n# MAGIC # Title\n# MAGIC\n"
        "# MAGIC text\n\n# COMMAND ----------\n# MAGIC %pip install /Volumes/a/b.whl\n\n# COMMAND ----------\n"
        "# MAGIC %run ./other\n"
    )
    assert [c.kind for c in nb.cells] == [CellKind.PYTHON, CellKind.MARKDOWN, CellKind.PIP, CellKind.RUN]
    assert nb.cells[0].line == 2 and nb.cells[0].source == "x = 1"
    assert nb.cells[1].source == "%md\n# Title\n\ntext"
    assert nb.cells[3].magic_args == ["./other"]


def test_source_without_the_header_is_refused():
    with pytest.raises(InvalidArgumentError, match="not a Databricks notebook source"):
        parse_source("x = 1\n", "plain.py")


def test_ipynb_conversion_round_trips_and_is_deterministic():
    text = "# Databricks notebook source\na = 1\n\n# COMMAND ----------\n\n# MAGIC %md\n# MAGIC hi\n"
    nb = parse_source(text)
    data = to_ipynb(nb)
    assert [c["cell_type"] for c in data["cells"]] == ["code", "markdown"]
    assert data["cells"][1]["source"] == ["hi"]
    assert to_source(from_ipynb(json.loads(json.dumps(data)))) == text
    assert ipynb_text(parse_source(text)) == ipynb_text(from_ipynb(json.loads(ipynb_text(nb))))  # a fixed point


def test_widgets_take_job_parameters_over_defaults_and_only_strings():
    w = Widgets({"epochs": "3"})
    w.text("epochs", "1")
    w.text("lr", "0.1", "learning rate")
    w.dropdown("mode", "tensorflow", ["tensorflow", "spark"])
    assert (w.get("epochs"), w.get("lr"), w.get("mode")) == ("3", "0.1", "tensorflow")
    assert w.getArgument("missing", "d") == "d" and w.getAll()["epochs"] == "3"
    with pytest.raises(InvalidArgumentError, match="no widget named 'nope'"):
        w.get("nope")
    with pytest.raises(InvalidArgumentError, match="must be a string"):
        w.text("n", 1)
    with pytest.raises(InvalidArgumentError, match="must be a string"):
        Widgets({"epochs": 3})
    with pytest.raises(InvalidArgumentError, match="not one of its choices"):
        Widgets({"mode": "gpu"}).dropdown("mode", "spark", ["tensorflow", "spark"])


def test_fs_maps_dbfs_uris_and_fuse_paths_to_one_folder(tmp_path):
    fs = FileSystem(str(tmp_path / "dbfs"))
    assert fs.mkdirs("dbfs:/a/b")
    assert fs.put("dbfs:/a/b/x.txt", "hello")
    assert open(tmp_path / "dbfs/a/b/x.txt").read() == "hello"
    assert fs.head("/dbfs/a/b/x.txt", 4) == "hell"
    with pytest.raises(SparkgradIOError, match="exists"):
        fs.put("/a/b/x.txt", "again")
    assert fs.cp("/dbfs/a/b/x.txt", f"file:{tmp_path}/local/y.txt")
    assert open(tmp_path / "local/y.txt").read() == "hello"
    with pytest.raises(SparkgradIOError, match="recurse=True"):
        fs.cp("dbfs:/a", "dbfs:/c")
    assert fs.cp("dbfs:/a", "dbfs:/c", recurse=True)
    assert [f.name for f in fs.ls("dbfs:/c")] == ["b/"]
    assert [(f.path, f.size) for f in fs.ls("dbfs:/c/b")] == [("dbfs:/c/b/x.txt", 5)]
    assert fs.mv("dbfs:/c/b/x.txt", "/dbfs/d/z.txt")
    assert not (tmp_path / "dbfs/c/b/x.txt").exists() and (tmp_path / "dbfs/d/z.txt").exists()
    assert fs.rm("dbfs:/a", recurse=True) and not fs.rm("dbfs:/a")
    with pytest.raises(SparkgradIOError, match="no such file"):
        fs.ls("dbfs:/a")
    with pytest.raises(InvalidArgumentError, match="leaves the DBFS root"):
        fs.local_path("dbfs:/../escape")


@pytest.mark.spark
def test_cells_share_one_namespace_with_spark_and_ship_functions_to_executors(run, tmp_path):
    path = write_notebook(
        tmp_path,
        "nb",
        "def double(x):\n    return 2 * x",
        "# MAGIC %md\n# MAGIC this cell is not code",
        "total = sum(sc.parallelize([1, 2, 3], 2).map(double).collect())\ndisplay(spark.range(2))",
        "dbutils.notebook.exit(str(total))",
        "raise AssertionError('exit ends the notebook')",
    )
    result = run(path)
    assert result.exit_value == "12" and result.cells_run == 3


@pytest.mark.spark
def test_widgets_in_a_notebook_see_the_run_parameters_as_strings(run, tmp_path):
    path = write_notebook(
        tmp_path,
        "w",
        'dbutils.widgets.text("epochs", "1")\ndbutils.widgets.text("lr", "0.5")',
        'dbutils.notebook.exit(repr((dbutils.widgets.get("epochs"), getArgument("lr"))))',
    )
    assert run(path, {"epochs": "4"}).exit_value == "('4', '0.5')"


@pytest.mark.spark
def test_notebook_run_returns_the_child_exit_value_and_gives_it_its_own_widgets(run, tmp_path):
    write_notebook(
        tmp_path,
        "child",
        'dbutils.widgets.text("who", "nobody")',
        "assert 'secret_of_parent' not in globals()",
        'dbutils.notebook.exit("hello " + dbutils.widgets.get("who"))',
    )
    parent = write_notebook(
        tmp_path,
        "parent",
        "secret_of_parent = 1",
        'out = dbutils.notebook.run("./child", 30, {"who": "parent"})\ndefault = dbutils.notebook.run("child", 30)',
        "dbutils.notebook.exit(out + '|' + default)",
    )
    assert run(parent).exit_value == "hello parent|hello nobody"


@pytest.mark.spark
def test_secrets_come_from_environment_variables(run, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKGRAD_SECRET_MY_SCOPE_API_TOKEN", "s3cr3t")
    path = write_notebook(tmp_path, "s", 'dbutils.notebook.exit(dbutils.secrets.get("my-scope", "api.token"))')
    assert run(path).exit_value == "s3cr3t"
    missing = write_notebook(tmp_path, "m", 'dbutils.secrets.get("other", "key")')
    with pytest.raises(NotebookError, match="export SPARKGRAD_SECRET_OTHER_KEY"):
        run(missing)


@pytest.mark.spark
def test_percent_run_executes_the_other_notebook_in_the_same_namespace(run, tmp_path):
    os.makedirs(tmp_path / "lib")
    write_notebook(tmp_path / "lib", "helpers", "GREETING = 'hi'\ndef greet(n):\n    return f'{GREETING} {n}'")
    path = write_notebook(tmp_path, "main", "# MAGIC %run ./lib/helpers", "dbutils.notebook.exit(greet('there'))")
    assert run(path).exit_value == "hi there"


@pytest.mark.spark
def test_pip_cells_are_refused_with_a_clear_message_unless_skipped(run, tmp_path):
    path = write_notebook(
        tmp_path, "p", "# MAGIC %pip install /Volumes/x/sparkgrad.whl", "dbutils.notebook.exit('ran')"
    )
    with pytest.raises(
        NotebookError, match=r"cell 1 \(%pip install /Volumes/x/sparkgrad.whl\).*allow_pip=True"
    ) as info:
        run(path)
    assert info.value.cell == 1
    lines = []
    assert run(path, skip_pip=True, log=lines.append).exit_value == "ran"
    assert any("skipped cell 1: %pip install /Volumes/x/sparkgrad.whl" in x for x in lines)


@pytest.mark.spark
def test_a_failing_cell_names_its_number_first_line_and_traceback(run, tmp_path):
    path = write_notebook(tmp_path, "f", "x = 1", "# load the data\ny = {}\nvalue = y['missing']", "z = 3")
    with pytest.raises(NotebookError) as info:
        run(path)
    err = info.value
    assert (err.path, err.cell, err.first_line) == (path, 2, "# load the data")
    assert "KeyError: 'missing'" in err.remote_traceback
    assert f'File "{path}", line 6' in err.remote_traceback  # the line in the source file
    assert "cell 2 failed: # load the data" in str(err)
    syntax = write_notebook(tmp_path, "syntax", "x = 1", "def broken(:\n    pass")
    with pytest.raises(NotebookError, match=r"cell 2 failed: def broken\(:") as info:
        run(syntax)
    assert "SyntaxError" in info.value.remote_traceback


@pytest.mark.spark
def test_a_run_past_its_timeout_raises_naming_the_notebook_and_cell(run, tmp_path):
    path = write_notebook(tmp_path, "slow", "x = 1", "# spin\nwhile True:\n    x += 1")
    with pytest.raises(NotebookTimeout, match=r"slow.py: the run's timeout passed in cell 2 \(# spin\)"):
        run(path, timeout=1.0)


@pytest.mark.spark
def test_cli_notebook_run_prints_the_exit_value_and_reports_a_failing_cell(spark, tmp_path, capsys):
    from sparkgrad.cli import main

    ok = write_notebook(tmp_path, "ok", 'dbutils.widgets.text("n", "0")', "dbutils.notebook.exit(getArgument('n'))")
    root = ["--dbfs-root", str(tmp_path / "dbfs")]
    assert main(["notebook", "run", ok, "--param", "n=7", *root]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "7" and "ok: cell 2/2" in out.err
    bad = write_notebook(tmp_path, "bad", "1 / 0")
    assert main(["notebook", "run", bad, *root]) == 1
    err = capsys.readouterr().err
    assert "NotebookError" in err and "cell 1 failed: 1 / 0" in err and "ZeroDivisionError" in err


@pytest.mark.spark
def test_cli_pip_flags_run_skip_or_refuse_pip_cells(spark, tmp_path, capsys):
    from sparkgrad.cli import main

    root = ["--dbfs-root", str(tmp_path / "dbfs")]
    install = write_notebook(
        tmp_path, "install", "# MAGIC %pip install /Volumes/x/sparkgrad.whl", "dbutils.notebook.exit('ran')"
    )
    assert main(["notebook", "run", install, *root]) == 1
    err = capsys.readouterr().err
    assert "cell 1 (%pip install /Volumes/x/sparkgrad.whl): %pip cells do not run by default" in err
    assert "--allow-pip" in err
    assert main(["notebook", "run", install, "--skip-pip", *root]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "ran"
    assert "install: skipped cell 1: %pip install /Volumes/x/sparkgrad.whl (skip_pip)" in out.err
    version = write_notebook(tmp_path, "version", "# MAGIC %pip --version", "dbutils.notebook.exit('after pip')")
    assert main(["notebook", "run", version, "--allow-pip", *root]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^pip \d+\.\d+", out, re.M), out  # pip's own output, then the exit value
    assert out.splitlines()[-1] == "after pip"
    with pytest.raises(SystemExit) as info:
        main(["notebook", "run", version, "--allow-pip", "--skip-pip"])
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_cli_export_writes_the_ipynb_of_each_source_beside_it_or_in_out(tmp_path, capsys):
    from sparkgrad.cli import main

    a = write_notebook(tmp_path, "a", "x = 1", "# MAGIC %md\n# MAGIC # Title")
    b = write_notebook(tmp_path, "b", "# MAGIC %run ./a", "y = x")
    assert main(["notebook", "export", a, b]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "a.ipynb"), str(tmp_path / "b.ipynb")]
    out = tmp_path / "new" / "folder"  # created
    assert main(["notebook", "export", b, "--out", str(out)]) == 0
    assert capsys.readouterr().out.split() == [str(out / "b.ipynb")]
    for source, written in ((a, tmp_path / "a.ipynb"), (b, tmp_path / "b.ipynb"), (b, out / "b.ipynb")):
        with open(source) as f:
            assert written.read_text() == ipynb_text(parse_source(f.read(), source))
    assert [c["cell_type"] for c in json.loads((tmp_path / "a.ipynb").read_text())["cells"]] == ["code", "markdown"]
    assert json.loads((out / "b.ipynb").read_text())["cells"][0]["source"] == ["%run ./a"]
    missing = str(tmp_path / "gone.py")
    assert main(["notebook", "export", missing]) == 1
    assert f"NotebookNotFoundError: no notebook at {missing}" in capsys.readouterr().err


def test_a_missing_notebook_is_named_before_spark_starts_by_the_api_and_the_cli(tmp_path, capsys, monkeypatch):
    from sparkgrad.cli import main
    from sparkgrad.databricks import runner

    def no_spark(master):
        raise AssertionError("Spark started for a notebook that does not exist")

    monkeypatch.setattr(runner, "local_spark", no_spark)
    missing = str(tmp_path / "nope.py")
    with pytest.raises(NotebookNotFoundError, match=f"^no notebook at {re.escape(missing)} ") as info:
        runner.run_notebook(missing, dbfs_root=str(tmp_path / "dbfs"))
    assert (info.value.path, info.value.missing, info.value.cell) == (missing, missing, None)
    assert isinstance(info.value, NotebookError) and isinstance(info.value, OSError)
    assert main(["notebook", "run", missing, "--dbfs-root", str(tmp_path / "dbfs")]) == 1
    out = capsys.readouterr()
    assert f"sparkgrad notebook: NotebookNotFoundError: no notebook at {missing}" in out.err and out.out == ""
    assert not (tmp_path / "dbfs").exists()


@pytest.mark.spark
def test_notebook_run_and_percent_run_of_a_missing_notebook_name_it_and_the_calling_cell(run, tmp_path):
    caller = write_notebook(tmp_path, "caller", "x = 1", 'out = dbutils.notebook.run("./absent_child", 30)')
    with pytest.raises(NotebookNotFoundError) as info:
        run(caller)
    err, missing = info.value, str(tmp_path / "absent_child.py")
    assert (err.path, err.cell, err.missing) == (caller, 2, missing)
    assert str(err) == f'{caller}: cell 2 (out = dbutils.notebook.run("./absent_child", 30)): no notebook at {missing}'
    assert f'File "{caller}", line 4' in err.remote_traceback  # the caller's line
    includer = write_notebook(tmp_path, "includer", "x = 1", "y = 2", "# MAGIC %run ./lib/absent")
    with pytest.raises(NotebookNotFoundError) as info:
        run(includer)
    err, missing = info.value, str(tmp_path / "lib" / "absent.py")
    assert (err.path, err.cell, err.first_line, err.missing) == (includer, 3, "%run ./lib/absent", missing)
    assert str(err) == f"{includer}: cell 3 (%run ./lib/absent): no notebook at {missing}"
    # one level up, a child that failed so is the failing cell of its caller, as for any failing child
    top = write_notebook(tmp_path, "top", 'dbutils.notebook.run("./includer", 30)')
    with pytest.raises(NotebookError) as info:
        run(top)
    assert type(info.value) is NotebookError and (info.value.path, info.value.cell) == (top, 1)
    assert f"NotebookNotFoundError: {includer}: cell 3 (%run ./lib/absent)" in info.value.remote_traceback


def test_committed_ipynb_copies_equal_what_their_sources_generate():
    """notebooks/*.ipynb are generated: `sparkgrad notebook export notebooks/*.py` after editing a source."""
    import glob

    from sparkgrad.databricks.notebook import ipynb_text, read_notebook

    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")
    sources = sorted(glob.glob(os.path.join(folder, "*.py")))
    assert len(sources) == 9
    assert sorted(glob.glob(os.path.join(folder, "*.ipynb"))) == [s[:-3] + ".ipynb" for s in sources]
    for source in sources:
        nb = read_notebook(source)
        with open(source[:-3] + ".ipynb", encoding="utf-8") as f:
            committed = f.read()
        assert committed == ipynb_text(nb), f"{source}: run sparkgrad notebook export {source}"
        assert [(c.kind, c.source) for c in from_ipynb(json.loads(committed)).cells] == [
            (c.kind, c.source) for c in nb.cells
        ]


@pytest.mark.spark
def test_a_failing_child_notebook_fails_the_parent_cell_that_ran_it(run, tmp_path):
    write_notebook(tmp_path, "broken", "x = 1", "raise ValueError('bad input')")
    parent = write_notebook(tmp_path, "caller", 'dbutils.notebook.run("./broken", 30)')
    with pytest.raises(NotebookError) as info:
        run(parent)
    assert info.value.cell == 1 and info.value.path == parent
    assert "broken.py: cell 2 failed: raise ValueError('bad input')" in info.value.remote_traceback


@pytest.mark.spark
def test_notebooks_that_include_themselves_stop_at_the_nesting_bound(run, tmp_path):
    path = write_notebook(tmp_path, "loop", "# MAGIC %run ./loop")
    with pytest.raises(NotebookError, match="nested more than 3 deep"):
        run(path, max_depth=3)


@pytest.mark.spark
def test_allow_pip_runs_pip_cells_in_this_python(run, tmp_path, capsys):
    path = write_notebook(tmp_path, "pipv", "# MAGIC %pip --version")
    assert run(path, allow_pip=True).cells_run == 1
    assert "pip " in capsys.readouterr().out


@pytest.mark.spark
def test_display_saves_figures_in_the_run_folder_and_shows_dataframe_rows(run, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = write_notebook(
        tmp_path,
        "disp",
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nfig = plt.figure()\ndisplay(fig)",
        "display(spark.createDataFrame([(1, 'a')], 'n long, s string'))",
    )
    run(path)
    assert (tmp_path / "run" / "display-001.png").is_file()
    out = capsys.readouterr().out
    assert "display-001.png" in out and "|1  |a  |" in out


@pytest.mark.spark
def test_console_script_run_by_its_path_gives_spark_workers_its_own_interpreter(tmp_path):
    """`.venv/bin/sparkgrad notebook run X` with no venv on PATH and no PYSPARK_PYTHON: the tasks run the
    script's interpreter (PySpark would otherwise start `python3` from PATH, which has no sparkgrad)."""
    import subprocess
    import sys

    nb = write_notebook(
        tmp_path,
        "where",
        "import sys\nrows = sc.parallelize([0], 1).map(lambda _: sys.executable).collect()",
        "import sparkgrad\nsc.parallelize([0], 1).map(lambda _: __import__('sparkgrad').__version__).collect()",
        "dbutils.notebook.exit(rows[0])",
    )
    script = tmp_path / "bin" / "sparkgrad"  # what pip writes for [project.scripts], with this venv's Python
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom sparkgrad.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if not p.startswith(sys.prefix)
    )
    proc = subprocess.run(
        [str(script), "notebook", "run", nb, "--dbfs-root", str(tmp_path / "dbfs"), "--timeout", "120"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == sys.executable


@pytest.mark.spark
def test_a_shipped_notebook_run_before_its_input_exists_names_the_step_that_writes_it(run, tmp_path):
    """notebooks/02 run before notebooks/10_prep: the error names 10_prep, not only the missing folder."""
    from sparkgrad.errors import InputNotFoundError

    notebooks = os.path.join(os.path.dirname(__file__), "..", "notebooks")
    with pytest.raises(NotebookError) as info:
        run(os.path.join(notebooks, "02_scheduled_training_job.py"), {"data_path": "dbfs:/nothing/here"})
    text = str(info.value)
    assert "InputNotFoundError: dbfs:/nothing/here does not exist: it is written by notebooks/10_prep" in (
        info.value.remote_traceback
    ), text
    (tmp_path / "dbfs" / "empty").mkdir(parents=True)
    with pytest.raises(NotebookError) as info:
        run(os.path.join(notebooks, "12_evaluate.py"), {"input_data": "dbfs:/x", "test_data": "dbfs:/empty"})
    assert "dbfs:/x/model does not exist: it is written by notebooks/11_train" in info.value.remote_traceback
    assert issubclass(InputNotFoundError, FileNotFoundError)


def test_require_input_lists_the_input_or_names_what_writes_it(tmp_path):
    from sparkgrad.databricks import require_input
    from sparkgrad.errors import InputNotFoundError

    class dbutils:  # noqa: N801 - the notebook's name for it
        fs = FileSystem(str(tmp_path / "dbfs"))

    with pytest.raises(InputNotFoundError, match=r"^dbfs:/in does not exist: it is written by step A; run that first$"):
        require_input(dbutils, "dbfs:/in", "step A")
    (tmp_path / "dbfs" / "in").mkdir(parents=True)
    with pytest.raises(InputNotFoundError, match=r"^dbfs:/in is empty: it is written by step A") as info:
        require_input(dbutils, "dbfs:/in", "step A")
    assert (info.value.path, info.value.made_by) == ("dbfs:/in", "step A")
    (tmp_path / "dbfs" / "in" / "f").write_text("x")
    assert [e.name for e in require_input(dbutils, "dbfs:/in", "step A")] == ["f"]

    class Denied:  # any other failure of ls passes through unchanged
        class fs:  # noqa: N801
            @staticmethod
            def ls(path):
                raise PermissionError("denied")

    with pytest.raises(PermissionError, match="denied"):
        require_input(Denied, "dbfs:/in", "step A")
