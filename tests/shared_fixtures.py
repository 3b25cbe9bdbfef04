"""The fixtures several test modules share, defined once for every tier (registered by tests/conftest.py through
``pytest_plugins``; the real-model fixtures ``smollm2``, ``minilm``, ``lineage`` ... are in tests/conftest.py).

A module that needs one of these names it as an argument; it does not define a fixture of the same name
(tests/unit/test_fixtures_once.py refuses a fixture defined twice). Module-scoped fixtures are built once per module
that uses them, as a fixture written in that module would be.

* ``bridge`` / ``hooked``: the TransformerBridge / HookedTransformer of the module's own ``tiny_dir`` fixture.
* ``smol_path``, ``smol_full``, ``smol_saved``: the zoo's SmolLM2-135M files, its report with every analysis on
  layers 5 and 10, and that report saved to a fresh folder.
* ``lineage_bridge``: the TransformerBridge of the session lineage's last checkpoint.
* ``tiny_llama``: a tiny Llama/GQA TransformerBridge (2 layers, 9 heads on 3 kv heads).
* ``tiny_ckpt``: a 2-layer Llama-like checkpoint folder (``helpers.llama_like``).
* ``closed_pairs_report``: the report of ``helpers.closed_pairs_layers()`` (closed heads L0H0 L0H1 L1H0 L1H1).
* ``compare_ckpts``, ``identity_ckpts``: the checkpoints of the comparison and sweep-identity tests.
* ``mixed_lineage_dirs`` / ``mixed_traj``: the lineage with identical and shared checkpoints, and its trajectory.
* ``zoo_ready``: the zoo's files of SmolLM2-135M and all-MiniLM-L6-v2 are on this machine (or skip/fail).
* ``analysed``: the layers the report loop analyses (``run_layer`` calls).
* ``no_array_environment``: no job-array index variable (SLURM, PBS, LSF, SGE) in the environment.
* ``one_torch_thread``: torch on one thread for the module (tiny models' forward passes in test code: torch's threads
  only add barrier waits there, several times slower on a machine whose cores are busy), restored after.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tl_idempotence as tli
from helpers import (
    ARRAY_INDEX_VARIABLES,
    closed_pairs_layers,
    hooked_or_skip,
    identity_checkpoints,
    llama_like,
    mixed_lineage,
    neox_like,
)

#: Layers of the lineage behind ``mixed_lineage_dirs``.
MIXED_LINEAGE_LAYERS = 4


@pytest.fixture(scope="module")
def bridge(tiny_dir):
    """The TransformerBridge of the requesting module's ``tiny_dir`` checkpoint folder."""
    from tl_idempotence.testing import bridge_from_dir

    return bridge_from_dir(tiny_dir)


@pytest.fixture(scope="module")
def hooked(tiny_dir):
    """The HookedTransformer of the requesting module's ``tiny_dir`` (skipped on transformer-lens 4.x)."""
    return hooked_or_skip(tiny_dir)


@pytest.fixture(scope="module")
def lineage_bridge(lineage):
    """The TransformerBridge of the session lineage's last checkpoint (``conftest.lineage``)."""
    from tl_idempotence.testing import bridge_from_dir

    return bridge_from_dir(lineage.checkpoints[-1][1])


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny Llama/GQA TransformerBridge (``tiny_hf_dir(arch="llama")``: 2 layers, 9 heads on 3 kv heads)."""
    from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

    return bridge_from_dir(tiny_hf_dir(tmp_path_factory.mktemp("tl_out") / "tq", arch="llama"))


@pytest.fixture(scope="module")
def smol_path():
    """The zoo's SmolLM2-135M-Instruct checkpoint folder, or skip/fail (``conftest.unavailable``)."""
    from conftest import unavailable

    try:
        return str(tli.models.checkpoint_dir("smollm2-135m", progress=False))
    except Exception as e:
        unavailable("the zoo's smollm2-135m checkpoint files", e)


@pytest.fixture(scope="module")
def smol_full(smol_path):
    """SmolLM2's layers 5 and 10 with every analysis (scramble, mismatch, search, algebra): every table kind and
    every threshold-dependent column."""
    return tli.idempotence_report(smol_path, nulls=8, search=True, algebra=True, layers=[5, 10], progress=False)


@pytest.fixture
def smol_saved(smol_full, tmp_path) -> Path:
    """``smol_full`` saved to a fresh folder."""
    return Path(smol_full.save(tmp_path / "smol_report"))


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> Path:
    """A 2-layer Llama-like checkpoint folder (``helpers.llama_like``)."""
    d, _, _ = llama_like(tmp_path_factory.mktemp("ck") / "tiny", n_layers=2)
    return d


@pytest.fixture(scope="module")
def closed_pairs_report():
    """The report of ``closed_pairs_layers()``: its closed heads are exactly L0H0, L0H1, L1H0 and L1H1."""
    r = tli.idempotence_report(closed_pairs_layers(), progress=False)
    assert set(r.closed_heads.index) == {"L0H0", "L0H1", "L1H0", "L1H1"}
    return r


@pytest.fixture(scope="module")
def compare_ckpts(tmp_path_factory) -> dict[str, Path]:
    """Two checkpoints to compare: ``A`` Llama-like, ``B`` GPT-NeoX-like (3 layers, 8 heads, d_model 64)."""
    root = tmp_path_factory.mktemp("compare_ckpts")
    return {"A": llama_like(root / "ckA")[0], "B": neox_like(root / "ckB", n_layers=3, nq=8, dm=64)[0]}


@pytest.fixture(scope="module")
def identity_ckpts(tmp_path_factory) -> dict[str, Path]:
    """``helpers.identity_checkpoints``: the items of the sweep-identity tests."""
    return identity_checkpoints(tmp_path_factory.mktemp("identity_ckpts"))


@pytest.fixture(scope="module")
def mixed_lineage_dirs(tmp_path_factory) -> dict:
    """A (step 0), B (step 1: every o_proj changed), C (a byte copy of B), D (B with A's shard holding
    layer 0's o_proj): D's layers come partly from A, partly from B (``helpers.mixed_lineage``)."""
    return mixed_lineage(tmp_path_factory.mktemp("lineage"), MIXED_LINEAGE_LAYERS)


@pytest.fixture(scope="module")
def mixed_traj(mixed_lineage_dirs):
    """(the trajectory of A, B, C, D as steps 0..3, the messages of the warnings it gave)."""
    ck = [(f"step{i}", mixed_lineage_dirs[k]) for i, k in enumerate("ABCD")]
    with pytest.warns(UserWarning) as rec:
        t = tli.trajectory(ck, progress=False)
    return t, [str(w.message) for w in rec]


@pytest.fixture(scope="module")
def zoo_ready() -> None:
    """The zoo's cached files of both models (fetched once when missing), or skip/fail (conftest.unavailable)."""
    from conftest import unavailable

    try:
        for name in ("smollm2-135m", "minilm-l6"):
            tli.models.checkpoint_dir(name, progress=False)
    except Exception as e:
        unavailable("the zoo models' files", e)


@pytest.fixture
def analysed(monkeypatch) -> list[int]:
    """The layers the report loop analyses (``run_layer`` calls), in order; a layer served from the cache is not."""
    import tl_idempotence.report.report as report_mod

    calls: list[int] = []
    real = report_mod.run_layer

    def counting(lh, *args, **kwargs):
        calls.append(lh.layer)
        return real(lh, *args, **kwargs)

    monkeypatch.setattr(report_mod, "run_layer", counting)
    return calls


@pytest.fixture
def no_array_environment(monkeypatch) -> None:
    """No job-array index variable (``helpers.ARRAY_INDEX_VARIABLES``) in the environment."""
    for name in ARRAY_INDEX_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread while the module runs (module docstring), torch's count restored after."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def small_search_budget(monkeypatch) -> None:
    """The constructive search with 40 iterations a restart instead of its default 200 (``analyses.search.DEFAULTS``):
    for tests of what the search's code path guarantees at any budget (one row per head, determinism for the seed
    and layer, the threshold rules, the declared columns); tests of the search's numbers use its defaults."""
    from tl_idempotence.analyses import search

    monkeypatch.setitem(search.DEFAULTS, "max_iters", 40)
