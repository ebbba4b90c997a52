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

`shape="model"` (codeedit-model.jsonl) builds the same edits the way an edit model is asked and answers
(`model_shaped`): the prompt holds the code and a change request in words that names where to change and
how (add / remove / change, the enclosing def or class, the line numbers) but not the new text, so the
changed lines must be written, not copied; the output is shaped as chat edit models answer (ModelShape):
an optional one-sentence preamble, the code in a ```python fence (the whole code, or only the changed
region with a few lines of context around each change), then an optional short explanation listing the
changes and the identifiers they touch. Every draw is seeded by the request id: reruns are byte-identical.
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

from sim.infra.errors import HybridSpecError
from sim.core.trace.formats import dumps_line, render_chat, write_jsonl

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


@dataclass(frozen=True)
class ModelShape:
    """How an edit model's answer is shaped (probabilities per request; lengths in lines). These are stated
    assumptions from public descriptions of chat edit models' answers, not fitted to any measurement:
    the preamble and explanation wrap ("Here is the updated code: ... The changes: ...") that instruction-
    tuned chat models add unless told not to; whole-file answers when asked to "generate the new file"
    (as Blazedit's prompt asks) with a minority answering with the changed part only; a few lines of
    context around each change in a partial answer (unified-diff and fast-apply conventions use 3)."""

    p_preamble: float = 0.8      # a one-sentence preamble before the code
    p_whole: float = 0.75        # the whole code (else the changed region with context)
    context_lines: int = 3       # lines kept around each change in a partial answer
    p_explanation: float = 0.7   # an explanation after the code
    max_bullets: int = 4         # at most this many change bullets in the explanation


MODEL_SHAPE = ModelShape()
MODEL_SYSTEM = "You are a code editing assistant. Apply the change request to the given code."
_PREAMBLES = ("Here is the updated code{where}:", "Here's the modified version{where} with the requested change:",
              "Sure! Below is the code{where} after applying the change:", "I've updated the code{where} as requested:",
              "Here is the revised code{where}:")
_OUTROS = ("The changes:", "Explanation of the changes:", "What changed:", "Summary of the edits:")
_VERBS = {"insert": ("Added", "Introduced"), "delete": ("Removed", "Dropped"), "replace": ("Updated", "Rewrote")}
_ASK = {"insert": "add new code", "delete": "remove code", "replace": "change the code"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")


def _enclosing(lines: list[str], i: int) -> str | None:
    """Name of the def/class whose header is the nearest one at or above line i, if any."""
    for j in range(min(i, len(lines) - 1), -1, -1):
        m = re.match(r"\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_][A-Za-z0-9_]*)", lines[j])
        if m:
            return m.group(1)
    return None


def model_shaped(rid: str, path: str, old: list[str], new: list[str], ops: list[tuple], lo: int,
                 shape: ModelShape = MODEL_SHAPE) -> tuple[str, str]:
    """(user turn, answer) of one edit shaped as an edit model is asked and answers (module docstring).
    old/new: the window's lines before and after; ops: difflib opcodes in file coordinates (window at lo)."""
    import random

    rng = random.Random(hashlib.sha256(f"{SALT}:model:{rid}".encode()).hexdigest())
    asks, bullets, spans = [], [], []  # spans: changed line ranges in `new`
    shift = 0  # new index = old index + shift, within the window
    for tag, i1, i2, j1, j2 in ops:
        a1, a2 = i1 - lo, i2 - lo
        n1, n2 = a1 + shift, a1 + shift + (j2 - j1)
        shift += (j2 - j1) - (i2 - i1)
        spans.append((n1, n2))
        where = _enclosing(old, a1)
        lines_txt = f"line {a1 + 1}" if a2 - a1 <= 1 else f"lines {a1 + 1}-{a2}"
        asks.append(f"- {_ASK[tag]} at {lines_txt}" + (f" in `{where}`" if where else ""))
        idents = sorted(set(_IDENT.findall("".join(new[n1:n2]))) - {"self", "return", "None", "True", "False"})
        rng.shuffle(idents)
        what = ", ".join(f"`{x}`" for x in idents[:2]) or "the code"
        bullets.append(f"- {rng.choice(_VERBS[tag])} {what}" + (f" in `{where}`" if where else "") + ".")
    old_code = "".join(old)
    user = (f"Code from `{path}`:\n\n```python\n{old_code}```\n\nChange request:\n" + "\n".join(asks)
            + "\n\nGenerate the updated code.")
    parts = []
    if rng.random() < shape.p_preamble:
        template = rng.choice(_PREAMBLES)
        where = f" for `{path.rsplit('/', 1)[-1]}`" if rng.random() < 0.5 else ""
        parts.append(template.format(where=where) + "\n\n")
    if rng.random() < shape.p_whole:
        body = "".join(new)
    else:  # the changed region: each change with context, gaps marked as models mark them
        keep = sorted({i for n1, n2 in spans for i in range(max(0, n1 - shape.context_lines),
                                                              min(len(new), max(n2, n1 + 1) + shape.context_lines))})
        chunks, prev = [], None
        for i in keep:
            if prev is not None and i != prev + 1:
                chunks.append("# ... existing code ...\n")
            chunks.append(new[i])
            prev = i
        body = "".join(chunks)
    if body and not body.endswith("\n"):
        body += "\n"
    parts.append(f"```python\n{body}```")
    if rng.random() < shape.p_explanation:
        picked = bullets[: shape.max_bullets]
        parts.append(f"\n\n{rng.choice(_OUTROS)}\n" + "\n".join(picked))
    return user, "".join(parts) + "\n"


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


def file_edits(label: str, path: str, old_text: str, new_text: str, count, shape: str = "exact",
               model_shape: ModelShape = MODEL_SHAPE) -> list[dict]:
    """The requests of one changed file. `count(text) -> tokens`. label: 'project old->new'. shape: "exact"
    (the diff in the prompt, the edited code as the output) or "model" (model_shaped, with `model_shape`)."""
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
        rid = f"{label}:{path}#{k}"
        if shape == "model":
            user, answer = model_shaped(rid, path, a[lo:hi], new_lines, ops, lo, model_shape)
            rows.append({"id": rid, "prompt": render_chat([("system", MODEL_SYSTEM), ("user", user)]),
                         "output": answer, "workload": "codeedit"})
            continue
        where = "" if (lo == 0 and hi == len(a)) else f" (lines {lo + 1}-{hi} of the file)"
        user = (f"Code from `{path}`{where}:\n\n{old_code}\n\nRequested change (unified diff):\n\n"
                f"{_diff(path, a[lo:hi], new_lines)}\nReply with the complete updated code.")
        prompt = render_chat([("system", SYSTEM), ("user", user)])
        rows.append({"id": rid, "prompt": prompt, "output": new_code, "workload": "codeedit"})
    return rows


def project_edits(label: str, old: dict[str, str], new: dict[str, str], count, shape: str = "exact",
                  model_shape: ModelShape = MODEL_SHAPE) -> list[dict]:
    rows = []
    for path in sorted(old):
        if path in new and old[path] != new[path]:
            rows.extend(file_edits(label, path, old[path], new[path], count, shape, model_shape))
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


SHAPES = ("exact", "model")


def build(out_path: Path, cache: Path | None = None, projects=PROJECTS, target: int = TARGET,
          progress: bool = True, shape: str = "exact", model_shape: ModelShape = MODEL_SHAPE) -> dict:
    """Build the trace into out_path. shape "exact": codeedit.jsonl; "model": codeedit-model.jsonl (the same
    release pairs and selection rules, model-shaped prompts and answers; `model_shape` other than MODEL_SHAPE
    only for a sensitivity study, sim.api.anchors.blazedit_shape_sensitivity)."""
    if shape not in SHAPES:
        raise HybridSpecError(f"unknown codeedit shape {shape!r}; choose one of: {', '.join(SHAPES)}")
    from sim.infra.progress import progress_bar

    from sim.core.trace.tokenizer import cache_dir, get_tokenizer

    tok = get_tokenizer()
    memo: dict[str, int] = {}

    def count(text: str) -> int:
        if text not in memo:
            memo[text] = len(tok.encode(text))
        return memo[text]

    if cache is None:
        from sim.infra.fsio import private_tempdir

        root = cache_dir()
        cache = root / "wheels" if root is not None else private_tempdir("hybridspec-wheels-")
    rows, shaped = [], []
    for p in progress_bar(projects, leave=True, desc="build codeedit", unit="project", disable=not progress):
        old = wheel_sources(fetch_wheel(p, p.old, cache))
        new = wheel_sources(fetch_wheel(p, p.new, cache))
        label = f"{p.name} {p.old.version}->{p.new.version}"
        rows.extend(project_edits(label, old, new, count))
        if shape == "model":
            shaped.extend(project_edits(label, old, new, count, shape, model_shape))
    picked = select(rows, count, target=target)  # the model-shaped trace keeps the exact trace's requests
    if shape == "model":
        by_id = {r["id"]: r for r in shaped}
        picked = [by_id[r["id"]] for r in picked]
    write_jsonl(out_path, picked)
    per = {}
    for r in picked:
        per[r["id"].split(" ", 1)[0]] = per.get(r["id"].split(" ", 1)[0], 0) + 1
    return {"n": len(picked), "candidates": len(rows), "per_project": per}
