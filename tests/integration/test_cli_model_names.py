"""A model name the user mistypes is refused fast, with the nearest zoo names, and never sent to the network
: ``tl-idempotence report smollm2-13m`` exits 2 naming ``smollm2-135m`` whether or not the hub is
switched off; with ``HF_HUB_OFFLINE`` a hub id the local Hugging Face cache does not hold fails in one line.

Each case runs the real command in a fresh process with ``HF_ENDPOINT`` pointed at a loopback socket this test
listens on: any hub request would connect to it, and the test asserts that none did.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "tl_idempotence.cli"]


@pytest.fixture
def endpoint():
    """A listening loopback socket (the hub's stand-in) and a function that counts the connections it got."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.setblocking(False)

    def connections() -> int:
        n = 0
        while True:
            try:
                conn, _ = srv.accept()
            except BlockingIOError:
                return n
            conn.close()
            n += 1

    yield f"http://127.0.0.1:{srv.getsockname()[1]}", connections
    srv.close()


def _run(args, endpoint_url, tmp_path, offline=None):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=endpoint_url, HF_HUB_CACHE=str(tmp_path / "hf-cache"), HF_HUB_ETAG_TIMEOUT="2")
    if offline:
        env[offline] = "1"
    t0 = time.monotonic()
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("offline", [None, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_a_mistyped_zoo_name_exits_2_at_once_with_no_hub_request(offline, endpoint, tmp_path):
    url, connections = endpoint
    proc, seconds = _run(["report", "smollm2-13m"], url, tmp_path, offline)
    assert proc.returncode == 2, proc.stderr
    assert seconds < 30, seconds  # the bound is 5 s on a quiet machine; this one is shared
    assert proc.stderr.splitlines()[-1] == (
        "tl-idempotence report: error: MODEL 'smollm2-13m' is not a zoo model (gemma-3-270m, minilm-l6, "
        "smollm2-135m; did you mean 'smollm2-135m'?), nor an existing file or folder, nor a Hugging Face hub id "
        "(owner/name, e.g. HuggingFaceTB/SmolLM2-135M)"
    )
    assert connections() == 0
    assert proc.stdout == "" and "Traceback" not in proc.stderr and "transformers" not in proc.stderr
    assert not (tmp_path / "report.html").exists()


def test_an_uncached_hub_id_offline_fails_in_one_line_with_no_hub_request(endpoint, tmp_path):
    url, connections = endpoint
    proc, _ = _run(["report", "some-org/some-model"], url, tmp_path, "HF_HUB_OFFLINE")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        "tl-idempotence: error: 'some-org/some-model' is not a zoo model (gemma-3-270m, minilm-l6, smollm2-135m) "
        "nor an existing path, and HF_HUB_OFFLINE is set and the local Hugging Face cache does not hold it, so it "
        "cannot be read from the hub. Pass a local checkpoint folder or .gguf file."
    ]
    assert connections() == 0


def test_the_stand_in_counts_a_request(endpoint, tmp_path):
    """The control: a request to HF_ENDPOINT does reach the stand-in socket (so the zeros above mean something).
    (The CLI's own hub route is not run here: with the stand-in silent, the hub client retries for minutes.)"""
    url, connections = endpoint
    code = (
        "import os, urllib.request\n"
        "try:\n    urllib.request.urlopen(os.environ['HF_ENDPOINT'], timeout=1)\nexcept OSError:\n    pass"
    )
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "HF_ENDPOINT": url}, timeout=60, check=True)
    assert connections() == 1
