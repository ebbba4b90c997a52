"""`python -m sim.plugin_menu`: the vLLM plugin's settings against the whole menu a vLLM user can turn on.

A thin command over its library, sim/api/plugin_menu.py: the options, what it does, the Python API.
"""
from sim.api.plugin_menu import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
