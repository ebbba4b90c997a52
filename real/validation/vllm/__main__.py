"""`python -m real.validation.vllm run SPEC.json OUT.json`: one vLLM run in this process (real.validation.vllm.engine.run_spec),
its result written to OUT.json whole. Started by real.validation.vllm.engine.launch, one process per run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from sim.infra.cli import run_cli, write_whole


def main(argv: list[str] | None = None) -> int:
    from sim.infra.errors import ConfigError

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "run":
        raise ConfigError("usage: python -m real.validation.vllm run SPEC.json OUT.json")
    from real.validation.vllm.engine import run_spec
    from sim.infra.inputs import REQUEST, read_json

    res = run_spec(read_json(argv[1], REQUEST, what="the run's spec"))  # through the input layer: capped, strict
    write_whole(Path(argv[2]), json.dumps(res) + "\n", overwrite=True)
    return 0


if __name__ == "__main__":
    run_cli(main)
