"""The default command end to end in a fresh process; the CLI's unit tests are tests/unit/test_cli.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest


def _cli_command() -> list[str]:
    exe = Path(sys.executable).parent / "tl-idempotence"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("tl-idempotence")
    return [found] if found else [sys.executable, "-m", "tl_idempotence.cli"]


@pytest.mark.integration  # fresh processes or a real model's files read whole: CI's integration tier
@pytest.mark.bridge
def test_default_command_end_to_end(tmp_path):
    """`tl-idempotence report --out ... --csv ...` on the default model, as a user runs it."""
    html, csv = tmp_path / "report.html", tmp_path / "heads.csv"
    proc = subprocess.run(
        [*_cli_command(), "report", "--out", str(html), "--csv", str(csv)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    from tl_idempotence.views.text import format_P

    # the default zoo route streams the cached checkpoint files (no model object is built)
    assert out.startswith("smollm2-135m (zoo checkpoint (llama), raw checkpoint weights): ")
    assert (
        "model: smollm2-135m (zoo checkpoint (llama)), 30 attention layers x 9 heads (3 kv heads), d_model 576, "
        "d_head 64"
    ) in out
    heads = pd.read_csv(csv)
    assert len(heads) == 270 and {"label", "layer", "head", "kv_head", "alpha", "P"} <= set(heads.columns)
    assert list(heads["label"][:2]) == ["L0H0", "L0H1"]
    n_closed = int((heads["P"] >= 0.9).sum())
    m = re.search(r"(\d+) of 270 heads \(([\d.]+) %\) are near-idempotent, P ≥ 0.9; median P ([\d.]+)\.", out)
    assert m, out
    assert int(m.group(1)) == n_closed and float(m.group(2)) == pytest.approx(100 * n_closed / 270, abs=0.005)
    assert float(m.group(3)) == pytest.approx(heads["P"].median(), rel=1e-3)
    # every closed head is listed, highest P first, with its label, layer, head, kv head, alpha and P
    table = out.split("closed heads:")[1]
    closed = heads[heads["P"] >= 0.9].sort_values("P", ascending=False)
    for r in closed.itertuples():
        assert re.search(
            rf"^{r.label}\s+{r.layer}\s+{r.head}\s+{r.kv_head}\s+{r.alpha:.4f}\s+"
            rf"{re.escape(format_P(r.P, 0.9))}$",
            table,
            re.M,
        ), r
    assert [ln.split()[0] for ln in table.strip().splitlines()[2 : 2 + len(closed)]] == list(closed["label"])
    assert "layers" in proc.stderr  # progress on stderr
    page = html.read_text(encoding="utf-8")
    assert "Plotly.newPlot" in page and '"type":"heatmap"' in page
    assert "checkpoint_sha256" in page  # processing flags recorded in the page
    remote = re.findall(r"<script[^>]*\bsrc\s*=\s*[\"']?\s*(?:https?:)?//", page, re.I)
    assert remote == []
    assert not re.search(r"<link[^>]*href\s*=\s*[\"']?(?:https?:)?//", page, re.I)
