"""A new user's install, replayed: a fresh venv (no system site-packages) where ``pip install -e .`` installs the
package with its dependencies only. Neither ``dask`` nor ``distributed`` is installed; the CLI's report runs; a
sweep (the API and the CLI) stops in one line naming ``pip install "tl_idempotence[cluster]"``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import llama_like

ROOT = Path(__file__).resolve().parents[2]
INSTALL = 'pip install "tl_idempotence[cluster]"'


def _run(cmd: list[str], env: dict[str, str], timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.slow
def test_pip_install_e_dot_leaves_out_dask_and_a_sweep_says_how_to_add_it(tmp_path):
    # a copy of the checkout: the editable install writes its egg-info next to the sources, never into this tree
    src = tmp_path / "checkout"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", src / "src", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE", "constraints.txt"):
        shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", str(venv)], env)
    assert r.returncode == 0, r.stderr
    py, cli = str(venv / "bin" / "python"), str(venv / "bin" / "tl-idempotence")
    pip = [py, "-m", "pip", "install", "-q", "--no-compile", "-c", "constraints.txt"]
    for args in (["torch==2.13.0"], ["-e", "."]):  # the README's set-up, without the test extra
        r = subprocess.run([*pip, *args], cwd=src, capture_output=True, text=True, env=env, timeout=1800)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = _run([py, "-m", "pip", "list", "--format=json"], env)
    installed = {p["name"].lower() for p in json.loads(r.stdout)}
    assert "tl_idempotence" in {n.replace("-", "_") for n in installed} and "torch" in installed, installed
    assert not installed & {"dask", "distributed"}, sorted(installed)

    ckpt, _, _ = llama_like(tmp_path / "ckpt", n_layers=2)
    r = _run([cli, "report", str(ckpt), "--out", str(tmp_path / "report.html"), "--quiet"], env, timeout=600)
    assert r.returncode == 0 and (tmp_path / "report.html").stat().st_size > 0, r.stdout[-2000:] + r.stderr[-2000:]

    code = (
        "import sys, tl_idempotence as tli\n"
        "try:\n"
        "    tli.sweep({'a': sys.argv[1]}, sys.argv[2], progress=False)\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, '|', e)\n"
    )
    r = _run([py, "-c", code, str(ckpt), str(tmp_path / "api_out")], env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines() == [
        "MissingExtraError | tli.sweep() runs on a Dask cluster and needs dask and distributed, which are not "
        f"installed: {INSTALL} (a job array, --task-index, and tli.load_sweep need neither)."
    ], r.stdout
    r = _run([cli, "sweep", str(ckpt), "--out", str(tmp_path / "cli_out")], env, timeout=600)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and INSTALL in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "api_out").exists() and not (tmp_path / "cli_out").exists()
