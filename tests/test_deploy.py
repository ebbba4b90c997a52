"""The verdict's tiers and flags (sim/core/deploy.py): a policy's tier follows what it declares, the `vllm serve`
line maps back through --speculative-config / --additional-config onto the same policy, and running those flags
reproduces the recommended row's throughput exactly."""
import json
from pathlib import Path
import shlex

import pytest

from sim.api.plugin_menu import PLUGIN as PLUGIN_MENU
from sim.core.deploy import Deployment, serve_flags, tier
from sim.core.policies import get_policy
from sim.core.vllm import plugin_settings, speculative_config
from sim.infra.errors import ConfigError

from conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]

TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"
DEP = Deployment(model="qwen3-8b", hf_id="Qwen/Qwen3-8B", version="0.33", drafter="dspark-qwen3-b7", block=7,
                 ngram_range=(2, 5))
ALL = ("dspark", "ngram", "suffix")


@pytest.mark.parametrize("policy, want", [
    ("none", "vllm"), ("adaptive", "vllm"), ("model-fixed:7", "vllm"), ("vllm-ngram:16", "vllm"), ("suffix", "vllm"),
    # over the suffix chain too, hybrid-vllm is more than the plugin runs (its two chains: the last test)
    ("hybrid-vllm", "engine"), ("hybrid-vllm:slots=32:skip", "engine"), ("hybrid", "engine"),
    ("ngram-fixed:32", "engine"), ("hybrid-price", "engine"), ("hybrid-tree", "tree"), ("oracle", "bound"),
    ("suffix-adaptive", "newer"), ("ngram-mtp", "newer"), ("arctic", "newer")])
def test_tiers_follow_what_the_policy_declares(policy, want):
    assert tier(get_policy(policy, ALL)) == want


def _spec_args(line: str) -> tuple[str, str | None]:
    argv = shlex.split(line)
    spec = argv[argv.index("--speculative-config") + 1]
    extra = argv[argv.index("--additional-config") + 1] if "--additional-config" in argv else None
    return spec, extra


@pytest.mark.parametrize("policy", ["adaptive", "model-fixed:5", "vllm-ngram:16", "hybrid-vllm:slots=32",
                                    "hybrid-vllm:margin=0.5:slots=16:skip", "hybrid-vllm", "suffix:8",
                                    "hybrid-vllm:slots=32:skip:runcal=64", "hybrid-vllm:runcal=0.5",
                                    *PLUGIN_MENU])  # every setting the plugin menu reports, the tail ones too
def test_the_printed_flags_map_back_onto_the_same_policy(policy):
    drafters = ALL if policy.startswith("suffix") else ("dspark", "ngram")  # the plugin runs two chains
    line, why = serve_flags(get_policy(policy, drafters), DEP, 4)
    v2 = "" if policy.startswith("suffix") else "VLLM_USE_V2_MODEL_RUNNER=1 "  # V2 runs no suffix (V1 does)
    assert line.startswith(v2 + "vllm serve Qwen/Qwen3-8B --max-num-seqs 4 ")
    assert why == ("needs pip install arctic-inference==0.1.1" if policy.startswith("suffix") else None)
    spec, extra = _spec_args(line)
    m = speculative_config(spec, DEP.ngram_range, DEP.block, plugin_settings(extra))
    assert get_policy(m.policy, drafters).name == get_policy(policy, drafters).name


def test_no_flags_without_a_checkpoint_for_the_target_and_none_for_designs():
    llama = Deployment(model="llama-3.1-8b", hf_id="meta-llama/Llama-3.1-8B-Instruct", version="0.33",
                       drafter="dspark-qwen3-b7", block=7, ngram_range=(2, 5))
    line, why = serve_flags(get_policy("adaptive"), llama, 4)
    assert line is None and "no published dspark drafter checkpoint for llama-3.1-8b" in why
    line, _ = serve_flags(get_policy("vllm-ngram:8"), llama, 4)  # n-gram needs no checkpoint
    assert line.startswith("VLLM_USE_V2_MODEL_RUNNER=1 vllm serve meta-llama/Llama-3.1-8B-Instruct")
    assert serve_flags(get_policy("hybrid"), DEP, 4) == (None, "simulated only (vLLM's engine would need changes)")
    assert serve_flags(get_policy("none"), DEP, 8) == ("VLLM_USE_V2_MODEL_RUNNER=1 vllm serve Qwen/Qwen3-8B "
                                                       "--max-num-seqs 8", None)


@pytest.mark.parametrize("extra, spec, err", [
    ('{"hybrid_spec": {"ext_max": 3}}', '{"method": "dspark", "enable_adaptive_verification": true}',
     "hybrid_spec.ext_max = 3 but the run's n-gram calibrator was fitted with ext_max 1024"),
    ('{"hybrid_spec": {"wings": 3}}', '{"method": "dspark", "enable_adaptive_verification": true}',
     "hybrid_spec.wings is not a setting of the plugin"),
    ('{"hybrid_spec": {"n_min": 3}}', '{"method": "dspark", "enable_adaptive_verification": true}',
     "n_min/n_max = 3..5 but the run's n-gram calibrator was fitted for 2..5"),
    ('{"hybrid_spec": {"slots": 32}}', '{"method": "dspark", "enable_adaptive_verification": true}',
     "needs --speculative-config's num_speculative_tokens = 32"),
    ('{"hybrid_spec": {"online_window": "x"}}', '{"method": "dspark", "enable_adaptive_verification": true}',
     "online_window must be an integer"),
    ('{"hybrid_spec": {"slots": 8}}', '{"method": "ngram", "num_speculative_tokens": 8}',
     "needs --speculative-config with method 'dspark'"),
    ('{"hybrid_spec": {"slots": 32}}', '{"method": "dspark", "num_speculative_tokens": 8, '
     '"enable_adaptive_verification": true}', "slots = 32 but --speculative-config has num_speculative_tokens = 8"),
    ('{"hybrid_spec": {"skip": "yes"}}', '{"method": "dspark", "enable_adaptive_verification": true}',
     "skip must be true or false"),
    ('{"hybrid_spec": [1]}', '{"method": "dspark", "enable_adaptive_verification": true}', "must be a JSON object"),
    ('{"hybrid_spec": {"slots": NaN}}', '{"method": "dspark", "enable_adaptive_verification": true}', "finite"),
])
def test_bad_additional_config_is_one_line(extra, spec, err):
    with pytest.raises(ConfigError, match=err) as e:
        speculative_config(spec, (2, 5), 7, plugin_settings(extra))
    assert "\n" not in str(e.value)


def test_the_plugins_own_default_ext_max_is_accepted():
    """Every plugin field has a counterpart (PluginSettings' sim): ext_max at the calibrator's value maps."""
    from real.vllm_plugin.config import HybridSpecConfig

    extra = '{"hybrid_spec": {"ext_max": %d, "online_window": 8, "compile": false}}' % HybridSpecConfig().ext_max
    spec = '{"method": "dspark", "enable_adaptive_verification": true}'
    assert speculative_config(spec, (2, 5), 7, plugin_settings(extra)).policy == "hybrid-vllm"


def test_running_the_printed_flags_reproduces_the_recommendation(tmp_path):
    base = ["--trace", TINY, "--workers", "1", "--no-progress", "--batch-size", "4"]
    p = run_cli_inprocess("sim.api.run", *base, "--policy", "vllm-ngram:8", "--policy", "hybrid-vllm:slots=16",
                          "--policy", "none", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    head = next(x for x in lines if x.startswith("batch 4: recommended "))
    rec = head.split("recommended ")[1].split(",")[0]
    flags = lines[lines.index(head) + 1].strip()
    spec, extra = _spec_args(flags)
    again = ["--speculative-config", spec] + (["--additional-config", extra] if extra else [])
    q = run_cli_inprocess("sim.api.run", *base, *again, "--format", "json", cwd=tmp_path)
    assert q.returncode == 0, q.stderr
    (row,) = json.loads(q.stdout)
    r = run_cli_inprocess("sim.api.run", *base, "--policy", rec, "--no-baseline", "--format", "json", cwd=tmp_path)
    (want,) = json.loads(r.stdout)
    assert row["policy"] == want["policy"] == rec
    assert row["output_throughput_tok_s"] == want["output_throughput_tok_s"]


def test_a_sweep_grid_takes_the_policy_none():
    from sim.api.sweep import expand

    cells = expand({"policy": ["none", "vllm-ngram:32"], "batch_size": [4]})
    assert sorted(c.policy for c in cells) == ["adaptive", "none", "vllm-ngram:32"]


def test_the_paper_report_says_what_to_serve_per_batch_size():
    import pandas as pd

    from sim.api.report import serve_table

    t = pd.DataFrame({"none": [100.0, 300.0], "adaptive": [400.0, 800.0], "vllm-ngram:32": [1000.0, 900.0],
                      "hybrid-vllm:slots=32": [950.0, 1150.0], "hybrid": [1010.0, 1100.0], "oracle": [1100.0, 1300.0]},
                     index=[4, 128])
    lines = serve_table(t, "dspark,ngram").splitlines()
    assert lines[2] == "| 4 | vllm-ngram:32 | 2.500 | vLLM | vllm-ngram:32 | 2.500 | hybrid | 2.525 | 10.00 |"
    assert lines[3] == "| 128 | hybrid-vllm:slots=32 | 1.438 | plugin | vllm-ngram:32 | 1.125 | hybrid | 1.375 | 3.83 |"


def test_hybrid_vllm_over_a_chain_the_plugin_lacks_is_simulated_only():
    """The plugin runs DSpark's and the n-gram chain: hybrid-vllm over the suffix tree too gets no plugin flags."""
    from sim.core.deploy import tier
    from sim.core.policies import get_policy

    assert tier(get_policy("hybrid-vllm:slots=32")) == "plugin"
    assert tier(get_policy("hybrid-vllm:slots=32", ("dspark", "ngram", "suffix"))) == "engine"
    assert tier(get_policy("suffix", ("dspark", "ngram", "suffix"))) == "vllm"
    pol = get_policy("hybrid-vllm:slots=32:skip:runcal=64")
    assert tier(pol) == "plugin" and ("runcal", 64) in pol.vllm.plugin_config


def test_a_policy_run_with_its_own_drafter_joins_its_workload():
    """The paper preset runs `suffix` alone with the suffix drafter enabled: the report shows it in the same
    workload and serve table (a vLLM method), while two runs of one policy on different drafters stay apart."""
    import pandas as pd

    from sim.api.report import workloads, serve_table
    from sim.core.config import DEFAULT_DRAFTERS, WITH_SUFFIX

    def row(policy, drafters, tok_s, trace="traces/codeedit.jsonl"):
        return {"status": "ok", "trace": trace, "drafters": drafters, "policy": policy, "batch_size": 4,
                "output_throughput_tok_s": tok_s}

    df = pd.DataFrame([row("none", DEFAULT_DRAFTERS, 100.0), row("adaptive", DEFAULT_DRAFTERS, 400.0),
                       row("hybrid-vllm:slots=32", DEFAULT_DRAFTERS, 900.0), row("suffix", WITH_SUFFIX, 1000.0),
                       row("adaptive", WITH_SUFFIX, 400.0)])  # the sweep's baseline of the suffix setup: one copy kept
    ((name, g),) = workloads(df)
    assert name == "codeedit" and sorted(g["policy"]) == ["adaptive", "hybrid-vllm:slots=32", "none", "suffix"]
    assert g.loc[g["policy"] == "adaptive", "drafters"].tolist() == [DEFAULT_DRAFTERS]
    t = g.pivot_table(index="batch_size", columns="policy", values="output_throughput_tok_s", aggfunc="first")
    line = serve_table(t, dict(zip(g["policy"], g["drafters"]))).splitlines()[2]
    assert line.startswith("| 4 | suffix | 2.500 | vLLM | suffix | 2.500 |")
    # hybrid-vllm over three drafters is another design (a third chain): its own workload, labelled
    both = pd.concat([df, pd.DataFrame([row("hybrid-vllm:slots=32", WITH_SUFFIX, 950.0)])])
    names = [n for n, _ in workloads(both)]
    assert len(names) == 2 and all("drafters=" in n for n in names)


def test_vllm_mains_tier_is_a_column_of_its_own_never_recommended():
    """Issue 59 point 3: vLLM main's policies (Policy.vllm.main: suffix-adaptive, ngram-mtp; not Arctic's plugin) get
    paper.md's column "best on vLLM main (unreleased)" with their ratio over adaptive, joined from the setup that
    ran them with the suffix drafter; the recommendation stays among released vLLM and the plugin even where vLLM
    main is faster; ngram-mtp is said to be absent by the target's MTP layers, not by its name."""
    import pandas as pd

    from sim.api.report import MAIN_COLUMN, main_tier_line, serve_table, workloads
    from sim.core.config import DEFAULT_DRAFTERS, WITH_SUFFIX
    from sim.core.deploy import on_vllm_main
    from sim.core.vllm import VllmRun

    assert [on_vllm_main(get_policy(p, ALL)) for p in ("suffix-adaptive", "ngram-mtp", "arctic", "suffix")] == [
        True, True, False, False]
    with pytest.raises(ConfigError, match="vLLM main"):
        VllmRun("suffix", main=True)  # vLLM main is a build no release has: it names one

    def row(policy, drafters, tok_s, batch):
        return {"status": "ok", "trace": "traces/codeedit.jsonl", "model": "qwen3-8b", "drafters": drafters,
                "policy": policy, "batch_size": batch, "output_throughput_tok_s": tok_s}

    rows = []
    for b, main in ((4, 1200.0), (128, 700.0)):  # vLLM main beats every other setup at 4, trails at 128
        rows += [row("none", DEFAULT_DRAFTERS, 100.0, b), row("adaptive", DEFAULT_DRAFTERS, 400.0, b),
                 row("vllm-ngram:32", DEFAULT_DRAFTERS, 1000.0, b), row("hybrid", DEFAULT_DRAFTERS, 1100.0, b),
                 row("suffix", WITH_SUFFIX, 800.0, b), row("suffix-adaptive", WITH_SUFFIX, main, b),
                 row("adaptive", WITH_SUFFIX, 400.0, b)]
    ((_, g),) = workloads(pd.DataFrame(rows))
    t = g.pivot_table(index="batch_size", columns="policy", values="output_throughput_tok_s", aggfunc="first")
    lines = serve_table(t, dict(zip(g["policy"], g["drafters"]))).splitlines()
    assert f"| best in vLLM as released | / adaptive | {MAIN_COLUMN} | / adaptive | best simulated-only" in lines[0]
    assert lines[2] == ("| 4 | vllm-ngram:32 | 2.500 | vLLM | vllm-ngram:32 | 2.500 | suffix-adaptive | 3.000 | hybrid "
                        "| 2.750 | 10.00 |")
    assert lines[3].startswith("| 128 | vllm-ngram:32 | 2.500 | vLLM | vllm-ngram:32 | 2.500 | suffix-adaptive | 1.750 |")
    (line, _) = main_tier_line(g)
    assert "`suffix-adaptive`" in line and "never recommended" in line
    assert "`ngram-mtp` needs a target with MTP layers, which qwen3-8b has not" in line
    mtp = g.assign(model="deepseek-v4-flash")  # a target with an MTP layer: ngram-mtp was left out, not impossible
    assert "`ngram-mtp` not run in this sweep" in main_tier_line(mtp)[0]
    # a sweep that ran no vLLM main policy: neither the column nor the line
    released = g[g["policy"] != "suffix-adaptive"]
    t2 = released.pivot_table(index="batch_size", columns="policy", values="output_throughput_tok_s", aggfunc="first")
    assert MAIN_COLUMN not in serve_table(t2, dict(zip(released["policy"], released["drafters"])))
    assert main_tier_line(released) == []
