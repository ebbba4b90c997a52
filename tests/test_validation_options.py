"""The validation commands read their options once, at the command line, into frozen dataclasses: nothing below the
command can change them (real/validation/options.py), and the vLLM flags travel as a mapping."""
import dataclasses

import pytest

from real.validation.options import ProfileOptions, ValidateOptions
from real.validation.profile import parse_args as profile_args
from real.validation.validate import parse_args as validate_args
from real.validation.vllm.config import from_args, given_flags


def test_validate_options_from_the_command_line_are_frozen():
    argv = ["--quick", "--policy", "none", "--batch-size", "2", "--vllm-model", "Qwen/Qwen3-4B"]
    o = ValidateOptions.from_namespace(validate_args(argv), argv)
    assert (o.quick, o.policy, o.batch_size, o.argv) == (True, ("none",), (2,), tuple(argv))
    assert o.vllm == {"model": "Qwen/Qwen3-4B"} and given_flags(o.vllm) == ["--vllm-model"]
    assert from_args(o.vllm, seed=o.seed).model == "Qwen/Qwen3-4B"
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.out = "elsewhere"  # the pipeline resolves its defaults into locals, never into the options
    assert ValidateOptions.from_namespace(validate_args([]), []).vllm == {}


def test_profile_options_from_the_command_line():
    argv = ["--quick", "--batch-size", "1", "--batch-size", "4"]
    o = ProfileOptions.from_namespace(profile_args(argv), argv)
    assert (o.quick, o.batch_size, o.policy, o.vllm) == (True, (1, 4), None, {})
