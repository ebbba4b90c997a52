"""Which result rows make one workload: the setups of a sweep's rows (every grid key but policy and batch size),
with a policy run apart on a drafter of its own joined to the workload it belongs to (sim.report, sim.sweep)."""
from __future__ import annotations

import pandas as pd


def join_setups(ok: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`ok` (result rows) with a `_setup` column naming each row's setup (its values of `keys`, the grid keys but
    policy and batch size), where a setup that differs from another only in `drafters`, a superset of the other's,
    joins it when every policy the two share uses none of the extra drafters (it ran the same: the joiner's copy
    is dropped). Why: `suffix` needs its live drafter enabled, which would hand the hybrids' over-drafters forms a
    third chain, so the paper preset runs it apart (with the baseline every setup gets), in the same workload."""
    from sim.core.policies import get_policy

    ok = ok.copy()
    ok["_setup"] = [repr(tuple(t)) for t in ok[keys].itertuples(index=False)]
    if "drafters" not in keys:
        return ok
    rest = [k for k in keys if k != "drafters"]
    ok["_rest"] = [repr(tuple(t)) for t in ok[rest].itertuples(index=False)]
    for _, same in ok.groupby("_rest", sort=False):
        sets = {s: (set(str(g["drafters"].iloc[0]).split(",")), set(g["policy"]))
                for s, g in same.groupby("_setup", sort=False)}
        for s, (mine, pols) in sets.items():
            def same_run(host):  # the shared policies use only the host's drafters
                names, hp = sets[host]
                return names < mine and all(set(get_policy(p, tuple(sorted(mine))).drafters) <= names
                                            for p in hp & pols)

            host = next((h for h in sets if h != s and same_run(h)), None)
            if host is not None:
                ok = ok[~((ok["_setup"] == s) & ok["policy"].isin(sets[host][1] & pols))]
                ok.loc[ok["_setup"] == s, "_setup"] = host
    return ok.drop(columns="_rest")


def setup_values(ok: pd.DataFrame, key: str) -> pd.Series:
    """Per setup of `join_setups`, the values of `key` its rows hold (a sorted tuple of strings): a key varies
    between setups where these differ (a joined setup holds both `drafters` values wherever it was joined)."""
    return ok.groupby("_setup")[key].agg(lambda v: tuple(sorted(set(map(str, v)))))
