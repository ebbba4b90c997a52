"""The real engines and their checks (docs/design.md, "Layout"): real/engine (the pure-PyTorch engine), real/drafter
(trained drafters), real/vllm_plugin (the hybrid inside vLLM), real/validation (the pipeline that checks the simulator
against them) and the commands at the top of this folder (`python real/validate.py`, ...)."""
