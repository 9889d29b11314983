"""The package builds, imports, reports its versions and maps C errors."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
import sparkgrad
from sparkgrad import _core, errors
from sparkgrad.cli import main as cli_main

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_version_has_one_source():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    text = (ROOT / "python/sparkgrad/_version.py").read_text()
    assert f'__version__ = "{sparkgrad.__version__}"' in text
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in pyproject["project"]["dynamic"]
    assert "version" not in pyproject["project"]
    assert _core.build_info()["sparkgrad"] == sparkgrad.__version__


def test_build_info_names_linked_libraries():
    info = sparkgrad.build_info()
    assert info["onednn"].startswith("3.")
    assert info["onednn_cpu_runtime"] == "OpenMP"
    assert re.match(r"\d+\.\d+\.\d+", info["libcurl"])
    assert re.match(r"\d+\.\d+\.\d+", info["cjson"])
    assert re.match(r"\d+\.\d+", info["zlib"])


def test_every_status_code_maps_to_an_exception_in_the_hierarchy():
    codes = _core.status_codes()
    assert len(codes) == len(set(codes.values()))
    for name, code in codes.items():
        cls = getattr(errors, name)
        assert issubclass(cls, errors.SparkgradError)
        if code == -1:  # SG_ENOMEM is raised as MemoryError
            with pytest.raises(MemoryError):
                _core._raise_status(code, "x")
            continue
        with pytest.raises(cls) as info:
            _core._raise_status(code, f"message for {name}")
        assert type(info.value) is cls
        assert info.value.code == code
        assert str(info.value) == f"message for {name}"


def test_hierarchy_matches_the_documented_tree():
    assert issubclass(errors.TruncatedRecordError, errors.CorruptRecordError)
    assert issubclass(errors.CorruptRecordError, errors.RecordError)
    assert issubclass(errors.RendezvousTimeout, errors.ClusterError)
    assert issubclass(errors.RendezvousTimeout, TimeoutError)
    assert issubclass(errors.NodeFailure, errors.ClusterError)
    assert issubclass(errors.AuthError, errors.ProtocolError)
    assert issubclass(errors.SchemaError, ValueError)
    assert issubclass(errors.RestError, errors.SparkgradError)


def test_module_docstring_tree_names_every_exception_under_its_parent():
    lines = [ln for ln in errors.__doc__.splitlines() if ln.startswith("    ")]  # the indented tree
    tree = {}  # name -> the name one level up
    stack: list[tuple[int, str]] = []
    for ln in lines:
        m = re.match(r"^(\s*(?:[│ ]   )*)(?:[├└]── )?(\w+)", ln)
        if not m or not m.group(2)[0].isupper():
            continue
        depth = len(m.group(1)) + (4 if "──" in ln else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        tree[m.group(2)] = stack[-1][1] if stack else None
        stack.append((depth, m.group(2)))
    assert set(tree) == set(errors.__all__)
    for name, parent in tree.items():
        if parent is not None:
            assert getattr(errors, parent) in getattr(errors, name).__bases__, f"{name} is not under {parent}"


def test_unknown_status_code_raises_the_root_class():
    with pytest.raises(errors.SparkgradError) as info:
        _core._raise_status(-999, "odd")
    assert type(info.value) is errors.SparkgradError


def test_error_details_become_attributes():
    exc = errors.CorruptRecordError("bad crc", path="a.tfrecord", offset=12)
    assert exc.path == "a.tfrecord" and exc.offset == 12
    assert exc.details == {"path": "a.tfrecord", "offset": 12}


def test_cli_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli_main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"sparkgrad {sparkgrad.__version__}"


def test_python_dash_m_sparkgrad_info():
    out = subprocess.run(
        [sys.executable, "-m", "sparkgrad", "info"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert '"onednn"' in out and '"sparkgrad"' in out


@pytest.mark.slow
@pytest.mark.parametrize("numpy_spec", ["numpy==1.26.4", "numpy>=2.0,<3"])
def test_core_imports_under_numpy_1_and_2(tmp_path, numpy_spec):
    """The extension is built against NumPy 2 headers; it must load under 1.x too."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", numpy_spec, "onednn-cpu-gomp==2023.2.0"],
        check=True,
        timeout=600,
    )
    code = (
        "import numpy, sparkgrad, sparkgrad._core as c; "
        "info = c.build_info(); "
        "print(numpy.__version__, info['numpy_runtime_api'])"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    version = out.stdout.split()[0]
    assert version.startswith("1.") if numpy_spec.startswith("numpy==1") else version.startswith("2.")


def test_import_on_an_executor_path_stays_light(tmp_path):
    """What every Spark task of a cluster pays before its node registers.

    Spark's Python workers start with pyspark.zip, py4j's zip and a Spark jar
    on sys.path; finding oneDNN through importlib.metadata listed every member
    of those archives (0.1-0.2 s per node). libcurl, needed only for REST
    calls, is opened when first used rather than at import. A node sets its
    thread count before it registers without importing sparkgrad.nn (a ps
    thread of the driver would hold the GIL for it while Spark's job is
    submitted).
    """
    archive = tmp_path / "spark-core.jar"
    import zipfile

    with zipfile.ZipFile(archive, "w") as z:
        for i in range(3000):
            z.writestr(f"org/apache/spark/C{i}.class", b"")
    code = (
        "import sys, sparkgrad, sparkgrad._core as c\n"
        "from sparkgrad._native import _onednn_path\n"
        "maps = open('/proc/self/maps').read()\n"
        "print('metadata' if 'importlib.metadata' in sys.modules else 'no-metadata')\n"
        "print('curl-at-import' if 'libcurl' in maps else 'no-curl-at-import')\n"
        "print(_onednn_path())\n"
        "print(c.build_info()['libcurl'])\n"
        "print('curl-after' if 'libcurl' in open('/proc/self/maps').read() else 'no-curl-after')\n"
        "import sparkgrad.cluster.node, sparkgrad._threads as t\n"
        "t.configure_threads(1)\n"
        "print('nn' if 'sparkgrad.nn' in sys.modules else 'no-nn')\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{archive}{os.pathsep}{ROOT / 'python'}")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    metadata, curl_at_import, onednn, curl_version, curl_after, nn = out.stdout.split("\n")[:6]
    assert nn == "no-nn"  # a node sets its thread count and registers without the network code
    assert metadata == "no-metadata"
    assert curl_at_import == "no-curl-at-import"
    assert re.match(r"\d+\.\d+\.\d+", curl_version) and curl_after == "curl-after"
    import importlib.metadata

    recorded = [f for f in importlib.metadata.distribution("onednn-cpu-gomp").files or [] if f.name == "libdnnl.so.3"]
    assert recorded and onednn == os.path.realpath(recorded[0].locate())


@pytest.mark.parametrize(
    ("info_dir", "ours"),
    [
        ("onednn_cpu_gomp-2023.2.0.dist-info", True),
        ("onednn-cpu-gomp-2023.2.0.dist-info", True),  # older installers kept the hyphens
        ("OneDNN_CPU_GOMP-2023.2.0.dist-info", True),
        ("onednn_devel_cpu_gomp-2023.2.0.dist-info", False),  # the headers' wheel: no library
        ("onednn_cpu_gomp-2023.2.0.egg-info", False),
        ("onednn_cpu_gomp_extra-1.0.dist-info", False),
    ],
)
def test_onednn_distribution_is_recognised_by_its_normalised_name(info_dir, ours):
    from sparkgrad._native import _is_distribution

    assert _is_distribution(info_dir) is ours


def _bench_report():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    return report


def _undated(text: str) -> str:
    """The dates come from git history, which a shallow clone does not have."""
    return re.sub(r"\d{4}-\d{2}-\d{2}", "DATE", text)


def test_performance_page_renders_the_committed_results():
    """docs/guide/performance.md's comparison tables are bench/report.py's rendering of bench/results/*.json."""
    report = _bench_report()
    page = report.PAGE.read_text()
    shown = page.split(report.START, 1)[1].split(report.END, 1)[0].strip()
    assert _undated(shown) == _undated(report.render()), (
        "docs/guide/performance.md differs from bench/results: run `python bench/report.py`"
    )
    for chart in re.findall(r"\]\((\.\./assets/bench/[^)]+\.png)\)", shown):  # every chart it shows is committed
        assert (report.PAGE.parent / chart).is_file(), f"{chart} is linked but absent: run `python bench/report.py`"


def test_readme_summary_renders_the_committed_results_and_links_to_the_page():
    """README.md's summary table is bench/report.py's rendering, and each link lands on a heading of the page."""
    report = _bench_report()
    readme = (ROOT / "README.md").read_text()
    shown = readme.split(report.SUMMARY_START, 1)[1].split(report.SUMMARY_END, 1)[0].strip()
    assert _undated(shown) == _undated(report.render_summary()), (
        "README.md's summary differs from bench/results: run `python bench/report.py`"
    )
    headings = {report._anchor_slug(h) for h in re.findall(r"^#+ (.+)$", report.PAGE.read_text(), re.M)}
    anchors = re.findall(r"\(docs/guide/performance\.md#([^)]+)\)", shown)
    assert len(anchors) == len(report.SUMMARY)
    assert set(anchors) <= headings, set(anchors) - headings


def test_report_refuses_a_summary_line_the_results_no_longer_have(monkeypatch):
    report = _bench_report()
    monkeypatch.setattr(report, "SUMMARY", (("train", "MLP, 9 threads", "sparkgrad", "torch"),))
    with pytest.raises(ValueError, match="no comparison 'MLP, 9 threads' of 'sparkgrad' against 'torch'"):
        report.render_summary()


def test_benches_write_the_committed_results_only_with_update():
    """A bench run by hand writes build/bench-results/; only --update (make bench) writes bench/results/."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchlib_t", ROOT / "bench" / "benchlib.py")
    benchlib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchlib)
    assert benchlib.results_file("train.json", update=True) == ROOT / "bench" / "results" / "train.json"
    assert benchlib.results_file("train.json", update=False) == ROOT / "build" / "bench-results" / "train.json"
    scripts = sorted((ROOT / "bench").glob("bench_*.py")) + [ROOT / "bench" / "accuracy_cnn.py"]
    for script in scripts:
        text = script.read_text()
        if "write_results(" not in text:
            continue
        assert "benchlib.add_update_flag(" in text, f"{script.name} takes no --update"
        assert not re.search(r"[\"']results[\"']\s*[/,]", text), f"{script.name} names bench/results itself"
    assert "--update" in re.search(r"^bench:.*?(?=^\S)", (ROOT / "Makefile").read_text(), re.M | re.S).group(0)


def test_results_readme_has_every_committed_row():
    """bench/results/README.md is bench/report.py's rendering of every row of bench/results/*.json."""
    report = _bench_report()
    assert _undated((ROOT / "bench" / "results" / "README.md").read_text()) == _undated(report.render_raw()), (
        "bench/results/README.md differs from bench/results/*.json: run `python bench/report.py`"
    )


def test_report_renders_rows_not_measured_and_medians_with_their_spread():
    report = _bench_report()
    reason = {"system": "horovod", "metric": "pip_install", "value": None, "unit": "", "reason": "cmake failed"}
    assert report._cell(reason) == "not measured: cmake failed"
    bare = {"system": "s", "metric": "m", "value": None, "unit": "timed out"}
    assert report._cell(bare) == "not measured: timed out"
    assert report._cell({"system": "s", "metric": "m", "value": None, "unit": ""}) == "not measured: no reason given"
    median = {"system": "s", "metric": "m", "value": 12.5, "unit": "s", "min": 11.0, "max": 14.25, "runs": 3}
    assert report._cell(median) == "12.5 (11–14.2)"
    assert report._cell({"system": "s", "metric": "m", "value": 1234, "unit": "x"}) == "1,234"
