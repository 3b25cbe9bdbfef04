"""CI is pinned to what it tested (CONTRIBUTING.md, "Updating the pinned versions"): the lock files, the
architecture table's recorded versions, the README's and .ci/run's install commands, and the drift report of
scripts/derive_architectures.py."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "src" / "tl_idempotence" / "data" / "architectures_derived.json"


def _script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"tli_script_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, ver = line.split("==", 1)
            pins[name.lower().replace("_", "-")] = ver
    return pins


@pytest.mark.parametrize("lock", ["constraints.txt", "constraints-tl4.txt"])
def test_the_lock_files_pin_every_package_exactly(lock):
    text = (ROOT / lock).read_text()
    assert text.startswith(f"# {lock}: ") and "scripts/update_constraints.py" in text.splitlines()[0]
    pins = _pins(ROOT / lock)
    for line in (x for x in text.splitlines() if x and not x.startswith("#")):
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][A-Za-z0-9.]*", line), line  # no ranges, URLs or +cpu
    assert pins["torch"] == "2.13.0"  # the CPU wheel on local disk
    assert "tl-idempotence" not in pins  # the package itself is installed from the checkout
    for needed in ("transformers", "transformer-lens", "pytest", "sybil", "numpy", "pandas"):
        assert needed in pins, needed
    major = pins["transformer-lens"].split(".")[0]
    assert major == ("3" if lock == "constraints.txt" else "4"), pins["transformer-lens"]


def test_the_architecture_table_was_derived_with_the_pinned_libraries():
    """The main stage installs constraints.txt: the table must record exactly those versions (else its slow
    regeneration test fails there, and the adapter-coverage test reads another library's adapters)."""
    generated = json.loads(TABLE.read_text())["_generated"]
    pins = _pins(ROOT / "constraints.txt")
    assert generated["transformers"] == pins["transformers"]
    assert generated["transformer_lens"] == pins["transformer-lens"]


def test_the_readme_and_ci_install_with_the_lock():
    readme = (ROOT / "README.md").read_text().splitlines()
    assert readme[0] == "```sh"
    for line in readme[1:3]:  # the two commands: each pip install of the set-up takes the lock
        installs = re.findall(r"pip install ([^&]+)", line)
        assert len(installs) == 2 and all(i.startswith("-c constraints.txt ") for i in installs), line
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip_install "$V/pip" -c constraints.txt torch==2.13.0 "transformer-lens==3.9.*"' in ci
    assert 'pip_install "$V/pip" -c constraints.txt -e ".[test]"' in ci
    assert 'pip_install "$V4/pip" -c constraints-tl4.txt -e ".[test]"' in ci
    assert "scripts/derive_architectures.py --drift" in ci


def test_the_cluster_engine_is_an_extra_that_the_tests_and_the_locks_include(monkeypatch):
    """dask/distributed are the ``cluster`` extra, not dependencies; ``test`` pulls it in (CI installs ``.[test]``);
    the locks pin both (update_constraints installs ``.[test,...]``); the README's report command installs the
    package alone (what it uses), its test command ``.[test]``."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert not names & {"dask", "distributed"}, names
    extras = project["optional-dependencies"]
    assert sorted(extras["cluster"]) == ["dask", "distributed"]
    assert "tl_idempotence[cluster]" in extras["test"]
    for lock in ("constraints.txt", "constraints-tl4.txt"):
        assert {"dask", "distributed"} <= set(_pins(ROOT / lock)), lock
    assert '"-e", ".[test,' in (ROOT / "scripts" / "update_constraints.py").read_text()
    readme = (ROOT / "README.md").read_text().splitlines()
    assert readme[1].endswith(" -e . && .venv/bin/tl-idempotence report smollm2-135m --nulls 64 --out report.html")
    assert ' -e ".[test]" && .venv/bin/python -m pytest' in readme[2]


def test_freeze_lines_keep_exact_pins_only(monkeypatch):
    lock = _script("update_constraints", monkeypatch)
    freeze = "\n".join(
        [
            "# a comment",
            "-e git+https://example.invalid/x#egg=tl_idempotence",
            "tl_idempotence @ file:///work/main",
            "torch==2.13.0+cpu",
            "Pillow==12.0.0",
            "numpy==2.3.1",
            "",
        ]
    )
    assert lock.freeze_lines(freeze) == ["numpy==2.3.1", "Pillow==12.0.0", "torch==2.13.0"]
    with pytest.raises(SystemExit):  # a --pin that is not a requirement is refused before any venv is made
        lock.main(["--pin", "transformers"])


def test_drift_names_every_changed_entry_and_ignores_versions(monkeypatch):
    derive = _script("derive_architectures", monkeypatch)
    committed = json.loads(TABLE.read_text())
    assert derive.drift(committed, committed) == []
    newer = json.loads(json.dumps(committed))
    newer["_generated"] = {**newer["_generated"], "transformers": "99.0.0", "transformer_lens": "9.9.9"}
    tf = committed["_generated"]["transformers"]
    # a refusal quoting the library's version: the same text with another version is no drift
    newer["refused"] = {k: v.replace(f"transformers {tf}", "transformers 99.0.0") for k, v in newer["refused"].items()}
    assert any(f"transformers {tf}" in v for v in committed["refused"].values())
    assert derive.drift(committed, newer) == []
    # an entry that became a refusal (what transformers 5.25 did to falcon), a new entry, a changed layout
    entry = newer["architectures"].pop("falcon")
    newer["refused"]["falcon"] = "the config gives 2 kv heads, the weights hold 4"
    newer["architectures"]["newtype"] = entry
    newer["architectures"]["llama"] = {**newer["architectures"]["llama"], "v": {"tensor": "x", "layout": "linear"}}
    lines = derive.drift(committed, newer)
    assert len(lines) == 4, lines
    assert lines[0].startswith("architectures['falcon']: removed (was {")
    assert lines[1] == (
        "architectures['llama']: v was "
        + json.dumps(committed["architectures"]["llama"]["v"])
        + ', now {"tensor": "x", "layout": "linear"}'
    )
    assert lines[2].startswith("architectures['newtype']: new: {")
    assert lines[3] == "refused['falcon']: new: the config gives 2 kv heads, the weights hold 4"
