"""notebooks/policy_tuning.ipynb runs top to bottom on a few requests and prints the best setting of the vLLM plugin
with the `vllm serve` line that runs it; the committed copy carries its outputs (a static SVG among them), tunes
only settings a user can deploy, on a trace the reports do not evaluate."""
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NB = ROOT / "notebooks" / "policy_tuning.ipynb"


@pytest.mark.extended
def test_policy_tuning_notebook(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("HYBRIDSPEC_NB_SAMPLE", "6")
    monkeypatch.setenv("HYBRIDSPEC_NB_OUT", str(tmp_path / "out"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(NB, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                     if o.get("output_type") == "stream")
    assert "best: --policy hybrid-vllm:" in text and "0 failed" in text
    assert re.search(r"^(VLLM_USE_V2_MODEL_RUNNER=1 )?vllm serve \S+ --max-num-seqs 4 ", text, re.M)  # the line that serves the pick
    assert any("application/vnd.plotly.v1+json" in o.get("data", {})
               for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    # the only folder of this machine its outputs may name is the one the test gave it
    assert not machine_paths(outputs_text(nb).replace(str(tmp_path / "out"), "out/policy_tuning"))


# an absolute path on a POSIX or Windows machine (a home, a checkout, a temporary folder)
_MACHINE_PATH = re.compile(r"(?<![\w.:/])(?:/(?:home|Users|work|tmp|root|mnt|opt|var|srv|private|data)/[^\s'\",]+"
                           r"|[A-Za-z]:\\[^\s'\",]+)")


def machine_paths(text: str) -> list[str]:
    return _MACHINE_PATH.findall(text)


def outputs_text(nb) -> str:
    """Every text a code cell's outputs hold (streams, results, errors; plotly JSON and SVG included)."""
    import json

    return "\n".join(json.dumps(o) for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))


def test_committed_notebook_names_no_machine_path():
    """The committed outputs were made from the repository root with relative paths: nothing of the machine that
    ran it (its home, its checkout) shows."""
    import json

    nb = json.loads(NB.read_text())
    assert not machine_paths(outputs_text(nb)), machine_paths(outputs_text(nb))[:3]
    assert machine_paths("wrote /work/wt/habits/out/x.csv and C:\\Users\\me") == ["/work/wt/habits/out/x.csv",
                                                                                  "C:\\Users\\me"]


def test_committed_notebook_tunes_what_can_be_served_and_serves_its_pick():
    import json

    from sim.core.deploy import tier
    from sim.core.policies import get_policy

    nb = json.loads(NB.read_text())
    outs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert outs, "commit the notebook with its outputs (jupyter nbconvert --to notebook --execute --inplace)"
    assert any("image/svg+xml" in o.get("data", {}) for o in outs)  # readable without JavaScript
    source = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    trace = re.search(r'TRACE = "([^"]+)"', source).group(1)
    assert trace == "traces/general.jsonl"  # never a trace the reports evaluate (codeedit, chat)
    text = "\n".join("".join(o.get("text", "")) for o in outs)
    best = re.search(r"best: --policy (\S+)", text).group(1)
    assert tier(get_policy(best)) == "plugin"  # a setting of the plugin, which vLLM runs with it installed
    serve = re.findall(r"^(?:VLLM_USE_V2_MODEL_RUNNER=1 )?vllm serve .*$", text, re.M)
    assert len(serve) == 2 and all("--additional-config" in s for s in serve), serve
    want = {"slots": int(re.search(r"slots=(\d+)", best).group(1)), **({"skip": True} if ":skip" in best else {}),
            **({"runcal": float(re.search(r"runcal=([0-9.]+)", best).group(1))} if "runcal=" in best else {})}
    for line in serve:
        config = json.loads(re.search(r"--additional-config '([^']+)'", line).group(1))["hybrid_spec"]
        assert {k: config.get(k) for k in want} == want, (best, line)
