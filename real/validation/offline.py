"""`python -m real.offline_bundle --out DIR`: what a GPU box without network needs for the vLLM flow, prepared on a
networked machine.

    python -m real.offline_bundle --out DIR [--vllm-model Qwen/Qwen3-8B] [--weights] [--python-version 3.11]
                                  [--platform manylinux_2_28_x86_64] [--dry-run] [--force]

Writes, under DIR (refused when it holds files, unless --force):
  wheels/            a wheelhouse: vLLM 0.33 and every other requirement of `.[vllm]` (pyproject.toml, read here),
                     the build backend an editable install needs, and this project's own wheel, for the box's
                     Python and platform (pip download --only-binary=:all:, so the networked machine may differ)
  models/<name>/     the target's config and tokenizer (enough for `--dummy-weights`); with --weights its weights
                     too, and its published DSpark drafter (sim/core/deploy.py) under models/<drafter name>/
  OFFLINE.md         the steps on the box (BOX_STEPS), with DIR's names filled in
Every command it runs is printed first; --dry-run prints them and writes nothing. Exit 0 when every download
succeeded, 1 otherwise (pip's or the hub's last line is printed).
"""
from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from sim.infra import paths
from sim.infra.cli import ArgumentParser, check_out_dir, write_whole
from sim.infra.errors import ConfigError

# What `--dummy-weights` needs of a target: vLLM builds the model from config.json and initialises its weights;
# the tokenizer turns the traces' text into ids (and vLLM's detokenizer reads it).
CONFIG_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
                "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.jinja"]
EXTRA = "vllm"  # pyproject's optional dependencies the box installs
DEFAULT_PYTHON = "3.11"
DEFAULT_PLATFORM = "manylinux_2_28_x86_64"  # vLLM 0.33.0's wheel tag; older manylinux tags are compatible with it
BOX_STEPS = """# Offline GPU box: the steps (prepared by `{command}`)

Bring this folder ({out}) and a checkout of the project (the same commit) to the box; then, in the checkout:

    python{py} -m venv ~/venvs/vllm && . ~/venvs/vllm/bin/activate
    pip install --no-index --find-links {out}/wheels -e '.[{extra}]'    # registers the plugin's entry point
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    python real/device_check.py --quick --out out/device          # the plugin's device code, no vLLM
    python real/validate.py --engine vllm --quick --dummy-weights --vllm-model {model} \\
        --synthetic-acceptance-length 3 --out out/check                # the cost model, no weights (docs/real.md)
{weights}
The NVIDIA driver must be R580 or newer (vLLM 0.33's torch is built for CUDA 13).
"""
WEIGHTS_STEPS = """With the weights (--weights), the full validation:

    python real/vllm_smoke.py --out out/smoke
    python real/validate.py --engine vllm --vllm-model {model} --vllm-drafter {drafter} --out out/validate-vllm
"""


@dataclass(frozen=True)
class Download:
    """One thing to fetch: a pip command (argv), or a hub snapshot (repo, folder, file patterns or None: all)."""
    what: str
    argv: list[str] | None = None
    repo: str | None = None
    folder: Path | None = None
    patterns: list[str] | None = None

    def line(self) -> str:
        if self.argv is not None:
            return shlex.join(self.argv)
        pats = "all files" if self.patterns is None else " ".join(self.patterns)
        return f"hub snapshot {self.repo} ({pats}) -> {self.folder}"


def requirements(extra: str = EXTRA) -> list[str]:
    """The project's requirements with `extra`, and its build backend's: what `pip install -e '.[extra]'` needs."""
    doc = tomllib.loads((paths.REPO / "pyproject.toml").read_text())
    return (list(doc["build-system"]["requires"]) + ["wheel"] + list(doc["project"]["dependencies"])
            + list(doc["project"]["optional-dependencies"][extra]))


def plan(out: Path, model: str, weights: bool, python: str, platform: str) -> list[Download]:
    """Every download, in order."""
    from real.validation.vllm.config import DSPARK_DRAFTERS, sim_llm_for

    wheels = out / "wheels"
    pip = [sys.executable, "-m", "pip"]
    tags = ["--python-version", python, "--platform", platform, "--platform", "manylinux2014_x86_64",
            "--platform", "linux_x86_64", "--only-binary=:all:"]
    steps = [Download("the requirements' wheels", argv=pip + ["download", "-d", str(wheels)] + tags + requirements()),
             Download("this project's wheel", argv=pip + ["wheel", "--no-deps", "-w", str(wheels), str(paths.REPO)]),
             Download("the target's config and tokenizer", repo=model, folder=out / "models" / model.split("/")[-1],
                      patterns=None if weights else CONFIG_FILES)]
    if weights:
        drafter = DSPARK_DRAFTERS.get(sim_llm_for(model))
        if drafter is None:
            raise ConfigError(f"--weights: no DSpark drafter is published for {model} (sim/core/deploy.py)")
        steps.append(Download("its DSpark drafter", repo=drafter, folder=out / "models" / drafter.split("/")[-1]))
    return steps


def box_steps(out: Path, model: str, weights: bool, python: str, command: str) -> str:
    """OFFLINE.md: the steps on the box, with this bundle's paths."""
    from real.validation.vllm.config import DSPARK_DRAFTERS, sim_llm_for

    mdir = out / "models" / model.split("/")[-1]
    more = ""
    if weights:
        more = WEIGHTS_STEPS.format(model=mdir, drafter=out / "models" / DSPARK_DRAFTERS[sim_llm_for(model)].split("/")[-1])
    return BOX_STEPS.format(command=command, out=out, py=python, extra=EXTRA, model=mdir, weights=more)


def fetch(d: Download) -> tuple[bool, str]:
    """Run one download; (ok, its last line)."""
    if d.argv is not None:
        r = subprocess.run(d.argv, capture_output=True, text=True)
        last = (r.stderr.strip() or r.stdout.strip() or "done").splitlines()[-1]
        return r.returncode == 0, last
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(d.repo, local_dir=str(d.folder), allow_patterns=d.patterns)
        return True, f"{sum(1 for p in d.folder.rglob('*') if p.is_file())} file(s) in {d.folder}"
    except Exception as exc:  # noqa: BLE001 -- no hub client, no network, no such repository: its line
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def main(argv: list[str] | None = None) -> int:
    from real.validation.vllm.config import VllmRunConfig, sim_llm_for

    default = VllmRunConfig().model

    ap = ArgumentParser(prog="python -m real.offline_bundle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the bundle's folder")
    ap.add_argument("--vllm-model", default=default, help=f"the target's Hugging Face id (default {default})")
    ap.add_argument("--weights", action="store_true", help="also the target's weights and its DSpark drafter")
    ap.add_argument("--python-version", default=DEFAULT_PYTHON, help=f"the box's Python (default {DEFAULT_PYTHON})")
    ap.add_argument("--platform", default=DEFAULT_PLATFORM, help=f"the box's wheel platform (default {DEFAULT_PLATFORM})")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, write nothing")
    ap.add_argument("--force", action="store_true", help="add to a folder that holds files")
    a = ap.parse_args(argv)
    sim_llm_for(a.vllm_model)  # one line when the simulator has no spec for it: the check would predict nothing
    out = Path(a.out).expanduser().resolve()
    steps = plan(out, a.vllm_model, a.weights, a.python_version, a.platform)
    for d in steps:
        print(f"{d.what}: {d.line()}", flush=True)
    if a.dry_run:
        return 0
    check_out_dir(out, a.force)
    out.mkdir(parents=True, exist_ok=True)
    ok = True
    for d in steps:
        good, last = fetch(d)
        ok &= good
        print(f"{'OK' if good else 'FAIL'} {d.what}: {last}", flush=True)
    command = "python -m real.offline_bundle " + " ".join(argv if argv is not None else sys.argv[1:])
    write_whole(out / "OFFLINE.md", box_steps(out, a.vllm_model, a.weights, a.python_version, command),
                overwrite=a.force)
    print(f"the steps on the box: {out / 'OFFLINE.md'}")
    return 0 if ok else 1
