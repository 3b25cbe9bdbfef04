"""The cluster engine is the optional ``[cluster]`` extra: without ``dask`` and ``distributed`` the package imports
and measures, and every entry point that needs them (``tli.sweep``, the CLI's Dask sweep,
``tli.trajectory(client=...)``) refuses in one line naming ``pip install "tl_idempotence[cluster]"``, before any
work. The missing packages are hidden in a fresh process (``sys.modules[name] = None`` makes ``import name`` raise
ImportError, as an environment without them does)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import llama_like
from tl_idempotence.errors import MissingExtraError, TLIError
from tl_idempotence.studies.cluster import CLUSTER_INSTALL

HIDDEN = """
import sys
for name in ("dask", "distributed"):
    sys.modules[name] = None
"""

SCRIPT = """
import contextlib, io, json, sys
from pathlib import Path
ckpt, work = sys.argv[1], Path(sys.argv[2])
import tl_idempotence as tli
from tl_idempotence.cli import main

out = {}
rep = tli.idempotence_report(ckpt, progress=False)
out["n_heads"] = int(rep.summary.n_heads)
out["P"] = [float(p) for p in rep.heads["P"]]


def refusal(fn):
    try:
        fn()
    except Exception as e:
        return {"type": type(e).__name__, "import_error": isinstance(e, ImportError), "message": str(e)}
    return None


out["sweep"] = refusal(lambda: tli.sweep({"a": ckpt}, work / "sweep_out", progress=False))
out["sweep_bad_option"] = refusal(lambda: tli.sweep({"a": ckpt}, work / "sweep_bad", retries=-1))
out["trajectory"] = refusal(lambda: tli.trajectory([("a", ckpt)], client=object(), progress=False))
err = io.StringIO()
with contextlib.redirect_stderr(err):
    out["cli_rc"] = main(["sweep", ckpt, "--out", str(work / "cli_out"), "--quiet"])
out["cli_stderr"] = err.getvalue()
out["made"] = sorted(p.name for p in work.iterdir())
# a job array's task and load_sweep need neither package
from tl_idempotence.studies.sweep import run_sweep_item

row = run_sweep_item({"a": ckpt}, work / "array", 0)
out["array"] = [row["status"], list(tli.load_sweep(work / "array").reports)]
out["loaded"] = sorted(m for m in ("dask", "distributed") if sys.modules.get(m) is not None)
print("RESULT " + json.dumps(out))
"""


def _run(tmp_path: Path) -> dict:
    ckpt, _, _ = llama_like(tmp_path / "ckpt", n_layers=2)
    work = tmp_path / "work"
    work.mkdir()
    code = HIDDEN + SCRIPT
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(ckpt), str(work)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_without_dask_the_package_measures_and_each_cluster_entry_point_refuses_in_one_line(tmp_path):
    got = _run(tmp_path)
    assert got["n_heads"] == 12 and len(got["P"]) == 12 and all(0.0 <= p <= 1.0 for p in got["P"])
    assert got["loaded"] == []
    for what, name in (("sweep", "tli.sweep()"), ("sweep_bad_option", "tli.sweep()")):
        e = got[what]
        assert e is not None and e["type"] == "MissingExtraError" and e["import_error"], (what, e)
        assert "\n" not in e["message"] and CLUSTER_INSTALL in e["message"], e
        assert e["message"].startswith(f"{name} runs on a Dask cluster and needs dask and distributed"), e
    e = got["trajectory"]
    assert e["type"] == "MissingExtraError" and e["message"].startswith("tli.trajectory(client=...) "), e
    # the CLI: one line naming the pip command, exit 1 (not a usage error)
    assert got["cli_rc"] == 1
    assert got["cli_stderr"].strip().splitlines() == [
        "tl-idempotence: error: MissingExtraError: tl-idempotence sweep runs on a Dask cluster and needs dask and "
        f"distributed, which are not installed: {CLUSTER_INSTALL} (a job array, --task-index, and tli.load_sweep need "
        "neither)."
    ]
    assert got["made"] == []  # refused before any work: no sweep folder was created
    assert got["array"] == ["computed", ["a"]]


def test_with_dask_the_same_calls_pass_the_check(tmp_path):
    """The control: with dask importable the same calls pass the extra's check and fail on what follows it (the
    sweep's bad option, the trajectory's fake client), so the refusal above is the hidden packages' doing."""
    import pytest

    import tl_idempotence as tli
    from tl_idempotence.errors import OptionError, OptionTypeError

    ckpt, _, _ = llama_like(tmp_path / "ckpt", n_layers=2)
    with pytest.raises(OptionError, match="retries"):
        tli.sweep({"a": str(ckpt)}, tmp_path / "out", retries=-1)
    with pytest.raises(OptionTypeError, match=r"client must be a distributed\.Client"):
        tli.trajectory([("a", str(ckpt))], client=object(), progress=False)


def test_missing_extra_error_is_the_librarys_and_an_import_error():
    assert issubclass(MissingExtraError, TLIError) and issubclass(MissingExtraError, ImportError)
    assert CLUSTER_INSTALL == 'pip install "tl_idempotence[cluster]"'
