"""Real engines (pure-PyTorch, vLLM plugin) that run the same policies as the simulator."""
