"""Build hook (pyproject.toml holds the rest): the packages, and the part of models/ that an installed wheel reads.

setuptools ships package data only from inside a package, and models/ sits beside the packages, so the wheel
maps it in as the data-only package sim.data (package_dir): models/calibrators/*.json, the n-gram calibrators
that the vLLM plugin loads, land in site-packages/sim/data/calibrators/, where sim/infra/paths.py (MODELS)
looks for them when there is no checkout. The package list is found at build time, as pyproject.toml's
packages.find did, so a new package needs no entry here.
"""
from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["sim*", "real*"]), "sim.data"],
      package_dir={"sim.data": "models"},
      package_data={"sim.data": ["calibrators/*.json"]})
