"""Builder of the bundled code-editing trace: real edits between two releases of permissively licensed
pure-Python PyPI projects, as fast-apply requests.

For each project (pinned versions and wheel sha256 below), both releases' wheels are fetched with
`pip download --no-deps --only-binary :all:` into $HYBRIDSPEC_CACHE_DIR/wheels, checked against the pinned
hashes, and their .py files compared with difflib. Each change is a group of nearby diff hunks
(3 lines of context). A request is

  prompt = instruction + the original code + the requested change (unified diff of the hunk group)
  output = the code with exactly those hunks applied

where "the code" is the whole file when it fits in MAX_TOKENS (then one request per HUNKS_PER_EDIT hunk
groups, so each request is a few-place edit as in fast-apply), else the smallest run of top-level blocks
(def / class / decorators, module code between them) that covers the hunks, grown block by block to at
least MIN_TOKENS. Requests whose output falls outside [MIN_TOKENS, MAX_TOKENS] are dropped. Requests are
then picked in hash order of their id with at most PROJECT_CAP per project, until TARGET requests or
SIZE_BUDGET bytes. Everything iterates in sorted order and writes no timestamps: reruns are byte-identical.
"""
from __future__ import annotations

import difflib
import hashlib
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sim.errors import HybridSpecError
from sim.trace.formats import dumps_line, render_chat, write_jsonl

MIN_TOKENS, MAX_TOKENS = 150, 3000
HUNKS_PER_EDIT = 4       # whole-file requests apply at most this many hunk groups
GROW_TO = 300          # windows smaller than this grow by neighbouring blocks
TARGET = 380
PROJECT_CAP = 90
SIZE_BUDGET = 3_900_000
SALT = "hybridspec-codeedit-v1"

SYSTEM = ("You are a code editing assistant. Apply the requested change to the given code and reply with "
          "the complete updated code only, without explanations or markdown fences.")


@dataclass(frozen=True)
class Release:
    version: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Project:
    name: str          # PyPI name
    license: str
    old: Release
    new: Release


PROJECTS: tuple[Project, ...] = (
    Project("attrs", "MIT",
            Release("21.4.0", "attrs-21.4.0-py2.py3-none-any.whl",
                    "2d27e3784d7a565d36ab851fe94887c5eccd6a463168875832a1be79c82828b4"),
            Release("23.1.0", "attrs-23.1.0-py3-none-any.whl",
                    "1f28b4522cdc2fb4256ac1a020c78acf9cba2c6b461ccd2c126f3aa8e8335d04")),
    Project("click", "BSD-3-Clause",
            Release("7.1.2", "click-7.1.2-py2.py3-none-any.whl",
                    "dacca89f4bfadd5de3d7489b7c8a566eee0d3676333fbb50030263894c38c0dc"),
            Release("8.1.3", "click-8.1.3-py3-none-any.whl",
                    "bb4d8133cb15a609f44e8213d9b391b0809795062913b383c62be0ee95b1db48")),
    Project("rich", "MIT",
            Release("12.0.0", "rich-12.0.0-py3-none-any.whl",
                    "fdcd2f8d416e152bcf35c659987038d1ae5a7bd336e821ca7551858a4c7e38a9"),
            Release("13.3.0", "rich-13.3.0-py3-none-any.whl",
                    "dd62e48284e540ae03235258699c07d5b48dbc1fd1905c6091b5ce72d7c69195")),
    Project("Jinja2", "BSD-3-Clause",
            Release("2.11.3", "Jinja2-2.11.3-py2.py3-none-any.whl",
                    "03e47ad063331dd6a3f04a43eddca8a966a26ba0c5b7207a9a9e4e08f1b29419"),
            Release("3.1.2", "Jinja2-3.1.2-py3-none-any.whl",
                    "6088930bfe239f0e6710546ab9c19c9ef35e29792895fed6e6e31a023a182a61")),
    Project("packaging", "Apache-2.0 OR BSD-2-Clause",
            Release("20.9", "packaging-20.9-py2.py3-none-any.whl",
                    "67714da7f7bc052e064859c05c595155bd1ee9f69f76557e21f051443c20947a"),
            Release("23.0", "packaging-23.0-py3-none-any.whl",
                    "714ac14496c3e68c99c29b00845f7a2b85f3bb6f1078fd9f72fd20f0570002b2")),
    Project("more-itertools", "MIT",
            Release("8.12.0", "more_itertools-8.12.0-py3-none-any.whl",
                    "43e6dd9942dffd72661a2c4ef383ad7da1e6a3e968a927ad7a6083ab410a688b"),
            Release("10.1.0", "more_itertools-10.1.0-py3-none-any.whl",
                    "64e0735fcfdc6f3464ea133afe8ea4483b1c5fe3a3d69852e6503b43a0b222e6")),
    Project("requests", "Apache-2.0",
            Release("2.25.1", "requests-2.25.1-py2.py3-none-any.whl",
                    "c210084e36a42ae6b9219e00e48287def368a26d03a048ddad7bfee44f75871e"),
            Release("2.31.0", "requests-2.31.0-py3-none-any.whl",
                    "58cd2187c01e70e6e26505bca751777aa9f2ee0b7f4300988b709f44e013003f")),
    Project("Markdown", "BSD-3-Clause",
            Release("3.4.1", "Markdown-3.4.1-py3-none-any.whl",
                    "08fb8465cffd03d10b9dd34a5c3fea908e20391a2a90b88d66362cb05beed186"),
            Release("3.5", "Markdown-3.5-py3-none-any.whl",
                    "4afb124395ce5fc34e6d9886dab977fd9ae987fc6e85689f08278cf0c69d4bf3")),
    Project("Pygments", "BSD-2-Clause",
            Release("2.13.0", "Pygments-2.13.0-py3-none-any.whl",
                    "f643f331ab57ba3c9d89212ee4a2dabc6e94f117cf4eefde99a0574720d14c42"),
            Release("2.15.0", "Pygments-2.15.0-py3-none-any.whl",
                    "77a3299119af881904cd5ecd1ac6a66214b6e9bed1f2db16993b54adede64094")),
)


class DownloadError(HybridSpecError):
    pass


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_wheel(project: Project, rel: Release, cache: Path) -> Path:
    """The verified wheel of a release, downloaded with pip on first use."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / rel.filename
    if not path.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
               "--dest", str(cache), f"{project.name}=={rel.version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not path.exists():
            raise DownloadError(f"could not download {project.name}=={rel.version} ({rel.filename}): "
                                f"{proc.stderr.strip().splitlines()[-1:] or 'file not produced'}")
    got = _sha256(path)
    if got != rel.sha256:
        raise DownloadError(f"sha256 mismatch for {path}: expected {rel.sha256}, got {got}")
    return path


def wheel_sources(path: Path) -> dict[str, str]:
    """{path inside the wheel: text} of its UTF-8 .py files (metadata excluded)."""
    out = {}
    with zipfile.ZipFile(path) as z:
        for name in sorted(z.namelist()):
            if name.endswith(".py") and ".dist-info/" not in name:
                try:
                    out[name] = z.read(name).decode("utf-8")
                except UnicodeDecodeError:
                    continue
    return out


_BLOCK_START = re.compile(r"^(@|def |class |async def )")


def _block_starts(lines: list[str]) -> list[int]:
    starts = [0]
    for i, ln in enumerate(lines):
        if i and _BLOCK_START.match(ln) and not lines[i - 1].startswith("@"):
            starts.append(i)
    return starts


def _text(lines: list[str]) -> str:
    return "".join(lines)


def _diff(path: str, old: list[str], new: list[str]) -> str:
    out = []
    for ln in difflib.unified_diff(old, new, f"a/{path}", f"b/{path}", n=3):
        out.append(ln if ln.endswith("\n") else ln + "\n")
    return "".join(out)


def file_edits(label: str, path: str, old_text: str, new_text: str, count) -> list[dict]:
    """The requests of one changed file. `count(text) -> tokens`. label: 'project old->new'."""
    a = old_text.splitlines(keepends=True)
    b = new_text.splitlines(keepends=True)
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    groups = [[op for op in g if op[0] != "equal"] for g in sm.get_grouped_opcodes(3)]
    groups = [g for g in groups if g]
    if not groups:
        return []
    whole = count(old_text) <= MAX_TOKENS and count(new_text) <= MAX_TOKENS
    starts = _block_starts(a) + [len(a)]
    # windows [lo, hi) in old-line coordinates, one per hunk group, merged when they overlap
    wins: list[list] = []
    if whole:  # one request per chunk of up to HUNKS_PER_EDIT hunk groups, each applied to the whole file
        for c in range(0, len(groups), HUNKS_PER_EDIT):
            wins.append([0, len(a), [op for g in groups[c:c + HUNKS_PER_EDIT] for op in g]])
    for g in groups if not whole else ():
        i1, i2 = g[0][1], g[-1][2]
        lo = max(s for s in starts if s <= min(i1, len(a) - 1 if a else 0))
        hi = min(s for s in starts if s >= max(i2, i1 + 1)) if i2 < len(a) else len(a)
        if wins and lo < wins[-1][1]:
            wins[-1][1] = max(wins[-1][1], hi)
            wins[-1][2].extend(g)
        else:
            wins.append([lo, hi, list(g)])
    rows = []
    for k, (lo, hi, ops) in enumerate(wins):
        # grow small windows by whole neighbouring blocks (next first, then previous)
        while count(_text(a[lo:hi])) < GROW_TO and (lo > 0 or hi < len(a)):
            nxt = [s for s in starts if s > hi]
            prv = [s for s in starts if s < lo]
            if hi < len(a) and (nxt or hi < len(a)):
                hi = nxt[0] if nxt else len(a)
            else:
                lo = prv[-1] if prv else 0
        if any(op[1] < lo or op[2] > hi for op in ops):
            continue  # a grown neighbour's hunk would be half inside; keep it simple and skip
        new_lines, pos = [], lo
        for _, i1, i2, j1, j2 in ops:
            new_lines += a[pos:i1] + b[j1:j2]
            pos = i2
        new_lines += a[pos:hi]
        old_code, new_code = _text(a[lo:hi]), _text(new_lines)
        if old_code == new_code or not new_code.strip():
            continue
        where = "" if (lo == 0 and hi == len(a)) else f" (lines {lo + 1}-{hi} of the file)"
        user = (f"Code from `{path}`{where}:\n\n{old_code}\n\nRequested change (unified diff):\n\n"
                f"{_diff(path, a[lo:hi], new_lines)}\nReply with the complete updated code.")
        prompt = render_chat([("system", SYSTEM), ("user", user)])
        rows.append({"id": f"{label}:{path}#{k}", "prompt": prompt, "output": new_code, "workload": "codeedit"})
    return rows


def project_edits(label: str, old: dict[str, str], new: dict[str, str], count) -> list[dict]:
    rows = []
    for path in sorted(old):
        if path in new and old[path] != new[path]:
            rows.extend(file_edits(label, path, old[path], new[path], count))
    return rows


def select(rows: list[dict], count, target: int = TARGET, cap: int = PROJECT_CAP,
           budget: int = SIZE_BUDGET) -> list[dict]:
    """Keep rows with output in [MIN_TOKENS, MAX_TOKENS]; pick in hash order with a per-project cap."""
    def key(r):
        return hashlib.sha256(f"{SALT}:{r['id']}".encode()).hexdigest()

    picked, per_project, size = [], {}, 0
    for r in sorted(rows, key=key):
        if len(picked) >= target:
            break
        proj = r["id"].split(" ", 1)[0]
        if per_project.get(proj, 0) >= cap:
            continue
        if not MIN_TOKENS <= count(r["output"]) <= MAX_TOKENS:
            continue
        n = len(dumps_line(r).encode()) + 1
        if size + n > budget:
            continue
        picked.append(r)
        per_project[proj] = per_project.get(proj, 0) + 1
        size += n
    picked.sort(key=lambda r: r["id"])
    return picked


def build(out_path: Path, cache: Path | None = None, projects=PROJECTS, target: int = TARGET,
          progress: bool = True) -> dict:
    from tqdm import tqdm

    from sim.trace.tokenizer import cache_dir, get_tokenizer

    tok = get_tokenizer()
    memo: dict[str, int] = {}

    def count(text: str) -> int:
        if text not in memo:
            memo[text] = len(tok.encode(text))
        return memo[text]

    if cache is None:
        from sim.fsio import private_tempdir

        root = cache_dir()
        cache = root / "wheels" if root is not None else private_tempdir("hybridspec-wheels-")
    rows = []
    for p in tqdm(projects, desc="build codeedit", unit="project", disable=not progress):
        old = wheel_sources(fetch_wheel(p, p.old, cache))
        new = wheel_sources(fetch_wheel(p, p.new, cache))
        rows.extend(project_edits(f"{p.name} {p.old.version}->{p.new.version}", old, new, count))
    picked = select(rows, count, target=target)
    write_jsonl(out_path, picked)
    per = {}
    for r in picked:
        per[r["id"].split(" ", 1)[0]] = per.get(r["id"].split(" ", 1)[0], 0) + 1
    return {"n": len(picked), "candidates": len(rows), "per_project": per}
