"""The hybrid speculator as a vLLM 0.33 Model Runner V2 plugin (see docs/real.md, "vLLM").

Importable without vLLM: `config` and the pure-torch parts load anywhere; `register()` (the
`vllm.general_plugins` entry point) and the speculator need vLLM 0.33.x and say so when it is missing.
"""
