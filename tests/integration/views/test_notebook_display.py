"""Result objects in notebooks: a short ``repr``, an informative static ``_repr_html_``, figures that render
offline in a static HTML render of an executed notebook, and no stray progress output.

Real values: the weight-level results come from SmolLM2-135M-Instruct's raw weights (the zoo's cached
checkpoint files; L10H8 is its most closed head, P = 0.9533); the ones that run a model (activation
returns, attention view, trajectory) from the tiny random models of ``tl_idempotence.testing``.
"""

from __future__ import annotations

import inspect
import os
import re
import textwrap
from html import escape as html_escape
from pathlib import Path

import pytest

import tl_idempotence as tli
from helpers import require_chromium, run_chromium
from tl_idempotence.core.progress import progress_bar, quiet_transformers, tqdm_class
from tl_idempotence.sources.tl import bridge_from_dir
from tl_idempotence.testing import tiny_hf_dir

# integration tier: executes and exports notebooks (nbconvert)
pytestmark = [pytest.mark.bridge, pytest.mark.integration]  # checkpoint files and TransformerBridge only

SMOL_CLOSED = "L10H8 L27H1 L28H5 L12H5 L29H1 L5H2 L11H6 L29H0 L11H4 L6H8 L29H2 L26H4 L10H6".split()
TEXT = "w5 w6 w7 w8 w9 w4 w5 w6 w7 w8 w9 w4"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("nbdisp") / "tq", arch="llama")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return bridge_from_dir(tiny_dir)


@pytest.fixture(scope="module")
def results(smol_path, tiny, tiny_dir, tmp_path_factory):
    """One of each result object, with the value its display must show."""
    lh = tli.head_source(smol_path).layer_heads(10)
    rep = tli.idempotence_report(smol_path, progress=False)
    tiny_rep = tli.idempotence_report(tiny, progress=False)
    other = tiny_hf_dir(tmp_path_factory.mktemp("nbdisp2") / "tq", arch="llama", seed=1)
    return {
        "Closure": (tli.closure(lh), "max_P=0.9533"),
        "Scramble": (tli.orientation_scramble(lh, nulls=8), "n_draws=8"),
        "SearchResult": (tli.constructive_search(smol_path, heads=[(10, 8)]), "n_heads=1"),
        "MismatchResult": (tli.mismatch(smol_path, layers=[10]), "n_pairs=18"),
        "SharedValueAlgebra": (tli.shared_value_algebra(smol_path, layers=[10], progress=False), "n_groups=3"),
        "IdempotenceReport": (rep, "n_closed=13"),
        "ActivationReturns": (tli.activation_returns(tiny, TEXT, seq_len=16, progress=False), "n_tokens=12"),
        "AttentionView": (tiny_rep.show_attention(TEXT, top_k=2), "2 heads, 13 positions (12 text tokens + 1 special)"),
        "Trajectory": (tli.trajectory([("seed0", tiny_dir), ("seed1", other)], progress=False), "n_checkpoints=2"),
    }


@pytest.mark.parametrize(
    "name",
    ["Closure", "Scramble", "SearchResult", "MismatchResult", "SharedValueAlgebra", "IdempotenceReport",
     "ActivationReturns", "AttentionView", "Trajectory"],
)  # fmt: skip
def test_short_repr_and_informative_html(results, name):
    obj, shown = results[name]
    assert type(obj).__name__ == name
    r = repr(obj)
    assert "\n" not in r and len(r) < 300 and r.startswith(f"{name}("), r
    assert shown in r, r
    html = obj._repr_html_()
    if name == "AttentionView":  # the view itself: circuitsvis with its JS bundle inlined (offline)
        assert html == obj.html and "CircuitsVis.render" in html and "unpkg.com" not in html
        assert html_escape(obj.caption) in html
        return
    assert len(html.encode()) < 200_000, len(html)
    assert f"<b>{name}</b>" in html and "<table" in html
    assert "<script" not in html  # plain HTML: shows in static renders too


def test_displays_show_the_real_numbers(results):
    closure, _ = results["Closure"]
    html = closure._repr_html_()
    assert "heads (9 rows, highest P first)" in html
    first = re.search(r"<tbody>\s*<tr>\s*<th>(\d+)</th>((?:\s*<td>[^<]*</td>)+)", html)
    assert first and first.group(1) == "8" and "<td>0.9533</td>" in first.group(2)  # head 8 of layer 10 leads
    rep, _ = results["IdempotenceReport"]
    html = rep._repr_html_()
    assert "(safetensors checkpoint (llama), raw checkpoint weights): 13 of 270 heads (4.81 %)" in html
    assert re.findall(r"<td>(L\d+H\d+)</td>", html) == SMOL_CLOSED
    assert html.count("outline:2px solid") == 13  # the small heatmap rings the closed cells ...
    assert html.count('<th style="font-size:9px;padding:0 3px">') == 30  # ... one row per layer
    assert 'title="L10H8: P = 0.9533"' in html and 'title="L6H7: P = 0.8921"' in html
    traj, _ = results["Trajectory"]
    html = traj._repr_html_()
    assert "checkpoints (2 rows)" in html and "seed1" in html
    search, _ = results["SearchResult"]
    assert re.search(r"<td>10</td>\s*<td>8</td>\s*<td>0\.9533</td>\s*<td>0\.9\d+</td>", search._repr_html_())


def test_method_keeps_the_real_signature_and_docstring(tiny):
    sig = inspect.signature(tiny.idempotence_report)
    assert list(sig.parameters) == ["progress", "resume", "architecture", "prefix", "options"]
    assert sig.parameters["options"].annotation == "Unpack[ReportOptionsArgs]"  # the options, declared once
    assert tiny.idempotence_report.__doc__ == tli.idempotence_report.__doc__
    assert "threshold (float): P threshold" in tiny.idempotence_report.__doc__  # written from REPORT_OPTIONS


def test_progress_helper_outside_a_kernel(capsys):
    from tqdm.std import tqdm as std_tqdm

    assert tqdm_class() is std_tqdm  # a plain interpreter: never tqdm.auto's notebook widget
    assert list(progress_bar(range(3), desc="quiet", enabled=False)) == [0, 1, 2]
    assert capsys.readouterr().err == ""
    list(progress_bar(range(3), desc="search ~1.4 CPU-s/layer", unit="layer"))
    assert "search ~1.4 CPU-s/layer: 100%" in capsys.readouterr().err
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    with quiet_transformers():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()  # restored
    hf_logging.disable_progress_bar()
    try:
        with quiet_transformers():
            pass
        assert not hf_logging.is_progress_bar_enabled()  # a bar the user turned off stays off
    finally:
        hf_logging.enable_progress_bar()
    # transformers' GGUF loader draws its bar with tqdm.auto directly: silenced too, and restored
    import contextlib
    import io

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    theirs = gguf_utils.tqdm
    err = io.StringIO()
    with contextlib.redirect_stderr(err), quiet_transformers():
        assert list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors...")) == [0, 1, 2]
    assert err.getvalue() == "" and gguf_utils.tqdm is theirs


# --------------------------------------------------------------------------- executed notebooks, static HTML

NOTEBOOK = [
    "import warnings\nwarnings.simplefilter('default')  # show every warning, as a fresh kernel would once",
    "from tl_idempotence.views import use_offline_plotly\nuse_offline_plotly()",
    "import tl_idempotence as tli\nlin = tli.train_lineage(LINEAGE, steps=2, save_steps=(1,), seed=0)\nlin.metrics",
    "rep = tli.idempotence_report(lin.checkpoints[-1][1], progress=False)\nrep",
    "rep.figure()",
    "rep.figure('alpha').show()",
]


def execute_notebook(nb, cwd: Path) -> None:
    """Run every cell of ``nb`` in a fresh python3 kernel started in ``cwd``, with this checkout's sources first."""
    import nbclient

    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src = str(Path(tli.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    client.execute(env=env)


def test_executed_notebook_renders_figures_offline_in_static_html(tmp_path):
    from conftest import unavailable

    try:
        import nbclient  # noqa: F401  (execute_notebook's: here to skip where it is missing)
        import nbformat
        from nbconvert import HTMLExporter
    except ImportError as e:
        unavailable("nbclient/nbconvert (the test extra)", e)
    nb = nbformat.v4.new_notebook()
    cells = [f"LINEAGE = {str(tmp_path / 'lineage')!r}", *NOTEBOOK]
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c)) for c in cells]
    execute_notebook(nb, tmp_path)
    streams = "".join(o.get("text", "") for c in nb.cells for o in c.outputs if o.output_type == "stream")
    assert "TqdmWarning" not in streams and "Writing model shards" not in streams and "%|" not in streams, streams
    widgets = [
        o for c in nb.cells for o in c.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert widgets == []
    figs = [o for c in nb.cells for o in c.outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figs) == 2 and all("text/html" in o.data for o in figs)  # JupyterLab mimetype + static HTML
    for o in figs:  # nothing is fetched: no script source anywhere (the first output carries plotly.js inline)
        assert not re.search(r"<script[^>]*\bsrc=", o.data["text/html"])
    html, _ = HTMLExporter().from_notebook_node(nb)
    from plotly.offline import get_plotlyjs

    assert html.count(get_plotlyjs()[:2000]) == 1  # plotly.js embedded once
    assert html.count('class="plotly-graph-div"') == 2
    assert not re.search(r"<script[^>]*src=[\"'][^\"']*(plot\.ly|plotly)", html)  # never fetched from a CDN
    assert "<b>IdempotenceReport</b>" in html  # the report's own display
    page = tmp_path / "executed.html"
    page.write_text(html, encoding="utf-8")
    require_chromium()
    dom = run_chromium(tmp_path / "profile", "--virtual-time-budget=20000", "--dump-dom", f"file://{page}").stdout
    assert dom.count('class="main-svg"') >= 4, "plotly did not draw the two figures of the static page"


def test_lineage_training_prints_no_progress_bars(tmp_path, capfd):
    tli.train_lineage(tmp_path / "lin", steps=2, save_steps=(1,), seed=0)
    err = capfd.readouterr().err
    assert "Writing model shards" not in err and "%|" not in err, err


def test_a_figure_survives_a_static_export_with_no_extra_call(tmp_path):
    """The notebook a researcher writes first — two lines, no use_offline_plotly() — executed and exported with
    nbconvert: the figure is drawn in the exported page, offline (plotly.js inlined once, no CDN)."""
    from conftest import unavailable

    try:
        import nbclient  # noqa: F401  (execute_notebook's: here to skip where it is missing)
        import nbformat
        from nbconvert import HTMLExporter

        tli.models.attention_dir("smollm2-135m", progress=False)
    except Exception as e:
        unavailable("nbclient/nbconvert (the test extra) or the zoo's smollm2-135m", e)
    nb = nbformat.v4.new_notebook()
    cells = [
        "import tl_idempotence as tli\nrep = tli.idempotence_report('smollm2-135m', progress=False)",
        "rep.figure()",
    ]
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    execute_notebook(nb, tmp_path)
    out = nb.cells[1].outputs
    assert len(out) == 1 and {"application/vnd.plotly.v1+json", "text/html"} <= set(out[0].data)
    html, _ = HTMLExporter().from_notebook_node(nb)
    from plotly.offline import get_plotlyjs

    assert html.count(get_plotlyjs()[:2000]) == 1 and html.count('class="plotly-graph-div"') == 1
    assert not re.search(r"<script[^>]*src=[\"'][^\"']*(plot\.ly|plotly)", html)
    page = tmp_path / "exported.html"
    page.write_text(html, encoding="utf-8")
    require_chromium()
    dom = run_chromium(tmp_path / "profile", "--virtual-time-budget=20000", "--dump-dom", f"file://{page}").stdout
    assert dom.count('class="main-svg"') >= 2, "plotly did not draw the figure of the exported page"
    assert "P per head: smollm2-135m" in dom
