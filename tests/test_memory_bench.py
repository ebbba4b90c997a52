"""sim.api.memory_bench's generators: seeded (same flags, same bytes), valid traces, never overwriting a file."""
import pytest

from sim.infra.errors import ConfigError
from sim.api.memory_bench import MAX_LEN, main
from sim.core.trace import load_trace


def test_generators_are_seeded_valid_and_do_not_overwrite(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    main(["gen-burst", "--requests", "300", "--seed", "3", "-o", str(a)])
    main(["gen-burst", "--requests", "300", "--seed", "3", "-o", str(b)])
    assert a.read_bytes() == b.read_bytes()
    reqs = load_trace(str(a)).requests
    assert len(reqs) == 300 and all(r.length_only and 1 <= r.output_len <= MAX_LEN for r in reqs)
    arrivals = [r.arrival_s for r in reqs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    main(["gen-text", "--requests", "3", "--prompt", "40", "--output", "80", "-o", str(c)])
    toks = load_trace(str(c)).requests
    assert [(r.prompt_len, r.output_len) for r in toks] == [(40, 80)] * 3
    with pytest.raises(ConfigError, match="exists"):
        main(["gen-burst", "--requests", "5", "-o", str(a)])
    assert a.read_bytes() == b.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))
