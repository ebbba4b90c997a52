"""The house's arrows point one way: every import in sim/ and real/ (at the top of a module or inside a function)
goes down the layers below or stays in its own, no module imports a command, and no module imports another's
private name. The layers, bottom up (docs/design.md, "Layout"):

  0 infra     sim.infra                                           errors, files, caches, CLI plumbing, pages
  1 core      sim.core                                            step contract, policies, drafters, cost, traces
  2 engines   sim.engine | real.engine, real.drafter | real.vllm_plugin
  3 api       sim.api | real.validation                           what the commands run
  4 commands  sim/<name>.py, real/<name>.py (thin: `python -m sim.run`, `python real/validate.py`)

Within the engines layer the simulator never imports a real engine, the vLLM plugin imports only the core and
infra (a vLLM process must not load the simulator), and the torch engine extends the simulator's engine through
its public interface. The simulator's API never imports real/.
"""
from __future__ import annotations

import ast

import pytest

from test_import_cycles import ROOT, _modules, import_graph

LAYERS = (("sim.infra", 0), ("sim.core", 1), ("sim.engine", 2), ("real.engine", 2), ("real.drafter", 2),
          ("real.vllm_plugin", 2), ("sim.api", 3), ("real.validation", 3))


def layer(mod: str) -> int:
    """The layer of a module; a module directly under sim/ or real/ (not a package) is a command."""
    for prefix, n in LAYERS:
        if mod == prefix or mod.startswith(prefix + "."):
            return n
    if mod in ("sim", "real"):
        return 0  # the packages' own __init__ (a docstring)
    return 4


def is_command(mod: str, path) -> bool:
    """A module run as a program: a package's __main__, or one with an `if __name__ == "__main__"` block."""
    if mod.endswith(".__main__") or path.name == "__main__.py":
        return True
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) and "__name__" in ast.unparse(node.test):
            return True
    return False


def wrong_arrows(graph: dict[str, set[str]], commands: set[str]) -> list[str]:
    """Every import that climbs a layer or breaks a rule of the engines layer, as 'a -> b (why)'."""
    bad = []
    for a, deps in graph.items():
        for b in deps:
            why = None
            if b in commands:
                why = "imports a command"
            elif layer(b) > layer(a):
                why = f"climbs from layer {layer(a)} to {layer(b)}"
            elif a.startswith("sim.engine") and b.startswith("real."):
                why = "the simulator imports a real engine"
            elif a.startswith("sim.api") and b.startswith("real."):
                why = "the simulator's API imports real/"
            elif a.startswith("real.vllm_plugin") and layer(b) >= 2 and not b.startswith("real.vllm_plugin"):
                why = "the vLLM plugin imports more than the core"
            if why:
                bad.append(f"{a} -> {b} ({why})")
    return sorted(bad)


def private_imports(paths) -> list[str]:
    """`from project.module import _name` where the module is not the importer's own: 'file:line module._name'."""
    bad = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] in ("sim", "real"):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}")
    return bad


def test_the_rules_catch_what_they_name():
    g = {"sim.core.x": {"sim.engine.y"}, "sim.engine.y": {"real.engine.z"}, "real.vllm_plugin.p": {"sim.engine.y"},
         "sim.api.a": {"sim.run"}, "sim.infra.i": set(), "real.validation.v": {"sim.api.a", "real.engine.z"}}
    got = wrong_arrows(g, {"sim.run"})
    assert got == ["real.vllm_plugin.p -> sim.engine.y (the vLLM plugin imports more than the core)",
                   "sim.api.a -> sim.run (imports a command)",
                   "sim.core.x -> sim.engine.y (climbs from layer 1 to 2)",
                   "sim.engine.y -> real.engine.z (the simulator imports a real engine)"]
    assert layer("sim.run") == 4 and layer("real.validate") == 4 and layer("sim.core.policies.hybrid") == 1


def test_no_import_climbs_a_layer_and_no_module_imports_a_command():
    mods = _modules()
    commands = {m for m, p in mods.items() if is_command(m, p)}
    assert wrong_arrows(import_graph(), commands) == []


def test_every_command_is_a_thin_top_level_module():
    """A command lives at the top of sim/ or real/ (or is a package's __main__) and holds no library: it imports its
    `main` and runs it (at most a few lines of path set-up besides)."""
    mods = _modules()
    for m, p in mods.items():
        if not is_command(m, p):
            continue
        assert layer(m) == 4 or p.name == "__main__.py", f"{m} is a command inside a library package"
        defs = [n for n in ast.parse(p.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert p.name == "__main__.py" or not defs, f"{m} defines {[d.name for d in defs]}: move them to its library"


def test_no_name_at_the_top_of_real_shadows_the_standard_library():
    """`python real/X.py` puts real/ first on sys.path, where a module or package named like one of the standard
    library's (real/profile.py once did: cProfile imports `profile`) would be imported in its place. (sim/'s commands
    run as `python -m sim.X`, which puts the checkout's root there, not sim/.)"""
    import sys

    top = {p.stem for p in (ROOT / "real").iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert sorted(top & sys.stdlib_module_names) == []


def test_no_module_imports_another_modules_private_name():
    paths = [*(ROOT / "sim").rglob("*.py"), *(ROOT / "real").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    assert private_imports(paths) == []


@pytest.mark.parametrize("pkg", ["sim", "real"])
def test_nothing_but_commands_and_packages_at_the_top(pkg):
    """The top of sim/ and real/ holds only the commands and the layer packages (the 33 loose modules are gone)."""
    mods = _modules()
    top = {m for m in mods if m.count(".") == 1 and (ROOT / pkg / (m.split(".")[1] + ".py")).is_file()
           and m.startswith(pkg + ".")}
    loose = sorted(m for m in top if not is_command(m, mods[m]))
    assert loose == [], f"library modules at the top of {pkg}/: {loose}"


def test_the_vllm_plugin_loads_only_the_core_it_uses():
    """vLLM imports the plugin's entry point in every process: it must not load the simulator (engine, API), the
    policy catalog, or another real engine; only the hybrid's own family and its helpers."""
    import subprocess
    import sys

    code = ("import sys, real.vllm_plugin.plugin\n"
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('sim', 'real'))))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                            timeout=120).stdout.split()
    assert "real.vllm_plugin.plugin" in loaded
    outside = [m for m in loaded if layer(m) > 1 and not m.startswith("real.vllm_plugin") and m not in ("sim", "real")]
    assert outside == []
    assert not {"sim.core.policies.catalog", "sim.core.policies.multi", "sim.core.drafters.suffix"} & set(loaded)
