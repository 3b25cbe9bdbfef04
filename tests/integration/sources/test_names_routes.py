"""The name rule on every route, the CLI's in fresh processes included; its unit tests are
tests/unit/sources/test_names.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import tl_idempotence as tli
from tl_idempotence.errors import MissingFileError, OptionError
from tl_idempotence.sources.dispatch import head_source
from tl_idempotence.studies.compare import resolve_items

CLI = [sys.executable, "-m", "tl_idempotence.cli"]


@pytest.mark.integration  # fresh processes or a real model's files read whole: CI's integration tier
def test_a_folder_named_like_a_zoo_model_gets_one_decision_on_every_route(tmp_path, monkeypatch):
    """Measured before: ``idempotence_report("smollm2-135m")`` read the folder while compare, sweep and the
    CLI refused the name. Now every route refuses it naming both ways out, before anything is read."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "minilm-l6").mkdir()
    match = r"both a zoo model name and an existing path"
    with pytest.raises(OptionError, match=match):
        tli.idempotence_report("minilm-l6", progress=False)
    with pytest.raises(OptionError, match=match):
        head_source("minilm-l6")
    with pytest.raises(OptionError, match=match):
        resolve_items(["minilm-l6"])
    with pytest.raises(OptionError, match=match):
        tli.sweep(["minilm-l6"], out=tmp_path / "sw", progress=False)
    assert not (tmp_path / "sw").exists()  # refused before the sweep folder (or a cluster) exists
    for argv in (["report", "minilm-l6", "--json"], ["sweep", "minilm-l6", "--out", "sw"]):
        proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert "both a zoo model name and an existing path" in proc.stderr and "zoo:minilm-l6" in proc.stderr
    # an unknown name: the same missing-path refusal from the API routes
    for call in (
        lambda: tli.idempotence_report("no-such-ckpt", progress=False),
        lambda: resolve_items(["no-such-ckpt"]),
    ):
        with pytest.raises(MissingFileError, match="'no-such-ckpt' is not an existing file or folder, nor a zoo model"):
            call()


@pytest.mark.integration  # fresh processes or a real model's files read whole: CI's integration tier
def test_an_absent_device_gets_one_decision_before_any_work(tmp_path):
    """``device="cuda"`` on a machine without CUDA: refused before anything is read or started on every
    route whose work runs on this machine (a sweep with its own scheduler resolves it on the workers)."""
    import torch

    from tl_idempotence.errors import DeviceError

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from helpers import random_heads
    from tl_idempotence.core.heads import LayerHeads

    O, V, _ = random_heads(1, 2, 2, 8, 4)
    heads = [LayerHeads(0, O[0], V[0], torch.tensor([0, 1]))]
    for call in (
        lambda: tli.idempotence_report(heads, device="cuda", progress=False),
        lambda: tli.compare({"a": heads}, device="cuda", progress=False),
        lambda: tli.sweep({"a": "minilm-l6"}, out=tmp_path / "sw", device="cuda", progress=False),
    ):
        with pytest.raises(DeviceError, match="CUDA is not available"):
            call()
    assert not (tmp_path / "sw").exists()  # no sweep folder, no cluster
    for argv in (
        ["report", "--device", "cuda"],
        ["sweep", "minilm-l6", "--out", str(tmp_path / "sw2"), "--device", "cuda"],
    ):
        proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "CUDA is not available" in proc.stderr, (argv, proc.stderr)
    assert not (tmp_path / "sw2").exists()
