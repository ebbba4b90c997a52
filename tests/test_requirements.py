"""What the project needs from the machine and the install, and the one-line errors when it is missing:

- a CUDA path whose torch sees no GPU names the likely cause (torch's CUDA build, the driver it needs) in one
  ConfigError (real/validation/machine.py: no_cuda_reason; used by real/validation/vllm/engine.py require_vllm and
  real/validation/gpu_check.py), with torch.cuda and nvidia-smi monkeypatched;
- a CUDA device name maps to its models/gpus spec by a registry of patterns, an unknown GPU is one ConfigError,
  and --gpu-spec names a spec explicitly;
- real/gpu_check.py's --requests-per-slot 0 means what its help says;
- an installed wheel (not an editable install) carries the n-gram calibrators the vLLM plugin loads: the wheel
  is built, installed with `pip install --target`, and used from another directory.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from sim.infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------- installed wheel
_IN_WHEEL = """
import importlib.metadata as md, json, sys
from pathlib import Path
site, repo = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
assert not any(Path(p or ".").resolve() == repo for p in sys.path), sys.path
from sim.infra import paths
from sim.core.drafters.calibration import CALIBRATOR_DIR, DEFAULT_CALIBRATOR, NgramCalibrator, calibrator_path
from real.vllm_plugin.config import HybridSpecConfig
from real.vllm_plugin.hybrid import HybridDrafter
cfg = HybridSpecConfig.from_additional_config({"hybrid_spec": {}})
drafter = HybridDrafter(cfg, 2, 8, "cpu", block=7)  # loads cfg.calibrator, as the plugin does in a worker
try:
    HybridSpecConfig(calibrator="no-such-calibrator")
    bad = None
except Exception as e:
    bad = str(e)
eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "hybridspec"]
print(json.dumps({"paths": paths.__file__, "models": str(paths.MODELS), "dir": str(CALIBRATOR_DIR),
                  "default": str(calibrator_path(DEFAULT_CALIBRATOR)), "calibrator": cfg.calibrator,
                  "weights": [float(w) for w in drafter.calibrator.weights], "bad": bad,
                  "entry_point": eps[0].value if eps else None,
                  "plugin_module": eps[0].load().__module__ if eps else None,
                  "plugin_file": sys.modules[eps[0].load().__module__].__file__ if eps else None}))
"""


def test_installed_wheel_ships_the_plugins_calibrators(tmp_path):
    """`pip wheel` of the project, installed with --target, imported from /tmp with no checkout on sys.path:
    the default n-gram calibrator resolves inside the installed package, the plugin's config validates and its
    drafter loads the same weights as models/calibrators/, and vLLM's entry point names the installed plugin."""
    t0 = time.perf_counter()
    src = tmp_path / "src"  # a fresh copy: no build/ of an earlier build (setuptools reuses build/lib) and no
    src.mkdir()             # write into the shared checkout
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pt", "*.sha256")
    for name in ("sim", "real", "models"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    wheels, site = tmp_path / "wheels", tmp_path / "installed" / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", ".", "-w", str(wheels)], cwd=src, check=True,
                   capture_output=True)
    (whl,) = wheels.glob("hybridspec-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "sim/data/calibrators/ngram-general.json" in names
    assert not [n for n in names if n.startswith("models/")]  # no top-level folder of data beside the packages
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(whl)], check=True, capture_output=True)
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("PYTHONPATH", "HYBRIDSPEC_MODELS_DIR")}
    env["PYTHONPATH"] = str(site)
    r = subprocess.run([sys.executable, "-c", _IN_WHEEL, str(site), str(ROOT)], cwd="/tmp", env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("paths", "models", "dir", "default", "plugin_file"):
        assert Path(got[key]).resolve().is_relative_to(site.resolve()), (key, got[key])
    assert Path(got["default"]).name == "ngram-general.json" and got["calibrator"] == "ngram-general"
    shipped = json.loads((ROOT / "models" / "calibrators" / "ngram-general.json").read_text())["weights"]
    assert got["weights"] == pytest.approx(shipped)
    assert got["bad"].startswith("hybrid_spec.calibrator: unknown n-gram calibrator 'no-such-calibrator'")
    assert "ngram-general" in got["bad"]
    assert got["entry_point"] == "real.vllm_plugin.plugin:register"
    assert got["plugin_module"] == "real.vllm_plugin.plugin"
    print(f"wheel build + install + check: {time.perf_counter() - t0:.1f} s")


def test_checkout_reads_models_itself():
    """In the checkout (the source tree, an editable install) nothing is shipped: models/ is read in place."""
    from sim.core.drafters.calibration import CALIBRATOR_DIR, DEFAULT_CALIBRATOR, calibrator_path
    from sim.infra import paths

    assert not (ROOT / "sim" / "data").exists()
    assert paths.MODELS == ROOT / "models" and CALIBRATOR_DIR == ROOT / "models" / "calibrators"
    assert calibrator_path(DEFAULT_CALIBRATOR) == ROOT / "models" / "calibrators" / "ngram-general.json"


def test_plugin_config_refuses_an_unknown_calibrator_at_startup():
    from real.vllm_plugin.config import HybridSpecConfig

    with pytest.raises(ConfigError, match=r"^hybrid_spec\.calibrator: unknown n-gram calibrator 'nope'; "
                                          r"choose one of: .*ngram-general"):
        HybridSpecConfig.from_additional_config({"hybrid_spec": {"calibrator": "nope"}})
    with pytest.raises(ConfigError, match=r"hybrid_spec\.calibrator: .*missing\.json"):
        HybridSpecConfig(calibrator="/nonexistent/missing.json")
    assert HybridSpecConfig(calibrator=str(ROOT / "models" / "calibrators" / "ngram-general.json")).calibrator


# --------------------------------------------------------------------------------------------- no CUDA GPU
def _fake_smi(monkeypatch, driver: str | None):
    """nvidia-smi as this machine would answer: the driver version, or absent (None)."""
    import sim.infra.cuda as cuda_mod

    real_run = subprocess.run

    def run(argv, *a, **kw):
        if list(argv) != cuda_mod.NVIDIA_SMI:
            return real_run(argv, *a, **kw)
        if driver is None:
            raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")
        return subprocess.CompletedProcess(argv, 0, stdout=f"{driver}\n", stderr="")

    monkeypatch.setattr(cuda_mod.subprocess, "run", run)


def _torch_without_gpu(monkeypatch, cuda: str | None):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", cuda)


@pytest.mark.parametrize("cuda, driver, says", [
    ("13.0", "570.86.15", ("built for CUDA 13.0 (libcudart.so.13)", "R580 or newer", "driver is 570.86.15",
                           "upgrade the driver to R580+")),
    ("13.0", None, ("CUDA 13.0", "R580 or newer", "no NVIDIA driver was found (nvidia-smi is missing")),
    ("13.0", "580.65.06", ("R580 or newer", "driver is 580.65.06, new enough", "GPU is visible")),
    ("12.8", "550.54.15", ("built for CUDA 12.8 (libcudart.so.12)", "R525 or newer", "new enough")),
    (None, "580.65.06", ("CPU-only build (torch.version.cuda is None)",)),
])
def test_no_cuda_reason_names_torchs_cuda_and_the_driver(monkeypatch, cuda, driver, says):
    from sim.infra.cuda import no_cuda_reason

    _torch_without_gpu(monkeypatch, cuda)
    _fake_smi(monkeypatch, driver)
    line = no_cuda_reason()
    assert "\n" not in line and line.startswith("torch ") and "sees no CUDA GPU" in line
    for s in says:
        assert s in line, (s, line)


def test_require_vllm_without_a_gpu_names_the_cause(monkeypatch):
    import real.vllm_plugin.versions as versions
    from real.validation.vllm.engine import require_vllm

    monkeypatch.setattr(versions, "installed_build", lambda: ("vllm", "0.33.0"))
    _torch_without_gpu(monkeypatch, "13.0")
    _fake_smi(monkeypatch, "550.54.15")
    with pytest.raises(ConfigError) as e:
        require_vllm()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("vLLM 0.33.0 is installed but torch ")
    assert "CUDA 13.0" in msg and "R580" in msg and "550.54.15" in msg
    _fake_smi(monkeypatch, None)
    with pytest.raises(ConfigError, match="no NVIDIA driver was found"):
        require_vllm()


def test_gpu_check_without_a_gpu_names_the_cause(monkeypatch, tmp_path):
    from conftest import run_cli_inprocess

    _torch_without_gpu(monkeypatch, "13.0")
    _fake_smi(monkeypatch, None)
    r = run_cli_inprocess("real.validation.gpu_check", "--device", "cuda", "--model", "qwen3-tiny", "--quick",
                          "--out", str(tmp_path / "o"), cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (err,) = r.stderr.strip().splitlines()
    assert err.startswith("error: --device cuda: torch ") and "CUDA 13.0 (libcudart.so.13)" in err
    assert "R580 or newer" in err and "no NVIDIA driver was found" in err and "--device cpu runs" in err
    assert any(ln.startswith("FAIL") and "CUDA available: torch " in ln for ln in r.stdout.splitlines())


def test_torch_engine_on_cuda_without_a_gpu_names_the_cause(monkeypatch):
    from real.engine.weights import resolve_device

    _torch_without_gpu(monkeypatch, "13.0")
    _fake_smi(monkeypatch, "535.104.05")
    with pytest.raises(ConfigError, match=r"^device 'cuda': torch .*CUDA 13\.0.*R580.*535\.104\.05"):
        resolve_device("cuda")


# --------------------------------------------------------------------------------------------- GPU -> spec
def test_every_pattern_names_a_spec_that_exists():
    from real.validation.machine import GPU_SPECS
    from sim.core.models import get_gpu

    assert len({g.spec for g in GPU_SPECS}) == len(GPU_SPECS)
    for g in GPU_SPECS:
        assert get_gpu(g.spec).name == g.spec


@pytest.mark.parametrize("name, spec", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 SXM5 80GB", "h100-sxm"),
    ("NVIDIA A100-SXM4-80GB", "a100-80g"), ("AMD Instinct MI300X", "mi300x"), ("cpu", "cpu"),
])
def test_known_gpus_map_to_their_spec(name, spec):
    from real.validation.machine import gpu_models_name

    assert gpu_models_name(name) == spec


@pytest.mark.parametrize("name", ["NVIDIA L4", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL",
                                  "NVIDIA GH200 480GB", "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe",
                                  "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB"])
def test_an_unknown_gpu_is_one_error_not_an_h100(name):
    """Before, every GPU that was not an H200 or A100 was priced as an H100 SXM."""
    from real.validation.machine import gpu_models_name

    with pytest.raises(ConfigError) as e:
        gpu_models_name(name)
    msg = str(e.value)
    assert "\n" not in msg and repr(name) in msg
    for known in ("h200", "h100-sxm", "a100-80g"):
        assert f"-> {known}" in msg
    assert "--gpu-spec NAME or models/gpus/NAME.json" in msg and "--cost-table" in msg
    assert gpu_models_name(name, "h100-sxm") == "h100-sxm"
    assert gpu_models_name(name, str(ROOT / "models" / "gpus" / "h200.json")) == "h200"


def test_gpu_spec_flag_is_checked(tmp_path):
    from real.validation.machine import gpu_models_name

    with pytest.raises(ConfigError, match=r"^--gpu-spec: unknown gpu 'v100'; choose one of: a100-80g"):
        gpu_models_name("NVIDIA L4", "v100")
    other = tmp_path / "h200.json"
    other.write_text((ROOT / "models" / "gpus" / "h200.json").read_text())
    with pytest.raises(ConfigError, match=r"^--gpu-spec .*h200\.json: not a file in .*models/gpus"):
        gpu_models_name("NVIDIA L4", str(other))
    with pytest.raises(ConfigError, match=r"^--gpu-spec h200: this run is on the CPU"):
        gpu_models_name("cpu", "h200")


def test_the_flag_is_declared_once_and_reaches_the_tables():
    """--gpu-spec: one declaration (real/validation/machine.py), in gpu_check's and profile's parsers; a profiled
    table carries the spec it was given, and an unknown GPU's table is refused rather than priced as an H100."""
    import re

    from real.validation import gpu_check, profile
    from real.validation.vllm import bench
    from real.validation.vllm.config import VllmRunConfig

    declared = [p.relative_to(ROOT) for p in (ROOT / "real").rglob("*.py")
                if re.search(r"add_argument\(\s*(GPU_SPEC_FLAG|[\"']--gpu-spec)", p.read_text())]
    assert declared == [Path("real/validation/machine.py")]
    assert gpu_check.parse_args(["--gpu-spec", "models/gpus/h200.json"]).gpu_spec == "h200"
    assert profile.parse_args(["--gpu-spec", "a100-80g"]).gpu_spec == "a100-80g"
    with pytest.raises(ConfigError, match="--gpu-spec: unknown gpu 'l4'"):
        profile.parse_args(["--gpu-spec", "l4"])
    cfg = VllmRunConfig()
    cases = bench.forward_cases(cfg, [1, 2], quick=True)
    target = {c.name: 5.0 + 0.01 * c.tokens for c in cases}
    lm = [(r, 0.4 + 0.002 * r) for r in bench.LM_HEAD_ROWS]
    machine = {"device": "NVIDIA L4", "model": "qwen3-8b"}
    with pytest.raises(ConfigError, match="'NVIDIA L4'"):
        bench.build_table(cfg, cases, target, {}, lm, machine, "test")
    assert bench.build_table(cfg, cases, target, {}, lm, machine, "test", gpu="a100-80g").gpu == "a100-80g"


def _fake_cuda_device(monkeypatch, name: str):
    import torch

    gib = 1024 ** 3
    for attr, value in (("is_available", lambda: True), ("current_device", lambda: 0), ("device_count", lambda: 1),
                        ("get_device_name", lambda i=0: name), ("mem_get_info", lambda i=0: (70 * gib, 80 * gib)),
                        ("get_device_capability", lambda i=0: (9, 0)), ("is_bf16_supported", lambda: True)):
        monkeypatch.setattr(torch.cuda, attr, value)


@pytest.mark.parametrize("name, flag, spec", [("NVIDIA H200", (), "h200"), ("NVIDIA L4", ("--gpu-spec", "h100-sxm"),
                                                                         "h100-sxm"), ("NVIDIA L4", (), None)])
def test_gpu_check_preflight_prices_the_device_by_its_spec(monkeypatch, tmp_path, name, flag, spec):
    """Only the preflight runs (on a pretended device): the spec it picks, or one FAIL naming the GPU."""
    from real.validation.gpu_check import Run, parse_args, preflight

    _fake_cuda_device(monkeypatch, name)
    a = parse_args(["--device", "cuda", "--model", "qwen3-tiny", "--quick", "--out", str(tmp_path / "o"), "--force",
                    *flag])
    run = Run(args=a, out=tmp_path / "o", t0=time.perf_counter(), budget_s=60.0)
    if spec is None:
        with pytest.raises(ConfigError, match=r"^preflight failed: .*no models/gpus spec is known for the GPU "
                                              r"'NVIDIA L4'"):
            preflight(run)
        (fail,) = [ln for ln in run.preflight if ln.startswith("FAIL")]
        assert "device NVIDIA L4 (sm_90)" in fail and "roofline spec none: no models/gpus spec" in fail
        assert run.gpu == "cpu"  # nothing priced
        return
    preflight(run)
    assert run.gpu == spec and run.device_name == name
    assert any(f"roofline spec models/gpus/{spec}.json" in ln for ln in run.preflight)


# --------------------------------------------------------------------------------------------- gpu_check flags
def test_requests_per_slot_zero_means_limit_at_every_batch_size():
    from real.validation.gpu_check import cell_limit, parse_args

    a = parse_args(["--requests-per-slot", "0", "--limit", "40", "--batch-size", "1", "--batch-size", "16"])
    assert a.requests_per_slot == 0 and cell_limit(a, 1) == 40 and cell_limit(a, 16) == 40
    b = parse_args(["--requests-per-slot", "2", "--limit", "40"])
    assert cell_limit(b, 1) == 2 and cell_limit(b, 64) == 40
    with pytest.raises(ConfigError, match=r"^--requests-per-slot must be >= 0 \(0: --limit at every batch size\), "
                                          r"got -1$"):
        parse_args(["--requests-per-slot", "-1"])
