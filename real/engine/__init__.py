"""The pure-PyTorch engine: the simulator's engine with a model in the loop (engine.py), a gpt-fast-style decoder
(model.py), its weights (weights.py) and the greedy reference (greedy.py). The SmolLM2 tokenizer is in the core
(sim/core/trace/smollm2_tokenizer.py), since traces are tokenized with it."""
