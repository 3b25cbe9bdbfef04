"""The default command end to end in a fresh process; the CLI's unit tests are tests/unit/test_cli.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tl_idempotence import cli


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
    assert out.startswith(  # the headline first: the closed count, and what the null (not run) would test
        "13 of 270 heads are closed (P ≥ 0.9); no scramble null was run (nulls=0), so there is no p- or q-value. "
        "smollm2-135m (zoo checkpoint (llama), raw checkpoint weights): "
    ), out[:300]
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


def test_checkpoint_path_with_csv_and_resume(tmp_path, capsys):
    from tl_idempotence.testing import tiny_hf_dir

    ckpt = tiny_hf_dir(tmp_path / "ckpt", n_layers=2, d_model=72, n_heads=9, n_kv_heads=3, seed=1)
    args = [
        "report",
        str(ckpt),
        "--out",
        str(tmp_path / "r.html"),
        "--csv",
        str(tmp_path / "h.csv"),
        "--resume",
        str(tmp_path / "parts"),
        "--threshold",
        "0.5",
        "--quiet",
    ]
    assert cli.main(args) == 0
    out1 = capsys.readouterr().out
    assert "2 attention layers x 9 heads (3 kv heads), d_model 72, d_head 8" in out1
    heads = pd.read_csv(tmp_path / "h.csv")
    n_closed = int((heads["P"] >= 0.5).sum())
    assert f"{n_closed} of 18 heads ({100 * n_closed / 18:.2f} %) are near-idempotent, P ≥ 0.5" in out1
    assert len(heads) == 18 and list(heads["kv_head"][:9]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # per-layer parts were written: a JSON record and parquet tables per layer, no pickles
    names = sorted(p.name for p in (tmp_path / "parts").iterdir())
    assert {"manifest.json", "layer_00000.json", "layer_00001.json", "layer_00000.heads.parquet"} <= set(names)
    assert not [n for n in names if n.endswith(".pkl")]
    assert cli.main(args) == 0  # resumed from the parts: same numbers
    out2 = capsys.readouterr().out
    assert "replaced the file that was there" in out2  # the earlier page and CSV were replaced, and it says so

    def numbers(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if not ln.startswith("wrote ")]

    assert numbers(out2) == numbers(out1)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "h.csv"), heads)


def test_analysis_flags_pass_through(tmp_path, capsys):
    from tl_idempotence.testing import tiny_hf_dir

    ckpt = tiny_hf_dir(tmp_path / "ckpt", n_layers=2, seed=2)
    csv = tmp_path / "h.csv"
    args = [
        "report",
        str(ckpt),
        "--nulls",
        "8",
        "--algebra",
        "--seed",
        "3",
        "--quiet",
        "--out",
        str(tmp_path / "r.html"),
        "--csv",
        str(csv),
    ]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    heads = pd.read_csv(csv)
    # the headline reports both controls, with numbers that match the table (2 layers x 9 query heads x the
    # 2 kv groups each one does not read = 36 mismatch pairs)
    m = re.search(
        r"Against the orientation-scramble null \(8 Haar draws per head\) ([\d.]+) % of heads beat their "
        r"scramble median \(median scrambled P ([\d.e+-]+)\), and (\d+) of 36 matched O/V mismatch pairs "
        r"reach P ≥ 0.9\.",
        out,
    )
    assert m, out
    assert float(m.group(1)) == pytest.approx(100 * heads["beats_scramble"].mean(), abs=0.005)
    assert float(m.group(2)) == pytest.approx(heads["P_scrambled_median"].median(), rel=1e-2)
    assert {"P_scrambled_median", "p_value", "beats_scramble"} <= set(heads.columns)
    assert (heads["n_scramble_draws"] == 8).all()
    p = heads["p_value"].to_numpy()
    assert ((p >= 1 / 9 - 1e-12) & (p <= 1)).all()  # (1 + #{P~ >= P}) / (n + 1) with n = 8
    # the BH q-values across the 18 heads travel to the CSV, next to p
    import scipy.stats

    assert list(heads.columns).index("q_value") == list(heads.columns).index("p_value") + 1
    np.testing.assert_allclose(heads["q_value"], scipy.stats.false_discovery_control(p, method="bh"), rtol=1e-12)
    assert cli.main(args) == 0  # same seed, same draws
    pd.testing.assert_frame_equal(pd.read_csv(csv), heads)
