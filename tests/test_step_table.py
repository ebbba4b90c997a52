"""The `table=step` and `runcal=k` options of hybrid / hybrid-price (sim/core/policies/hybrid.py: with_table,
split_options; sim/core/drafters/recalibration.py: observe_shared, RecalState(shared=True)): the engine hands a
step-table policy the verify table of the step's own shape and context, every other policy the start-up profile;
the run-level offsets pool every request's evidence; bad options are one-line errors."""
import numpy as np
import pytest
import torch

from sim.core.drafters.recalibration import RecalState, evidence, observe, observe_shared
from sim.engine.engine import Engine, EngineConfig
from sim.infra.errors import ConfigError
from sim.engine.policies import sim_policy
from sim.api.run import SimSetup, prepare

THREE = "dspark,ngram,suffix"


@pytest.fixture(scope="module")
def prep():
    return prepare(SimSetup(trace="traces/chat.jsonl", sample=12, seed=0))


class Seen(Engine):
    """Records each step's policy table and what the step charges for every token count."""

    def _step_batch(self, reqs, rows, chains, *args):
        b = super()._step_batch(reqs, rows, chains, *args)
        T, kv, n_seqs = args[2], args[3], args[4]
        self.seen = getattr(self, "seen", [])
        self.seen.append((b.verify_cost_ms.numpy().copy(), self._true_table(T, len(reqs), kv, n_seqs)))
        return b


def test_a_step_table_policy_decides_with_the_step_table(prep):
    cfg = EngineConfig(batch_size=8)
    step = Seen(prep.tables, prep.arrivals, sim_policy("hybrid:table=step"), prep.cost, cfg)
    assert step.native_step() is None and step.array_form() is None  # no fast form reads the start-up table
    assert step.run().lossless
    assert step.seen and all(np.array_equal(got, want) for got, want in step.seen)
    plain = Seen(prep.tables, prep.arrivals, sim_policy("hybrid"), prep.cost, cfg)
    assert plain.run().lossless
    start = plain.decision_table.numpy()
    assert all(np.array_equal(got, start) for got, _ in plain.seen)
    # the two tables differ where it matters: the start-up profile prices slots at 8,192 tokens of context per
    # dummy request, so it is dearer than a chat step at batch 8
    assert any(not np.allclose(got[: len(want)], want) for (got, want) in plain.seen)


def test_step_table_changes_the_allocation_not_the_definitions(prep):
    cfg = EngineConfig(batch_size=8)
    a = Engine(prep.tables, prep.arrivals, sim_policy("hybrid"), prep.cost, cfg).run()
    b = Engine(prep.tables, prep.arrivals, sim_policy("hybrid:table=step"), prep.cost, cfg).run()
    assert a.lossless and b.lossless
    assert int(a.steps["emitted"].sum()) == int(b.steps["emitted"].sum())  # the same tokens, scheduled otherwise
    verified = lambda r: int(r.steps["verified_model"].sum() + r.steps["verified_ngram"].sum())  # noqa: E731
    assert verified(b) != verified(a)  # the cheaper step table admits other slots


def test_option_names_forms_and_bad_values():
    for spec, want in (("hybrid:table=step", "hybrid:table=step"), ("hybrid:table=startup", "hybrid"),
                       ("hybrid:table=step:runcal=16", "hybrid:runcal=16:table=step"),
                       ("hybrid-price:recal=4:table=step", "hybrid-price:recal=4:table=step")):
        pol = sim_policy(spec)
        assert pol.name == want
        assert (pol.sim_fn is None) == (want != "hybrid")  # only the plain name keeps its fast form
    assert sim_policy("hybrid:table=step").step_table and not sim_policy("hybrid").step_table
    ad = sim_policy("adaptive:table=step")  # the single-drafter reference priced the same way (axis_check)
    assert ad.step_table and ad.sim_fn is None and ad.vllm is None and sim_policy("adaptive").vllm is not None
    assert sim_policy("adaptive:table=startup").name == "adaptive"
    run = sim_policy("hybrid:runcal=16:table=step", THREE)
    assert run.recal == 16.0 and run.recal_shared and run.step_table and run.drafters == ("dspark", "ngram", "suffix")
    for bad, what in (("hybrid:table=x", "table"), ("hybrid:runcal=0", "runcal"),
                      ("hybrid:recal=4:runcal=4", "alternatives"), ("hybrid-price:table=", "table"),
                      ("adaptive:table=now", "table")):
        with pytest.raises(ConfigError, match=what):
            sim_policy(bad)


def test_shared_offsets_pool_every_requests_evidence():
    conf = torch.tensor([[0.6] * 4, [0.9] * 4, [0.5] * 4], dtype=torch.float32)
    length, acc, e = torch.tensor([4, 4, 4]), torch.tensor([4, 1, 0]), torch.tensor([5, 2, 1])
    b, P = observe_shared(torch.zeros(1, dtype=torch.float64), torch.full((1,), 4.0, dtype=torch.float64),
                          conf, length, acc, e)
    g, h = evidence(torch.zeros(3, dtype=torch.float64), conf, length, acc, e)
    assert P.item() == pytest.approx(4.0 + h.sum().item()) and b.item() == pytest.approx(g.sum().item() / P.item())
    # one request's update with the pooled numbers is the per-request rule on one row
    b1, P1 = observe(torch.zeros(1, dtype=torch.float64), torch.full((1,), 4.0, dtype=torch.float64),
                     conf[:1], length[:1], acc[:1], e[:1])
    assert b1.item() == pytest.approx(g[0].item() / (4.0 + h[0].item()))
    st = RecalState(("dspark", "ngram"), n=10, k=4.0, shared=True)
    st.observe(np.array([0, 3, 7]), {"ngram": (conf, length)}, {"ngram": acc}, e)
    cur, old = st.offsets(np.array([9, 0]))  # request 9 never stepped: it gets the run's offset
    assert cur["ngram"][0] == cur["ngram"][1] == pytest.approx(b.item())
    assert (old["ngram"] == 0).all() and (cur["dspark"] == 0).all()
    assert st.b.shape == (1, 2)  # fixed size: one row for the run, whatever the trace


def test_runcal_learns_the_code_edit_bias_on_the_run():
    prep = prepare(SimSetup(trace="traces/codeedit.jsonl", sample=6, seed=0))
    eng = Engine(prep.tables, prep.arrivals, sim_policy("hybrid:runcal=16"), prep.cost, EngineConfig(batch_size=4))
    assert eng.native_step() is None
    assert eng.run().lossless
    st = eng.recal
    assert st.shared and st.b.shape == (1, 2) and (st.P > 16.0).all()
    # code edits copy more than the general text the n-gram calibrator was fitted on: its run offset goes up
    assert st.b[0, 1] > 0
