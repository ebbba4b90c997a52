"""Which machine a measurement was taken on: its identity for a cost table (real/validation/profile.py) and the models/gpus
spec that stands for a CUDA device. Kept apart from real/validation/profile.py so that the vLLM flows can name the
machine without importing the torch engine's profiler.

A CUDA device is priced by the spec whose pattern (GPU_SPECS) matches the name torch.cuda.get_device_name gives;
each pattern takes only the variants of the datasheet its spec holds (models/gpus/<spec>.json "source"), so an
H100 PCIe, an A100 40GB or an L4 is no spec's. Such a GPU is one ConfigError naming it, the known specs and
--gpu-spec (GPU_SPEC_FLAG, declared by add_gpu_spec_flag), which names a spec explicitly.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from sim.infra.errors import ConfigError


@dataclass(frozen=True)
class GpuPattern:
    """CUDA device names (a regular expression, searched case-insensitively) -> a models/gpus spec."""

    spec: str
    pattern: str
    what: str  # the variant, as a person names it


# torch names them 'NVIDIA H200', 'NVIDIA H100 80GB HBM3', 'NVIDIA A100-SXM4-80GB' (ROCm: 'AMD Instinct MI300X')
GPU_SPECS = (
    GpuPattern("h200", r"\bH200\b(?!.*\bNVL\b)", "H200 SXM"),
    GpuPattern("h100-sxm", r"\bH100\b(?!.*\b(?:PCIe|NVL)\b).*\b(?:SXM\d*|HBM3)\b", "H100 SXM"),
    GpuPattern("a100-80g", r"\bA100\b.*\bSXM.*\b80\s?GB\b", "A100 SXM 80GB"),
    GpuPattern("mi300x", r"\bMI300X\b", "MI300X"),
    GpuPattern("mi350x", r"\bMI350X\b", "MI350X"),
)
GPU_SPEC_FLAG = "--gpu-spec"


def add_gpu_spec_flag(ap: argparse.ArgumentParser) -> None:
    """The one declaration of --gpu-spec, for every command that prices a CUDA device by a models/gpus spec."""
    ap.add_argument(GPU_SPEC_FLAG, default=None, metavar="NAME|models/gpus/NAME.json",
                    help="the models/gpus spec of this CUDA GPU (default: matched by the device's name: "
                         + ", ".join(f"{g.what} -> {g.spec}" for g in GPU_SPECS) + "; any other GPU needs this flag)")


def given_gpu_spec(given: str) -> str:
    """The models/gpus name of --gpu-spec: a name, or a JSON file in models/gpus (a cost table names its GPU by the
    spec's name, and the simulator loads it by that name); ConfigError otherwise."""
    from sim.core.models import get_gpu, models_dir

    p = Path(given)
    if p.suffix == ".json":
        gpus = models_dir() / "gpus"
        if not p.is_file() or p.resolve().parent != gpus.resolve():
            raise ConfigError(f"{GPU_SPEC_FLAG} {given}: not a file in {gpus} (add the spec there, or give a name)")
        given = p.stem
    try:
        get_gpu(given)
    except ConfigError as e:
        raise ConfigError(f"{GPU_SPEC_FLAG}: {e}") from None
    return given.strip().lower()


def gpu_models_name(device_name: str, given: str | None = None) -> str:
    """The models/gpus spec for a CUDA device name ("cpu" for the CPU): `given` (--gpu-spec) when set, else the spec
    whose GPU_SPECS pattern matches; one ConfigError for a GPU none matches."""
    if device_name.strip().upper() == "CPU":
        if given is not None:
            raise ConfigError(f"{GPU_SPEC_FLAG} {given}: this run is on the CPU, which no models/gpus spec prices")
        return "cpu"
    if given is not None:
        return given_gpu_spec(given)
    for g in GPU_SPECS:
        if re.search(g.pattern, device_name, re.IGNORECASE):
            return g.spec
    from sim.core.models import list_gpus

    known = ", ".join(f"{g.what} -> {g.spec}" for g in GPU_SPECS)
    raise ConfigError(f"no models/gpus spec is known for the GPU {device_name!r} (by name: {known}); name one with "
                      f"{GPU_SPEC_FLAG} NAME or models/gpus/NAME.json (one of {', '.join(list_gpus())}, or a file you "
                      f"add there) to real/gpu_check.py or real/profile_costs.py, and give real/validate.py that "
                      f"profile as --cost-table")


def machine_info(device: torch.device, dtype: torch.dtype, model: str) -> dict:
    """Identity of this machine for check_machine: device, cpu, torch, dtype, threads, model."""
    if device.type == "cuda":
        dev = torch.cuda.get_device_name(device)
    else:
        dev = "cpu"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"device": dev, "cpu": cpu, "torch": torch.__version__.split("+")[0], "dtype": str(dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(), "model": model, "cores": os.cpu_count()}
