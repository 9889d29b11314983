"""Builds sparkgrad._core from csrc/ (metadata lives in pyproject.toml).

Environment knobs:
  SPARKGRAD_SANITIZE=1       build with ASan + UBSan (make asan)
  SPARKGRAD_DEBUG=1          -O0 -g
  SPARKGRAD_BUNDLED_LIBS=1   a release wheel (make wheel): auditwheel repair then
                             vendors oneDNN, so it is not declared a dependency
"""

import os
import pathlib
import re
import sys

from setuptools import Extension, setup

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / ".ci"))
import buildcfg  # noqa: E402

VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "python/sparkgrad/_version.py").read_text()).group(1)


def sources() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.c"))


def depends() -> list[str]:
    # Listed so that sdists carry the headers and the build configuration.
    headers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.h"))
    return headers + [".ci/buildcfg.py"]


def compile_args() -> list[str]:
    # -fno-math-errno: sqrtf without errno vectorises (the optimizers' loops); no value changes
    args = ["-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers", "-fvisibility=hidden", "-fopenmp",
            "-fno-math-errno"]  # fmt: skip
    if os.environ.get("SPARKGRAD_DEBUG") or os.environ.get("SPARKGRAD_SANITIZE"):
        args += ["-O1", "-g", "-fno-omit-frame-pointer"]
    else:
        args += ["-O3"]
    if os.environ.get("SPARKGRAD_SANITIZE"):
        args += ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
    return args


def link_args() -> list[str]:
    # The onednn-cpu-gomp wheel puts libdnnl.so.3 in <prefix>/lib; the
    # extension sits in <prefix>/lib/pythonX.Y/site-packages/sparkgrad/.
    args = ["-fopenmp", "-Wl,-rpath,$ORIGIN/../../.."]
    if os.environ.get("SPARKGRAD_SANITIZE"):
        args += ["-fsanitize=address,undefined"]
    return args


def numpy_include() -> str:
    import numpy

    return numpy.get_include()


core = Extension(
    "sparkgrad._core",
    sources=sources(),
    depends=depends(),
    include_dirs=["csrc", numpy_include(), buildcfg.onednn_include_dir()],
    library_dirs=[buildcfg.onednn_library_dir()],
    libraries=["dnnl"] + buildcfg.system_libs(),
    define_macros=[("SG_VERSION", f'"{VERSION}"'), ("_GNU_SOURCE", "1")] + buildcfg.define_macros(),
    extra_compile_args=compile_args(),
    extra_link_args=link_args(),
)

bundled = os.environ.get("SPARKGRAD_BUNDLED_LIBS", "") not in ("", "0")
setup(ext_modules=[core], install_requires=buildcfg.install_requires(bundled))
