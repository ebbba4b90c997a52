"""The hardware and software a device check or a smoke test ran on: what their reports name first.

Nothing here imports vLLM or Triton (their versions come from the package metadata) or needs the network; the
NVIDIA driver's version is nvidia-smi's (sim/infra/cuda.py).
"""
from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata

import torch

from real.vllm_plugin.versions import installed_build
from sim.infra import paths
from sim.infra.cuda import driver_version


def _package(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=paths.REPO, capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def versions() -> dict:
    """Name -> value (str, or None when absent), in the order a report lists them."""
    cuda = torch.cuda.is_available()
    out = {"gpu": None, "gpu memory": None, "compute capability": None, "gpus": 0}
    if cuda:
        p = torch.cuda.get_device_properties(0)
        out = {"gpu": p.name, "gpu memory": f"{p.total_memory / 2**30:.1f} GiB",
               "compute capability": f"{p.major}.{p.minor}", "gpus": torch.cuda.device_count()}
    vllm = installed_build()
    out.update({
        "NVIDIA driver": driver_version(),
        "CUDA (torch's build)": torch.version.cuda,
        "torch": torch.__version__,
        "triton": _package("triton"),
        "vLLM": f"{vllm[0]} {vllm[1]}" if vllm else None,
        "python": platform.python_version(),
        "numpy": _package("numpy"),
        "cpu": f"{_cpu()} ({os.cpu_count()} cores)",
        "os": platform.platform(),
        "hybridspec commit": _commit(),
    })
    return out


def version_lines(v: dict) -> list[str]:
    """`name: value` lines (absent values as `none`)."""
    return [f"{k}: {'none' if x is None else x}" for k, x in v.items()]
