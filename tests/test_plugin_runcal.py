"""The plugin's online recalibration (hybrid_spec.runcal, `hybrid-vllm:...:runcal=k`) on the simulator's side: the
policy, its vLLM flags both ways, its refusals, no host sync in the plugin's step, and that it moves the n-gram
chains' estimates on code edits. The plugin's update itself against the simulator's rule: tests/test_vllm_plugin.py
(test_runcal_offsets_and_choices_are_the_simulators_rule)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from real.vllm_plugin import checks
from real.vllm_plugin.config import HybridSpecConfig
from sim.core.policies import get_policy
from sim.core.vllm import plugin_settings, speculative_config

ROOT = Path(__file__).resolve().parent.parent
DSPARK = '{"method": "dspark", "num_speculative_tokens": 32, "enable_adaptive_verification": true}'


def _sim(*args):
    return subprocess.run([sys.executable, "-m", "sim.run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_policy_carries_the_run_level_offsets_and_the_plugin_field():
    pol = get_policy("hybrid-vllm:slots=32:skip:runcal=64")
    assert pol.name == "hybrid-vllm:slots=32:skip:runcal=64"
    assert pol.recal == 64 and pol.recal_shared and pol.plan_fn is not None
    assert dict(pol.vllm.plugin_config) == {"slots": 32, "skip": True, "runcal": 64}
    assert get_policy("hybrid-vllm:runcal=4").recal == 4 and get_policy("hybrid-vllm").recal is None


def test_additional_config_maps_back_to_the_same_policy():
    body = plugin_settings('{"hybrid_spec": {"slots": 32, "skip": true, "runcal": 64}}')
    got = speculative_config(DSPARK, (2, 5), 7, plugin=body).policy
    assert got == "hybrid-vllm:slots=32:skip:runcal=64"
    assert HybridSpecConfig(slots=32, skip=True, runcal=64).sim_policy() == got


@pytest.mark.parametrize("args,needle", [
    (["--policy", "hybrid-vllm:runcal=0"], "runcal"),
    (["--policy", "hybrid-vllm:runcal=1e9"], "runcal must be a prior precision in"),
    (["--speculative-config", DSPARK, "--additional-config", '{"hybrid_spec": {"slots": 32, "runcal": -3}}'],
     "hybrid_spec.runcal"),
    (["--speculative-config", DSPARK, "--additional-config", '{"hybrid_spec": {"slots": 32, "runcal": "64"}}'],
     "hybrid_spec.runcal"),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 8}',
      "--additional-config", '{"hybrid_spec": {"skip": true}}'], "needs --speculative-config with method 'dspark'"),
])
def test_bad_recalibration_or_skip_settings_are_one_line_exit_2(args, needle):
    r = _sim("--limit", "2", "--batch-size", "1", *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_skip_on_several_ranks_is_refused_at_start_up():
    with pytest.raises(Exception, match="tensor and data parallel size 1"):
        HybridSpecConfig(skip=True).check_vllm(7, 7, cpu_build=False, ranks=2)


@pytest.mark.parametrize("R", [1, 8])
def test_the_recalibrated_step_makes_no_host_sync_and_no_upload(R):
    """On the meta device a host read of a device value raises; a host-to-device copy is listed."""
    plain = checks.audit_step(R, max_reqs=16)
    rc = checks.audit_step(R, max_reqs=16, cfg=HybridSpecConfig(runcal=64))
    assert rc["h2d"] == [] and plain["h2d"] == []
    assert rc["observe"] > plain["observe"]  # the update really runs in the step


def test_recalibration_moves_the_ngram_estimates_on_code_edits(tmp_path):
    """On code edits the general-text calibration under-states the n-gram chains' acceptance: with runcal the
    learnt offset is positive, so adaptive verification admits more n-gram slots."""
    r = _sim("--trace", "traces/codeedit.jsonl", "--sample", "12", "--batch-size", "4", "--no-baseline",
             "--policy", "hybrid-vllm:slots=32", "--policy", "hybrid-vllm:slots=32:runcal=64",
             "--format", "json", "--no-progress")
    assert r.returncode == 0, r.stderr
    rows = {row["policy"]: row for row in json.loads(r.stdout)}
    plain, rc = rows["hybrid-vllm:slots=32"], rows["hybrid-vllm:slots=32:runcal=64"]
    assert rc["draft_tokens"] > plain["draft_tokens"]
    assert rc["lossless"] and plain["lossless"]
