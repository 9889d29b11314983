"""The release artifacts install and run as Databricks users install them.

The wheel and egg tests take the artifacts of `make wheel` / `make egg` from
SPARKGRAD_DIST (set by `make wheel-smoke`, which builds them first) and skip
without it; the import-error test of a source build runs in every `make test`.
Each installs into a fresh venv of the matching CPython (pyenv's), never into
the test's own environment.
"""

from __future__ import annotations

import email.parser
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DIST = os.environ.get("SPARKGRAD_DIST")
WHEEL_PYTHONS = ("3.10", "3.11", "3.12")
EGG_PYTHONS = ("3.10", "3.11")
# The oldest NumPy each egg's Python has wheels of: 1.21.5 is Databricks 13.3 LTS's own.
OLD_NUMPY = {"3.10": "numpy==1.21.5", "3.11": "numpy==1.23.5"}
needs_dist = pytest.mark.skipif(not DIST, reason="needs the built wheels and eggs: run by make wheel-smoke")
pytestmark = pytest.mark.timeout(900)

# Trains a few steps of the HorovodRunner CNN (conv + pooling: oneDNN runs its
# OpenMP threads) and the walkthrough MLP, then reports what the process mapped.
TRAIN_AND_REPORT = r"""
import json, os, sys
import numpy as np
import sparkgrad
from sparkgrad.nn import SGD, models
rng = np.random.default_rng(0)
losses = []
for model, shape in ((models.walkthrough_mlp(seed=1), (256, 784)), (models.horovod_cnn(seed=1), (64, 28, 28, 1))):
    model.compile(optimizer=SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x = rng.random(shape, dtype=np.float32)
    y = (x.reshape(shape[0], -1).mean(axis=1) * 1000).astype(np.int64) % 10
    first = model.train_on_batch(x, y)[0]
    for _ in range(8):
        last = model.train_on_batch(x, y)[0]
    losses.append((float(first), float(last)))
maps = [line.split()[-1] for line in open("/proc/self/maps") if ".so" in line]
print(json.dumps({
    "losses": losses,
    "layout": sparkgrad._native.layout(),
    "info": sparkgrad.build_info(),
    "mapped": sorted(set(maps)),
    "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("tqdm", "onednn", "pkg_resources")),
}))
"""


def _wheels_module():
    spec = importlib.util.spec_from_file_location("sparkgrad_ci_wheels", ROOT / ".ci" / "wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tag(version: str) -> str:
    return "cp" + version.replace(".", "")


def _artifact(pattern: str) -> pathlib.Path:
    found = sorted(pathlib.Path(DIST or ".").glob(pattern))
    assert found, f"no {pattern} in {DIST}: make wheel / make egg should have built it"
    return found[-1]


def _venv(tmp_path: pathlib.Path, version: str, *packages: str) -> pathlib.Path:
    """A fresh venv of CPython ``version`` with ``packages`` installed; returns its python."""
    venv = tmp_path / f"venv{version}"
    python = _wheels_module().find_interpreter(version)
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300, env=_clean_env())
    py = venv / "bin" / "python"
    if packages:
        cmd = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages]
        subprocess.run(cmd, check=True, timeout=600, env=_clean_env())
    return py


def _clean_env(**env: str) -> dict[str, str]:
    """The environment without PYTHONPATH: the tree's sparkgrad must not stand in for the installed one."""
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    clean.update(env)
    return clean


def _run(py: pathlib.Path, code: str, cwd: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
    clean = _clean_env(**env)
    return subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=cwd, env=clean, timeout=300)


def _openmp_runtimes(mapped: list[str]) -> list[str]:
    return [p for p in mapped if re.match(r"lib(gomp|iomp5|omp)\b", os.path.basename(p))]


def _report(proc: subprocess.CompletedProcess) -> dict:
    import json

    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_dist
@pytest.mark.parametrize("version", WHEEL_PYTHONS)
def test_wheel_is_manylinux_with_its_native_libraries_vendored(version):
    wheel = _artifact(f"sparkgrad-*-{_tag(version)}-{_tag(version)}-manylinux_*_x86_64.whl")
    glibc = tuple(int(x) for x in re.search(r"manylinux_(\d+)_(\d+)_x86_64", wheel.name).groups())
    assert glibc <= (2, 35), wheel.name  # installs on Ubuntu 22.04 (DBR 13.3-15.4) and later
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        meta = email.parser.Parser().parsestr(whl.read(next(n for n in names if n.endswith("/METADATA"))).decode())
    libs = sorted(os.path.basename(n) for n in names if n.startswith("sparkgrad.libs/"))
    for stem in ("libdnnl-", "libgomp-", "libcjson-", "libcrypto-", "libisal-", "libfarmhash-"):
        assert any(lib.startswith(stem) for lib in libs), (stem, libs)
    requires = meta.get_all("Requires-Dist") or []
    assert not any(r.startswith("onednn") for r in requires), requires  # carried, not depended on
    assert meta["Requires-Python"] == ">=3.10"
    show = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True, timeout=300
    )
    assert show.returncode == 0, show.stderr
    flat = " ".join(show.stdout.split())
    assert f'consistent with the following platform tag: "manylinux_{glibc[0]}_{glibc[1]}_x86_64"' in flat


@needs_dist
@pytest.mark.parametrize("version", WHEEL_PYTHONS)
def test_wheel_installs_in_a_fresh_venv_and_maps_one_openmp_runtime(tmp_path, version):
    wheel = _artifact(f"sparkgrad-*-{_tag(version)}-{_tag(version)}-manylinux_*_x86_64.whl")
    py = _venv(tmp_path, version, str(wheel))
    report = _report(_run(py, TRAIN_AND_REPORT, tmp_path))
    for first, last in report["losses"]:
        assert last < first
    assert report["layout"] == "wheel"
    runtimes = _openmp_runtimes(report["mapped"])
    assert len(runtimes) == 1 and "/sparkgrad.libs/libgomp-" in runtimes[0], runtimes
    dnnl = [p for p in report["mapped"] if os.path.basename(p).startswith("libdnnl")]
    assert len(dnnl) == 1 and "/sparkgrad.libs/" in dnnl[0], dnnl
    assert "onednn" not in report["modules"]
    pip_list = subprocess.run(
        [str(py), "-m", "pip", "list"], capture_output=True, text=True, timeout=120, env=_clean_env()
    ).stdout
    assert "onednn" not in pip_list.lower()  # the wheel carries oneDNN; nothing pulled in a second copy
    info = subprocess.run(
        [str(py.parent / "sparkgrad"), "info"], capture_output=True, text=True, timeout=120, env=_clean_env()
    )
    assert info.returncode == 0 and '"layout": "wheel"' in info.stdout, info.stderr


@needs_dist
def test_wheel_is_refused_by_pip_where_it_cannot_run(tmp_path):
    """Python 3.9, aarch64 and Ubuntu 20.04's glibc 2.31: pip says no; Ubuntu 22.04's glibc 2.35 is accepted."""
    wheel = _artifact("sparkgrad-*-cp311-cp311-manylinux_*_x86_64.whl")

    def glibc_up_to(minor: int, arch: str = "x86_64") -> list[str]:
        """The platform tags pip accepts on a machine with glibc 2.<minor> (each given with --platform)."""
        return [f"manylinux_2_{m}_{arch}" for m in range(17, minor + 1)]

    def dry_run(python_version: str, platforms: list[str]) -> subprocess.CompletedProcess:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            python_version,
            "--target",
            str(tmp_path / "target"),
        ]
        cmd += [arg for p in platforms for arg in ("--platform", p)] + [str(wheel)]  # fmt: skip
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_clean_env())

    accepted = dry_run("3.11", glibc_up_to(35))  # Databricks 13.3-15.4 LTS: Ubuntu 22.04
    assert accepted.returncode == 0, accepted.stderr
    for python_version, platforms in (
        ("3.9", glibc_up_to(35)),
        ("3.11", glibc_up_to(35, "aarch64")),
        ("3.11", glibc_up_to(31)),  # Ubuntu 20.04 (Databricks 12.2 LTS and older)
    ):
        refused = dry_run(python_version, platforms)
        assert refused.returncode != 0, (python_version, platforms[-1])
        assert "is not a supported wheel on this platform" in refused.stderr, refused.stderr


@needs_dist
def test_wheel_with_a_vendored_library_missing_names_it_and_the_fix(tmp_path):
    wheel = _artifact("sparkgrad-*-cp311-cp311-manylinux_*_x86_64.whl")
    py = _venv(tmp_path, "3.11", str(wheel))
    site = pathlib.Path(_run(py, "import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))", tmp_path)
                        .stdout.strip())  # fmt: skip
    (gomp,) = (site / "sparkgrad.libs").glob("libgomp-*")
    gomp.unlink()
    proc = _run(py, "import sparkgrad", tmp_path)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sparkgrad.errors.NativeLibraryError: "), proc.stderr
    assert gomp.name in last and "_core" in last and "reinstall sparkgrad" in last, last


def test_source_build_without_onednn_names_libdnnl_and_the_pip_package(tmp_path):
    """A local build whose onednn-cpu-gomp wheel is not installed: one NativeLibraryError with the fix."""
    import numpy

    site = tmp_path / "site"
    site.mkdir()
    numpy_dir = pathlib.Path(numpy.__file__).parent
    for path in [numpy_dir, *numpy_dir.parent.glob("numpy.libs")]:
        (site / path.name).symlink_to(path)
    # -S: no site-packages (so no onednn-cpu-gomp); NumPy and the tree come from PYTHONPATH.
    code = "import sparkgrad"
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{ROOT / 'python'}")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sparkgrad.errors.NativeLibraryError: "), proc.stderr
    assert "libdnnl.so.3 was not found" in last and "pip install onednn-cpu-gomp==2023.2.0" in last, last
    assert "_core.cpython-" in last


@needs_dist
@pytest.mark.parametrize("version", EGG_PYTHONS)
def test_egg_imports_and_trains_with_nothing_but_numpy(tmp_path, version):
    """The egg on sys.path of a venv holding an old NumPy only (no tqdm, no oneDNN, no setuptools' pkg_resources)."""
    egg = _artifact(f"sparkgrad-*-py{version}-linux-x86_64.egg")
    py = _venv(tmp_path, version, OLD_NUMPY[version])
    cache = tmp_path / "extracted"
    code = f"import sys; sys.path.insert(0, {str(egg)!r})\n" + TRAIN_AND_REPORT
    # Four Python workers of one executor importing at once into an empty cache: one extraction serves all.
    procs = [
        subprocess.Popen(
            [str(py), "-c", code],
            cwd=tmp_path,
            env=_clean_env(SPARKGRAD_EXTRACT_DIR=str(cache)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(4)
    ]
    outputs = [(p, *p.communicate(timeout=300)) for p in procs]
    reports = [_report(subprocess.CompletedProcess(p.args, p.returncode, out, err)) for p, out, err in outputs]
    for report in reports:
        for first, last in report["losses"]:
            assert last < first
        assert report["layout"] == "egg" and report["modules"] == []
    entries = sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
    assert len(entries) == 1 and entries[0].startswith(egg.name + "-"), entries
    extracted = cache / entries[0]
    runtimes = _openmp_runtimes(reports[0]["mapped"])
    assert len(runtimes) == 1 and runtimes[0].startswith(str(extracted / "sparkgrad.libs")), runtimes
    assert any(p.startswith(str(extracted / "sparkgrad" / "_core.")) for p in reports[0]["mapped"])
    assert not [p.name for p in cache.iterdir() if p.name.startswith(".extract-")]  # no staging left behind
    # A cleaner removed a library: the next start notices, extracts again (the old copy moved aside) and runs.
    gomp = next((extracted / "sparkgrad.libs").glob("libgomp-*"))
    gomp.unlink()
    again = _report(_run(py, code, tmp_path, SPARKGRAD_EXTRACT_DIR=str(cache)))
    assert again["layout"] == "egg" and gomp.exists()
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == entries


@needs_dist
def test_egg_for_another_python_says_which_egg_to_attach(tmp_path):
    egg = _artifact("sparkgrad-*-py3.10-linux-x86_64.egg")
    py = _venv(tmp_path, "3.11", "numpy==1.26.4")
    proc = _run(py, f"import sys; sys.path.insert(0, {str(egg)!r}); import sparkgrad", tmp_path,
                SPARKGRAD_EXTRACT_DIR=str(tmp_path / "x"))  # fmt: skip
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sparkgrad.errors.NativeLibraryError: "), proc.stderr
    assert "_core.cpython-310-x86_64-linux-gnu.so" in last and "py3.11-linux-x86_64.egg" in last, last


def test_source_build_with_a_broken_onednn_says_so_instead_of_an_oserror(tmp_path):
    """The onednn-cpu-gomp wheel's library exists but cannot load: NativeLibraryError, not ctypes' OSError."""
    import numpy

    site = tmp_path / "site"
    (site / "onednn_cpu_gomp-2023.2.0.dist-info").mkdir(parents=True)
    (site / "lib").mkdir()
    (site / "lib" / "libdnnl.so.3").write_bytes(b"not an ELF file")
    (site / "onednn_cpu_gomp-2023.2.0.dist-info" / "RECORD").write_text("lib/libdnnl.so.3,,15\n")
    numpy_dir = pathlib.Path(numpy.__file__).parent
    for path in [numpy_dir, *numpy_dir.parent.glob("numpy.libs")]:
        (site / path.name).symlink_to(path)
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{ROOT / 'python'}")
    proc = subprocess.run(
        [sys.executable, "-S", "-c", "import sparkgrad"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sparkgrad.errors.NativeLibraryError: "), proc.stderr
    assert str(site / "lib" / "libdnnl.so.3") in last and "could not be loaded" in last, last
