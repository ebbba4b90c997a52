"""Which machine a measurement was taken on: its identity for a cost table (real/validation/profile.py) and the models/gpus
spec that stands for a CUDA device. Kept apart from real/validation/profile.py so that the vLLM flows can name the
machine without importing the torch engine's profiler."""
from __future__ import annotations

import os
import platform

import torch


def gpu_models_name(device_name: str) -> str:
    """The models/gpus spec for a CUDA device name: h200, a100-80g, else h100-sxm ("cpu" for the CPU)."""
    n = device_name.upper()
    if n == "CPU":
        return "cpu"
    return "h200" if "H200" in n else "a100-80g" if "A100" in n else "h100-sxm"


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
