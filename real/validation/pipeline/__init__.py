"""The one validation pipeline every real engine goes through (the torch engine, vLLM on CUDA, vLLM on the CPU build).

  cells      (trace, policy, batch size), named once (cells.cell_id), `none` first: its outputs are the reference
  reference  the `none` run's outputs as a token-id trace, with the top-2 logit margin at each output position
             where the engine records it (lossless.py)
  drafts     the model drafter's chains the engine recorded, as the simulator's recorded-drafts sidecar (drafts.py)
  tables     the engine's own cost tables with its capture sizes, as a project cost table (tables.py)
  predict    the simulator on the reference, the drafts and the tables, with the engine's scheduler facts; steps
             counted one way on both sides (predict.py)
  compare    lossless (exact, or a tie flip below the margin epsilon: lossless.py), throughput and step errors,
             verdicts (real/validation/fidelity_stats.py)
  report     fidelity.json / .md / .html (real/validation/fidelity.py)
The engines differ only in how they start a run and read what it records: real/validation/validate.py (torch),
real/validation/vllm/flow.py with its builds (real/validation/vllm/builds.py: CUDA, CPU)."""
