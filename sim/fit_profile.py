"""`python -m sim.fit_profile`: Fit the synthetic DSpark profile on general text (or to recorded drafts); check it
against the published figures.

A thin command over its library, sim/api/fit_profile.py: the options, what it does, the Python API.
"""
from sim.api.fit_profile import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
