"""The engine's lossless checks (sim/engine/engine.py's module docstring, items 1-3): the Allocation contract and the
chain bounds every step, the emitted buffer against the trace's output at the end (or per request as it
finishes, with streaming tables). The engine records the first violation and does not raise; callers do
(RunResult.raise_if_lossy). `Engine` owns the state; this mixin holds the checks.
"""
from __future__ import annotations

import numpy as np

from sim.core.drafters.tables import expected_outputs
from sim.engine.forms import NATIVE_STEP, WHOLE_STEP, transcribed_by


class LosslessChecks:
    """Mixin of sim.engine.engine.Engine: the lossless checks (module docstring)."""

    # the violations es_commit reports (sim/engine/native_step.py), in the order the numpy step flags them
    COMMIT_CHECKS = ("the policy admitted more draft tokens than its chain holds",
                      "the policy admitted draft tokens of a drafter it did not run this step",
                      "emitted draft tokens outside the proposed chain or its context")

    @transcribed_by(*WHOLE_STEP)
    def _flag(self, bad: np.ndarray, reqs: np.ndarray, what: str) -> None:
        """Record the first violation: `what` for the first request with bad[k] set."""
        if not self.violation and bad.any():
            self.violation = f"request {int(reqs[np.argmax(bad)])}: {what}"

    @transcribed_by(NATIVE_STEP, *WHOLE_STEP)
    def _check_chain_bounds(self, reqs: np.ndarray, rows: np.ndarray, from_n: np.ndarray, n_draft: np.ndarray,
                            m_len: np.ndarray, ng_len: np.ndarray) -> None:
        """Emitted draft tokens lie inside the chain that proposed them (n_draft <= its length), and an
        n-gram chain copies from the context only: 0 <= ng_start and ng_start + n_draft <= prompt_len + pos,
        never from the target's own future tokens (length-only requests, whose sources are synthetic, exempt)."""
        tb = self.tb
        bad = n_draft > np.where(from_n, ng_len, m_len)
        copied = from_n & (n_draft > 0) & ~tb.length_only[reqs]
        if copied.any():
            src = tb.ng_start[rows]
            bad |= copied & ((src < 0) | (src + n_draft > tb.prompt_len[reqs] + self.pos[reqs]))
        self._flag(bad, reqs, "emitted draft tokens outside the proposed chain or its context")

    def check_lossless(self) -> str:
        """'' if the run was lossless, else a one-line description of the first violation: the step checks'
        (module docstring, items 1-2), then item 3: the emitted buffer against the trace output, every
        position at its output length, and the number of tokens written (exactly once each)."""
        if self.violation:
            return self.violation
        if self.stream:  # item 3 was checked per request as it finished (_release_rows); the count here
            if self._out_violation is not None:
                return self._out_violation[1]
            short = np.nonzero(self.pos != self.tb.out_len)[0]  # a request that never finished
            if len(short):
                r = int(short[0])
                return f"request {r} ended at position {int(self.pos[r])} of {int(self.tb.out_len[r])}"
            if self.n_written != self.n_outputs:
                return f"{self.n_written} tokens emitted for {self.n_outputs} output positions (some emitted twice)"
            return ""
        tb = self.tb
        expect = expected_outputs(tb)
        bad = np.flatnonzero(expect != self.emitted_tokens)
        if len(bad):
            k = int(bad[0])
            r = int(np.searchsorted(tb.offsets, k, side="right")) - 1  # the request whose output holds slot k
            got = int(self.emitted_tokens[k])
            return (f"request {r} output position {k - int(tb.offsets[r])}: "
                    + (f"emitted token {got}, the target's is {int(expect[k])}" if got >= 0 else "never emitted"))
        short = np.nonzero(self.pos != tb.out_len)[0]
        if len(short):
            r = int(short[0])
            return f"request {r} ended at position {int(self.pos[r])} of {int(tb.out_len[r])}"
        if self.n_written != len(expect):
            return f"{self.n_written} tokens emitted for {len(expect)} output positions (some emitted twice)"
        return ""
