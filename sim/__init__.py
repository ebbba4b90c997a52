"""hybridspec's simulator and shared core, housed by role (docs/design.md, "Layout"): sim/infra (files, errors, CLI
plumbing), sim/core (what the simulator and every real engine share), sim/engine (the simulated engine and its fast
forms), sim/api (what the commands run) and the commands at the top of this folder (`python -m sim.run`, ...)."""
