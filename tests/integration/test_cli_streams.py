"""The CLI writes to streams: ``--out /dev/null`` discards the page, ``--csv /dev/stdout | head -1``
prints the CSV header, and a named pipe gets the format its flag implies (``--csv`` CSV, ``--out`` the page, or
the JSON export with ``--json``); a regular file without extension is still refused (exit 2). Each case runs the
real command in a fresh process."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "tl_idempotence.cli"]


def _env():
    return {**os.environ, "HF_HUB_OFFLINE": "1"}


def run(args, cwd):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=_env(), timeout=600)


def test_out_dev_null_exits_0_and_writes_nothing(tiny_ckpt, tmp_path):
    proc = run(["report", str(tiny_ckpt), "--out", "/dev/null", "--quiet"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "wrote /dev/null"  # not "replaced the file that was there"
    proc = run(["report", str(tiny_ckpt), "--out", "/dev/null", "--csv", "/dev/null", "--json", "--quiet"], tmp_path)
    assert proc.returncode == 0, proc.stderr  # the same device twice is not "the same file"
    assert json.loads(proc.stdout)["summary"]["n_heads"] == 12
    assert list(tmp_path.iterdir()) == []


def test_csv_to_dev_stdout_piped_to_head_prints_the_header(tiny_ckpt, tmp_path):
    head_of = tmp_path / "h.csv"
    assert run(["report", str(tiny_ckpt), "--csv", str(head_of), "--quiet"], tmp_path).returncode == 0
    header = head_of.read_text().splitlines()[0]
    cmd = " ".join(shlex.quote(a) for a in [*CLI, "report", str(tiny_ckpt), "--csv", "/dev/stdout", "--quiet"])
    proc = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {cmd} | head -1"], capture_output=True, text=True, env=_env(), timeout=600
    )
    assert proc.returncode == 0, proc.stderr  # the CLI itself exits 0 (a closed pipe is not a failure)
    assert proc.stdout.splitlines() == [header] and header.startswith("label,layer,head")
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    # the whole stream: the CSV, then the summary text the command prints (in that order)
    proc = run(["report", str(tiny_ckpt), "--csv", "/dev/stdout", "--quiet"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(head_of.read_text()) and "wrote /dev/stdout" in proc.stdout


def _fifo_run(args, fifo: Path, cwd: Path) -> tuple[subprocess.CompletedProcess, bytes]:
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    proc = run(args, cwd)
    if not got:  # the command failed before opening the pipe: open it ourselves to end the reader
        with open(fifo, "wb"):
            pass
    t.join(30)
    return proc, got[0]


def test_a_named_pipe_gets_the_format_its_flag_implies(tiny_ckpt, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert run(["report", str(tiny_ckpt), "--csv", "h.csv", "--out", "r.json", "--quiet"], tmp_path).returncode == 0
    proc, data = _fifo_run(["report", str(tiny_ckpt), "--csv", str(fifo), "--quiet"], fifo, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert data == (tmp_path / "h.csv").read_bytes()
    proc, data = _fifo_run(["report", str(tiny_ckpt), "--out", str(fifo), "--quiet"], fifo, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert data.startswith(b"<!DOCTYPE html>") and b"L1H5" in data
    proc, data = _fifo_run(["report", str(tiny_ckpt), "--out", str(fifo), "--json", "--quiet"], fifo, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(data) == json.loads((tmp_path / "r.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.csv", "pipe", "r.json"]  # the pipe was not replaced
    assert (tmp_path / "pipe").is_fifo()


def test_a_regular_file_without_extension_is_still_refused(tiny_ckpt, tmp_path):
    proc = run(["report", str(tiny_ckpt), "--csv", "heads", "--quiet"], tmp_path)
    assert proc.returncode == 2 and "--csv heads has no extension" in proc.stderr, proc.stderr
    proc = run(["report", str(tiny_ckpt), "--out", "page", "--quiet"], tmp_path)
    assert proc.returncode == 2 and "--out page has no extension" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []
