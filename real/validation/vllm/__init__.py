"""Drive vLLM 0.33 for the simulator's checks: `real/validate.py --engine vllm` and `real/profile.py --engine vllm`
(docs/real.md, "vLLM (A100/H100)").

  config  VllmRunConfig: the one place every vLLM setting lives; LLM kwargs, `vllm serve` line, CLI flags
  engine  one vLLM generation per process: outputs, wall time, spec-decode metrics, the plugin's counters
  bench   the profiled cost table from `vllm bench forward` runs and a timed LM-head GEMM
  checks  the first-run checklist (plugin loaded, n-gram self-check, no host sync, lossless)
  flow    the validate and profile flows and the --dry-run plan

Importable without vLLM: only the functions that run vLLM import it (a missing vLLM is one ConfigError).
"""
