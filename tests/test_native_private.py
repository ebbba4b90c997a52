"""Native libraries are never loaded from a foreign file: they are built in a private folder, their sha256
is recorded at build and checked before loading, and a planted library is refused with one line, rebuilt,
and its constructor never runs."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="no C compiler")

PAYLOAD = r"""
#include <stdio.h>
__attribute__((constructor)) static void pwn(void) { FILE *f = fopen("%s", "w"); if (f) fclose(f); }
void engine_step_dummy(void) {}
"""


def _py(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)


def test_a_planted_library_is_refused_rebuilt_and_never_run(tmp_path):
    cache = tmp_path / "cache"
    env = {"HYBRIDSPEC_CACHE_DIR": str(cache)}
    where = _py("from sim.engine.native import library_path; print(library_path('engine_step'))", env)
    assert where.returncode == 0, where.stderr
    so = Path(where.stdout.strip())
    assert so.parent == cache / "native" and stat.S_IMODE(so.parent.stat().st_mode) == 0o700
    marker = tmp_path / "PWNED"
    c = tmp_path / "p.c"
    c.write_text(PAYLOAD % marker)
    subprocess.run([os.environ.get("CC") or "cc", "-shared", "-fPIC", "-o", str(so), str(c)], check=True)
    got = _py("import warnings; warnings.simplefilter('always')\n"
              "from sim.engine.native import load; print(load('engine_step') is not None)", env)
    assert got.returncode == 0, got.stderr
    assert not marker.exists(), "the planted library's constructor ran"
    assert got.stdout.strip() == "True"
    assert [ln for ln in got.stderr.splitlines() if "refusing native library" in ln], got.stderr
    assert (so.with_name(so.name + ".sha256")).is_file()
    again = _py("from sim.engine.native import load; print(load('engine_step') is not None)", env)
    assert again.stdout.strip() == "True" and "refusing" not in again.stderr  # the rebuilt one is served


def test_a_library_without_its_build_record_is_rebuilt(tmp_path):
    env = {"HYBRIDSPEC_CACHE_DIR": str(tmp_path / "c")}
    assert _py("from sim.engine.native import load; assert load('engine_step')", env).returncode == 0
    rec = next((tmp_path / "c" / "native").glob("engine_step-*.so.sha256"))
    rec.unlink()
    got = _py("from sim.engine.native import load; assert load('engine_step')", env)
    assert got.returncode == 0 and "refusing native library" in got.stderr and rec.is_file()


def test_a_folder_open_to_others_is_closed_and_anothers_folder_refused(tmp_path):
    from sim.infra.errors import ConfigError
    from sim.infra.fsio import private_dir

    d = tmp_path / "open"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    private_dir(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    if os.getuid() == 0:  # only root can make a folder another user's
        os.chown(d, 65534, 65534)
        with pytest.raises(ConfigError, match="owned by another user"):
            private_dir(d)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "open")
    with pytest.raises(ConfigError, match="link"):
        private_dir(link)


def test_with_the_cache_off_the_libraries_never_go_to_the_shared_temp_folder():
    got = _py("from sim.engine.native import load, native_dir; import stat, os\n"
              "assert load('engine_step'); d = native_dir(); print(d, oct(stat.S_IMODE(os.stat(d).st_mode)))",
              {"HYBRIDSPEC_CACHE_DIR": "off"})
    assert got.returncode == 0, got.stderr
    folder, mode = got.stdout.split()
    assert mode == "0o700"
    assert not Path(folder).is_relative_to(Path(tempfile.gettempdir()) / "hybridspec")
    assert not Path(folder).exists(), "the per-process folder is removed at exit"
