"""No import circle between the project's modules: every `import` in sim/ and real/ (at the top of a module
or inside a function: a lazy import still runs back up the layers) forms a graph, and its only strongly
connected components of more than one module are the ones listed in KNOWN (empty: there are none), each with
the issue that owns it.
A new circle fails here; a listed one that is gone must be taken off the list."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# circles in code other work owns, to be broken there (sorted module names); none is left
KNOWN: set[tuple[str, ...]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in ("sim", "real"):
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a name imported from a package is that submodule if one
    exists, else the package)."""
    mods = _modules()

    def resolve(name: str):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for m, p in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Import):
                deps.update(resolve(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    deps.add(sub if sub in mods else resolve(node.module))
        graph[m] = deps - {None, m}
    return graph


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index, low, stack, on, out = {}, {}, [], set(), set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.add(tuple(sorted(comp)))
    return out


def test_the_walker_finds_a_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(g) == {("a", "b", "c")}


def test_no_import_circle_but_the_known_ones():
    found = cycles(import_graph())
    assert found - KNOWN == set(), f"new import circle(s): {sorted(found - KNOWN)}"
    assert KNOWN - found == set(), f"gone, take off KNOWN: {sorted(KNOWN - found)}"
