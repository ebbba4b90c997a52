"""The on-disk draft-table cache (sim.core.drafters.cache): a hit serves exactly the built tables, every input
changes the key, a corrupt or truncated file is rebuilt with a warning (never served), writes are atomic."""
import dataclasses

import numpy as np
import pytest

from conftest import plausible_calibrator, random_requests
from sim.core.drafters import cache
from sim.core.drafters.model import ModelDrafterProfile
from sim.core.drafters.ngram import NgramConfig
from sim.core.drafters.tables import build_draft_tables

CFG = NgramConfig(n_min=1, n_max=3, k=6, ext_max=16)
PROFILE = ModelDrafterProfile(name="t", block=4)


def _inputs(seed=0):
    return random_requests(np.random.default_rng(seed), 6), CFG, PROFILE, plausible_calibrator(CFG)


def _same(a, b):
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


@pytest.fixture
def cdir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    return tmp_path / "draft-tables"


def test_hit_serves_the_built_tables(cdir, monkeypatch):
    reqs, cfg, prof, cal = _inputs()
    want = build_draft_tables(reqs, cfg, prof, cal, seed=3)
    _same(cache.cached_draft_tables(reqs, cfg, prof, cal, seed=3), want)
    files = list(cdir.iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz"  # no temporary file left behind

    def boom(*a, **k):
        raise AssertionError("rebuilt on a hit")

    monkeypatch.setattr(cache, "build_draft_tables", boom)
    _same(cache.cached_draft_tables(reqs, cfg, prof, cal, seed=3), want)


def test_every_input_changes_the_key():
    reqs, cfg, prof, cal = _inputs()
    base = cache.table_key(reqs, cfg, prof, cal, 0, None)
    assert cache.table_key(reqs, cfg, prof, cal, 0, None) == base
    other = random_requests(np.random.default_rng(0), 6)
    other[2].output_ids = other[2].output_ids.copy()
    other[2].output_ids[0] += 1
    temp = random_requests(np.random.default_rng(0), 6)
    temp[0].temperature = 0.5
    cal2 = plausible_calibrator(cfg)
    cal2.weights = cal2.weights.copy()
    cal2.weights[0] += 1e-9
    keys = [cache.table_key(reqs, cfg, prof, cal, 1, None),
            cache.table_key(reqs[:-1], cfg, prof, cal, 0, None),
            cache.table_key(other, cfg, prof, cal, 0, None),
            cache.table_key(temp, cfg, prof, cal, 0, None),
            cache.table_key(reqs, dataclasses.replace(cfg, k=7), prof, cal, 0, None),
            cache.table_key(reqs, cfg, dataclasses.replace(prof, sigma=0.81), cal, 0, None),
            cache.table_key(reqs, cfg, prof, cal2, 0, None)]
    assert len(set(keys + [base])) == len(keys) + 1


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_corrupt_file_is_rebuilt_with_a_warning(cdir, damage):
    reqs, cfg, prof, cal = _inputs(1)
    want = cache.cached_draft_tables(reqs, cfg, prof, cal)
    (path,) = list(cdir.iterdir())
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":  # a bit inside the largest array's data: only the zip CRC can tell
        data = bytearray(raw)
        i = raw.find(b"m_conf.npy")
        data[i + 400] ^= 0x10
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(b"not a zip file")
    with pytest.warns(RuntimeWarning, match="unreadable"):
        got = cache.cached_draft_tables(reqs, cfg, prof, cal)
    _same(got, want)
    _same(cache._load(path, path.stem), want)  # and the file was replaced by a good one


def test_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, "off")
    assert cache.cache_dir() is None
    reqs, cfg, prof, cal = _inputs()
    _same(cache.cached_draft_tables(reqs, cfg, prof, cal), build_draft_tables(reqs, cfg, prof, cal))
