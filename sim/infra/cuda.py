"""Why torch sees no CUDA GPU, as one line for the ConfigError of every path that needs one (the vLLM GPU path,
real/gpu_check.py, the torch engine on --device cuda).

The usual cause is a torch built for a newer CUDA than the NVIDIA driver serves: vLLM 0.33.0 pins torch 2.14.0,
built for CUDA 13 (libcudart.so.13), and a CUDA 13 runtime needs a driver of the R580 branch or newer. The line
names torch's CUDA build (torch.version.cuda), the driver branch that build needs (MIN_DRIVER, from NVIDIA's
CUDA toolkit release notes: the minimum driver for minor-version compatibility) and the driver nvidia-smi
reports, or that none was found.
"""
from __future__ import annotations

import os
import subprocess

# CUDA major version -> the oldest NVIDIA driver branch (Linux) that runs it
MIN_DRIVER = {11: 450, 12: 525, 13: 580}
NVIDIA_SMI = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]


def driver_version() -> str | None:
    """The NVIDIA driver version nvidia-smi reports (first GPU), or None when nvidia-smi is absent or fails."""
    try:
        r = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()] if r.returncode == 0 else []
    return lines[0] if lines else None


def no_cuda_reason() -> str:
    """One line: what torch is built for, what that needs, and what this machine has (module docstring)."""
    import torch

    cuda = torch.version.cuda
    head = f"torch {torch.__version__} sees no CUDA GPU"
    if not cuda:
        return f"{head}: it is a CPU-only build (torch.version.cuda is None); install a CUDA build of torch"
    major = int(str(cuda).split(".")[0])
    need = MIN_DRIVER.get(major)
    head += (f": it is built for CUDA {cuda} (libcudart.so.{major}), which needs an NVIDIA driver "
             + (f"R{need} or newer" if need else f"that supports CUDA {major}"))
    drv = driver_version()
    if drv is None:
        return f"{head}, and no NVIDIA driver was found (nvidia-smi is missing or failed)"
    branch = drv.split(".")[0]
    if not (need and branch.isdigit()):
        return f"{head}; this machine's driver is {drv}"
    if int(branch) < need:
        return (f"{head}; this machine's driver is {drv}: upgrade the driver to R{need}+, or install a torch built "
                f"for an older CUDA")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"{head}; this machine's driver is {drv}, new enough: check that the GPU is visible"
            + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
            + " and that torch's CUDA libraries load (python -c 'import torch; torch.cuda.init()')")
