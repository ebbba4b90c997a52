"""`python -m real.bench_model`: timing of the real/engine model on its own (no engine loop): weight load (cold/warm),
batch-1 greedy decode

A thin command over its library, real/engine/bench_model.py: the options, what it does, the Python API.
"""
from real.engine.bench_model import main

if __name__ == "__main__":
    raise SystemExit(main())
