"""sim.bench --drafters: the policies are checked against the drafters the run enables (a single-drafter policy of
a drafter that only --drafters enables, such as `suffix`, is accepted with it and refused in one line without)."""
from argparse import Namespace

import pytest

from sim.bench import TRACES, check_args
from sim.errors import ConfigError


def test_policies_are_checked_against_the_enabled_drafters():
    args = dict(json=None, force=False, against="none")
    check_args(Namespace(drafters="dspark,ngram,suffix", **args), list(TRACES), ["suffix", "hybrid"])
    with pytest.raises(ConfigError, match="suffix"):
        check_args(Namespace(drafters=None, **args), list(TRACES), ["suffix"])
