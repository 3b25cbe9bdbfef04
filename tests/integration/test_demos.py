"""The demo notebooks in demos/ run top to bottom, offline (SPEC: design card, "demos executed in CI").

Notebooks are stored without outputs. The default run checks that (and that every code cell
parses); the executions are marked slow (each loads a real model or runs the search: 20-90 s
on a loaded 2-core machine) and run in CI with ``-m slow``. A failing cell raises
``nbclient.exceptions.CellExecutionError`` and fails the test.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="demo tests need the 'test' extra (nbformat, nbclient, ipykernel)")

DEMOS = Path(__file__).resolve().parents[2] / "demos"
#: notebook -> minimum number of plotly figures its execution must display
NOTEBOOKS = {
    "01_quickstart.ipynb": 1,
    "02_geometry.ipynb": 3,
    "03_algebra_activations.ipynb": 1,
    "04_trajectories.ipynb": 3,
    "05_head_roles.ipynb": 2,
    "06_head_tokens.ipynb": 3,
    "07_population.ipynb": 1,
}


@pytest.fixture(scope="session")
def lineage_dir(lineage):
    """The session lineage shared with tests/studies/test_trajectory.py (conftest.lineage, trained once)."""
    return lineage.root


def _run(name: str, tmp_path: Path, monkeypatch, env: dict[str, str]):
    from nbclient import NotebookClient

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the kernel must be this interpreter (its kernelspec runs "python" from PATH)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    nb = nbformat.read(DEMOS / name, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    streams = "".join(str(o.get("text", "")) for o in outputs if o.output_type == "stream")
    for noise in ("TqdmWarning", "%|", "Writing model shards"):
        assert noise not in streams, f"{name} printed {noise!r}: {streams[:500]}"
    assert not [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    figs = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figs) >= NOTEBOOKS[name], f"{name} displayed {len(figs)} plotly figures, expected >= {NOTEBOOKS[name]}"
    # every figure also renders in a static, offline render: an HTML div, plotly.js inlined once in the notebook
    assert all("text/html" in o["data"] and "plotly-graph-div" in o["data"]["text/html"] for o in figs)
    html_all = "".join(str(o.get("data", {}).get("text/html", "")) for o in outputs)
    # (the bundle itself names cdn.plot.ly as the default topojson URL of geo maps: no script may load from it)
    assert html_all.count("plotly.js v") == 1 and not re.search(r"<script[^>]*src=[\"'][^\"']*cdn\.plot\.ly", html_all)
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter().from_notebook_node(nb)
    assert page.count('class="plotly-graph-div"') >= len(figs)
    return nb


def _text(nb) -> str:
    return "\n".join(
        str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    )


@pytest.mark.slow
def test_quickstart(tmp_path, monkeypatch):
    nb = _run("01_quickstart.ipynb", tmp_path, monkeypatch, {})
    assert "n_closed" in _text(nb)
    # only the library's figures here, and they render offline by themselves (_run checks): no set-up call
    assert "use_offline_plotly" not in "".join(c.source for c in nb.cells)


@pytest.mark.slow
def test_geometry(tmp_path, monkeypatch):
    nb = _run("02_geometry.ipynb", tmp_path, monkeypatch, {})
    text = _text(nb)
    # the notebook recomputes P from (K, D) and compares principal angles with scipy
    assert "P from (K, D)" in text and "max |angle(D) - scipy|" in text


@pytest.mark.slow
def test_algebra_activations(tmp_path, monkeypatch):
    _run("03_algebra_activations.ipynb", tmp_path, monkeypatch, {})


@pytest.mark.slow
def test_trajectories(tmp_path, monkeypatch, lineage_dir):
    nb = _run("04_trajectories.ipynb", tmp_path, monkeypatch, {"TLI_LINEAGE_DIR": str(lineage_dir)})
    assert "final P >= threshold" in _text(nb)


@pytest.mark.integration
def test_head_roles(tmp_path, monkeypatch, lineage_dir):
    """SmolLM2's association table and the lineage's induction heads: the notebook's words match its numbers."""
    nb = _run("05_head_roles.ipynb", tmp_path, monkeypatch, {"TLI_LINEAGE_DIR": str(lineage_dir)})
    assert "use_offline_plotly" not in "".join(c.source for c in nb.cells)  # library figures need no set-up call
    text = _text(nb)
    assert "induction accuracy at step 200: 1.0" in text
    assert "same association: True | same table: True" in text
    assert "RoleAssociation(model_name='smollm2-135m', n_heads=270, n_closed=13" in text
    assert "closed heads with alpha < 0: 7 | alpha > 0: 6 | min |copying|: 0.996" in text  # the words of the notebook
    # the lineage's table, sorted by induction score: its four layer-1 heads come first
    assert re.search(r"(?m)^L1H\d .*\n^L1H\d .*\n^L1H\d .*\n^L1H\d .*\n^L0H\d ", text), text[-3000:]


@pytest.mark.slow
def test_head_tokens(tmp_path, monkeypatch, lineage_dir):
    """SmolLM2 (tied) and the session lineage trained tied and untied: the notebook's words match its numbers."""
    nb = _run("06_head_tokens.ipynb", tmp_path, monkeypatch, {"TLI_LINEAGE_DIR": str(lineage_dir)})
    text = _text(nb)
    assert "SmolLM2-135M ties its embeddings (W_U = W_Eᵀ exactly) | config tie_word_embeddings: True" in text
    assert "closed heads: 13 of 270" in text
    assert (
        "tied: induction accuracy at step 200 1.0; the model ties its embeddings (W_U = W_Eᵀ exactly) | closed "
        "heads: 4" in text
    )
    assert "untied: induction accuracy at step 200 1.0; the model does not tie its embeddings" in text
    assert re.search(r"untied: .*\| closed heads: 0\n", text)
    # the numbers the notebook's words give (seed 0)
    # the direction is the tested one, effect - null (issue 46): 8 of 13 by it (L12H5 agrees, L29H1 does not)
    assert (
        "8 of 13 closed heads agree (direction: the sign of effect - null, what each head's test tests; two-sided "
        "sign test p = 0.58; 95% bootstrap interval 7-11 heads)" in text
    )
    # issue 47: matched controls, the Spearman p within layers beside the across-layers one, the base rate
    assert "the 13 closed heads agree at 62% vs 62% (difference +0.00, exact within-layer p = 1" in text
    assert (
        "across 270 heads, Spearman ρ(α·P, effect) = +0.16 (within-layer permutation p = 0.54, 30 layers with two or "
        "more heads; across layers p = 0.008, which depth confounds)" in text
    )
    assert "sign(copying) = sign(α) for 13 of 13 closed heads and 89% of 257 non-closed heads (chance of 13" in text
    assert "direction = sign(alpha): 8 of 13 | sign(copying_own) = sign(alpha): 13 | min |copying_own|: 0.9936" in text
    assert (
        "Too few closed heads to tell: 4 of 4 closed heads agree (direction: the sign of effect - null, what each "
        "head's test tests; two-sided sign test p = 0.12; 95% bootstrap interval 4-4 heads, and with 4 heads it cannot "
        "be below 0.125 > 0.05); no closed head has a control of its layer with a direction (matched on |α|); across "
        "8 heads, Spearman ρ(α·P, effect) = +0.95 (within-layer permutation p = 0.062" in text
    )
    assert re.search(r"L10H8 alpha = -19\.39\n  promoted +\(none", text)  # a suppressor has no promoted list
    assert (
        "No head is closed; across 8 heads, Spearman ρ(α·P, effect) = +0.52 (within-layer permutation p = 0.5, 2 "
        "layers with two or more heads; across layers p = 0.21, which depth confounds)" in text
    )


def _markdown(nb) -> str:
    """The Markdown the notebook's code displays (its words written from its numbers)."""
    return "\n".join(
        str(o.get("data", {}).get("text/markdown", "")) for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )


@pytest.mark.slow
def test_population(tmp_path, monkeypatch):
    """6 lineages (seeds 0-2, tied and untied), SmolLM2 on a small budget and MiniLM (refused): the words the
    notebook writes from its numbers are those numbers (every draw seeded 0; 160 CPU-s)."""
    nb = _run("07_population.ipynb", tmp_path, monkeypatch, {"TLI_POPULATION_DIR": str(tmp_path / "population")})
    text, words = _text(nb), _markdown(nb)
    assert "closed heads per tied lineage: [4, 2, 4]\nclosed heads per untied lineage: [0, 0, 0]" in text
    assert "smollm2-135m | closed heads: 13 of 270" in text
    assert "minilm-l6 refused: attended_token_effect needs a causal language model" in text
    assert "Refused (1, rows with the reason): minilm-l6." in text
    assert "Refused, kept as rows with the reason: minilm-l6." in words
    # the answer at the population level: the headline's pooled numbers are the ones the last cell writes
    m = re.search(
        r"(\w[\w ]+): pooled over the (\d+) of (\d+) measured models with matched controls, closed heads agree "
        r"\(direction = sign\(α\)\) at rate (\d\.\d\d) \((\d+) heads\) and their matched controls at (\d\.\d\d) "
        r"\((\d+) heads\), difference ([+-]\d\.\d\d), p = (\S+) ",
        text,
    )
    assert m, text[-3000:]
    assert m.groups() == ("Not detectably", "2", "7", "0.79", "14", "0.53", "15", "+0.25", "0.15")
    assert (
        f"**{m[1]}.** Pooled over the {m[2]} of {m[3]} measured models that have a closed head with a non-closed "
        f"head of its layer, closed heads agree at rate {m[4]} ({m[5]} heads) and their matched controls at {m[6]} "
        f"({m[7]} heads): difference {m[8]}, p = {m[9]} " in words
    )
    # what holds and what does not: the headline's clauses, each a bullet of the last cell
    assert "Holds: closed heads agree more often than 1/2 (19 of 22, 86%, two-sided sign test p = 8.6e-04" in text
    assert "* Holds: closed heads agree more often than 1/2 (19 of 22, 86%, two-sided sign test p = 8.6e-04" in words
    clause = "α·P tracks the effect within (model, layer) strata (pooled ρ = +0.10, p = 0.72 permuted within them"
    assert f"Does not hold: {clause}" in text and f"* Does not hold: {clause}" in words
    assert "2 of 7 models have no matched control" in text and "* Not testable: 2 of 7 models have no matched" in words
    # where the agreement comes from: the per-layer counts and the bullet written from them
    assert re.search(r"tied\s+0\s+12\s+12\s+0\s+0\n\s+1\s+12\s+12\s+10\s+12\n", text), text[-3000:]
    assert "tied lineages (closed or not): layer 0: 0 of 12 agree (0 closed); layer 1: 12 of 12 agree (10 closed)" in (
        words
    )
    assert "untied lineages (closed or not): layer 0: 7 of 12 agree (0 closed); layer 1: 10 of 12 agree" in words
    assert "tied lineages with unstratified p <= 0.05: 3 of 3 | within layers: 0 of 3" in text
    assert "at most 0.05 in 3 of 3 tied lineages unstratified and in 0 permuted within layers" in words
