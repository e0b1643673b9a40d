"""Finding librelaymoe.so: RELAYMOE_LIBRARY, RELAYMOE_PREFIX, pkg-config, in
that order, and a clear error when it is not there. Each case loads the
package in a child interpreter (loading does not start MPI)."""
import glob
import os
import subprocess
import sys

import pytest

PREFIX = os.environ["RELAYMOE_PREFIX"]  # set by tests/python/run.sh

PROBE = "import relaymoe; print(relaymoe.library_path())"
FAIL = """
import relaymoe
try:
    relaymoe.Context()
except relaymoe.LibraryNotFound as e:
    print("LibraryNotFound:", e)
"""


def child(code, **env):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("RELAYMOE_PREFIX", "RELAYMOE_LIBRARY", "PKG_CONFIG_PATH")}
    clean.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def installed_library():
    hits = glob.glob(os.path.join(PREFIX, "lib*", "librelaymoe.so")) + \
        glob.glob(os.path.join(PREFIX, "lib", "*", "librelaymoe.so"))
    assert hits, f"no librelaymoe.so under {PREFIX}"
    return hits[0]


def test_by_prefix():
    assert child(PROBE, RELAYMOE_PREFIX=PREFIX) == installed_library()


def test_by_path():
    assert child(PROBE, RELAYMOE_LIBRARY=installed_library()) == installed_library()


def test_by_pkg_config():
    pcdir = os.path.dirname(glob.glob(os.path.join(PREFIX, "**", "relaymoe.pc"), recursive=True)[0])
    if subprocess.run(["pkg-config", "--version"], capture_output=True).returncode != 0:
        pytest.skip("pkg-config missing")
    got = child(PROBE, PKG_CONFIG_PATH=pcdir)
    assert os.path.realpath(got) == os.path.realpath(installed_library())


def test_by_the_loader():
    # Nothing set but the loader's path: the soname, found by dlopen.
    libdir = os.path.dirname(installed_library())
    got = child(PROBE, LD_LIBRARY_PATH=libdir + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""))
    assert os.path.basename(got).startswith("librelaymoe.so"), got


@pytest.mark.parametrize("env, words", [
    (dict(RELAYMOE_LIBRARY="/nonexistent/librelaymoe.so"), ["RELAYMOE_LIBRARY=/nonexistent/librelaymoe.so"]),
    (dict(RELAYMOE_PREFIX="/nonexistent"), ["RELAYMOE_PREFIX=/nonexistent", "cmake --install"]),
])
def test_not_found(env, words):
    out = child(FAIL, **env)
    assert out.startswith("LibraryNotFound:"), out
    for word in words:
        assert word in out, out
