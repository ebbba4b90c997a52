"""The pure-PyTorch engine: a gpt-fast-style decoder (model.py), its weights (weights.py) and tokenizer."""
