"""Trajectories over a real, locally trained lineage (SPEC section 6).

The lineage (tl_idempotence.lineage.train_lineage) is trained once per test session into
pytest's base temp dir: a 2-layer GQA Llama (4 query / 2 kv heads, d_head 16, tied
embeddings) on repeated random sequences, checkpoints at steps 0, 20, 40, 60, 100, 200.
Measured (seed 0): induction accuracy 1.0 from step 60; at step 0 every head has
P <= 0.04 (median 0.005); at step 200 the four layer-1 (copying) heads have
P = 0.907-0.928 and the layer-0 heads 0.15-0.46.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import re
import shutil
import weakref

import numpy as np
import pandas as pd
import pytest
from safetensors.torch import load_file, save_file

import tl_idempotence as tli
from helpers import SyntheticSource, gaussian_layer
from tl_idempotence.errors import MissingFileError, OptionError, OptionTypeError
from tl_idempotence.sources.lineage import lineage_checkpoints, train_lineage
from tl_idempotence.studies.trajectory import trajectory
from tl_idempotence.testing import bridge_from_dir

# integration tier: trains the lineage model and walks its checkpoints
pytestmark = [pytest.mark.bridge, pytest.mark.integration]

# The lineage (conftest.lineage, trained with helpers.LINEAGE_KW) is shared with tests/test_demos.py.


@pytest.fixture(scope="session")
def traj(lineage):
    """Trajectory of every head with the scramble null (16 draws)."""
    return trajectory(lineage.checkpoints, nulls=16, progress=False)


def test_lineage_trains_induction(lineage):
    m = lineage.metrics.set_index("step")
    assert list(m.index) == [0, 20, 40, 60, 100, 200]
    assert [lab for lab, _ in lineage.checkpoints] == ["step0", "step20", "step40", "step60", "step100", "step200"]
    # random init: chance level on 60 tokens; trained: the repeat is copied exactly
    assert m.loc[0, "induction_acc"] < 0.05
    assert m.loc[0, "loss"] == pytest.approx(np.log(64), rel=0.05)
    assert m.loc[200, "induction_acc"] > 0.99
    assert m.loc[200, "loss"] < 0.05
    assert lineage_checkpoints(lineage.root) == lineage.checkpoints


def test_lineage_is_deterministic_and_reused(tmp_path):
    a = train_lineage(tmp_path / "a", steps=3, save_every=1, seed=1)
    b = train_lineage(tmp_path / "b", steps=3, save_every=1, seed=1)
    c = train_lineage(tmp_path / "c", steps=3, save_every=1, seed=2)
    assert [lab for lab, _ in a.checkpoints] == ["step0", "step1", "step2", "step3"]
    for (_, pa), (_, pb), (_, pc) in zip(a.checkpoints, b.checkpoints, c.checkpoints):
        wa, wb, wc = (load_file(p / "model.safetensors") for p in (pa, pb, pc))
        assert wa.keys() == wb.keys()
        assert all(bool((wa[k] == wb[k]).all()) for k in wa)
        assert not bool(
            (wa["model.layers.0.self_attn.v_proj.weight"] == wc["model.layers.0.self_attn.v_proj.weight"]).all()
        )
    # training changed the weights between steps
    w0, w3 = (load_file(p / "model.safetensors") for p in (a.checkpoints[0][1], a.checkpoints[-1][1]))
    assert not bool(
        (w0["model.layers.1.self_attn.o_proj.weight"] == w3["model.layers.1.self_attn.o_proj.weight"]).all()
    )
    # reuse: same config returns the same lineage without rewriting files
    mtime = (a.checkpoints[-1][1] / "model.safetensors").stat().st_mtime_ns
    again = train_lineage(tmp_path / "a", steps=3, save_every=1, seed=1)
    assert (a.checkpoints[-1][1] / "model.safetensors").stat().st_mtime_ns == mtime
    pd.testing.assert_frame_equal(again.metrics, a.metrics)
    assert json.loads((tmp_path / "a" / "lineage.json").read_text())["config"]["seed"] == 1


def test_lineage_bad_arguments(tmp_path):
    with pytest.raises(OptionError, match=r"Need n_heads % n_kv_heads == 0 .*n_heads=4, n_kv_heads=3"):
        train_lineage(tmp_path, n_heads=4, n_kv_heads=3)
    with pytest.raises(OptionError, match="steps must be >= 1; got 0"):
        train_lineage(tmp_path, steps=0)
    with pytest.raises(MissingFileError, match="ckpt_step"):
        lineage_checkpoints(tmp_path)


def test_lineage_out_dir_that_is_no_folder_is_refused_before_training(tmp_path):
    """out_dir an existing file, in a folder that does not exist, empty or not a path: the library's error
    naming the path, before anything is trained or written (was a raw FileExistsError from mkdir)."""
    f = tmp_path / "a_file"
    f.write_text("keep me")
    with pytest.raises(OptionError, match=rf"out_dir: {re.escape(str(f))} is a file, not a directory"):
        train_lineage(f, steps=1)
    with pytest.raises(OptionError, match=rf"out_dir: {re.escape(str(f))} is a file"):
        train_lineage(str(f), steps=1, reuse=False)
    assert f.read_text() == "keep me"
    missing = tmp_path / "no" / "such" / "lineage"
    with pytest.raises(OptionError, match=rf"out_dir: the folder {re.escape(str(missing.parent))} does not exist"):
        train_lineage(missing, steps=1)
    assert not (tmp_path / "no").exists()
    with pytest.raises(OptionError, match="out_dir must not be empty"):
        train_lineage("", steps=1)
    with pytest.raises(OptionTypeError, match="out_dir must be a folder path; got int"):
        train_lineage(123, steps=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_last_checkpoint_equals_direct_report(lineage, traj):
    label, path = lineage.checkpoints[-1]
    got = traj.final().reset_index(drop=True)
    assert traj.final_label == label == "step200"
    direct = tli.idempotence_report(str(path), nulls=16, progress=False).heads.reset_index(drop=True)
    cols = ["layer", "head", "kv_head", "alpha", "P", "closed", "P_scrambled_median", "p_value"]
    pd.testing.assert_frame_equal(got[cols], direct[cols], check_exact=True)
    # and the same weights booted as a TransformerBridge give the same closure
    via_bridge = bridge_from_dir(path).idempotence_report(progress=False).heads
    np.testing.assert_allclose(got["P"], via_bridge["P"], rtol=1e-10, atol=0)
    np.testing.assert_allclose(got["alpha"], via_bridge["alpha"], rtol=1e-10, atol=0)
    # what closed: the four layer-1 copying heads, none in layer 0 (seed 0, measured)
    closed = got[got["closed"]]
    assert sorted(zip(closed["layer"], closed["head"])) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert got.loc[got["layer"] == 1, "P"].between(0.9, 0.95).all()
    assert got.loc[got["layer"] == 0, "P"].max() < 0.6


def test_random_init_is_null_like(traj):
    h = traj.heads
    init = h[h["checkpoint"] == "step0"]
    final = traj.final()
    med_init = float(init["P"].median())
    med_scr = float(init["P_scrambled_median"].median())
    # Measured over scramble seeds 0-2 with 16 and 64 draws: median P at init 0.0052 vs median
    # scrambled 0.0043-0.0069 (ratio 0.75-1.2), and random-init heads beat their own scramble
    # median for 2-5 of the 8 heads: the random init IS a random orientation.
    assert med_scr / 2 < med_init < 2 * med_scr
    assert init["P"].max() < 0.05
    frac_beat = float((init["P"] > init["P_scrambled_median"]).mean())
    assert 0.125 <= frac_beat <= 0.75
    # final closed heads: ~170x the init level, 40-80x their own null, above every draw
    fc = final[final["closed"]]
    assert len(fc) == 4
    assert fc["P"].min() > 100 * med_init
    assert (fc["P"] > 20 * fc["P_scrambled_median"]).all()
    assert np.allclose(fc["p_value"], 1 / 17)  # no scrambled draw reached the trained P
    assert traj.checkpoints.set_index("checkpoint").loc["step0", "n_closed"] == 0


def test_checkpoints_visited_one_at_a_time(lineage):
    live: weakref.WeakSet = weakref.WeakSet()
    seen: list[int] = []

    def loader(path):
        gc.collect()
        seen.append(len(live))  # models still alive when the next one is requested
        m = bridge_from_dir(path)
        live.add(m)
        return m

    tr = trajectory(lineage.checkpoints[:3], loader=loader, progress=False)
    assert seen == [0, 0, 0], f"models still resident when loading the next checkpoint: {seen}"
    gc.collect()
    assert len(live) == 0
    assert tr.checkpoints["kind"].eq("path").all()

    # the check itself can fail: a loader that leaks its models is caught
    leaked, seen2 = [], []

    def leaky(path):
        gc.collect()
        seen2.append(len(live))
        m = bridge_from_dir(path)
        live.add(m)
        leaked.append(m)
        return m

    trajectory(lineage.checkpoints[:2], loader=leaky, progress=False)
    assert seen2 == [0, 1]


def test_callable_checkpoints_are_dropped(lineage):
    live: weakref.WeakSet = weakref.WeakSet()
    seen: list[int] = []

    def make(path):
        def load():
            gc.collect()
            seen.append(len(live))
            m = bridge_from_dir(path)
            live.add(m)
            return m

        return load

    tr = trajectory([(lab, make(p)) for lab, p in lineage.checkpoints[:2]], progress=False)
    assert seen == [0, 0]
    assert tr.checkpoints["kind"].eq("callable").all()
    assert tr.checkpoints["step"].tolist() == [0.0, 20.0]


def _copy_checkpoints(ck, root):
    """Copies of some lineage checkpoints (the session lineage itself must never be modified)."""
    out = []
    for lab, p in ck:
        shutil.copytree(p, root / p.name)
        out.append((lab, root / p.name))
    return out


def test_cache(lineage, tmp_path, analysed):
    """The cache is a resume directory per checkpoint, keyed on each layer's weight fingerprint: a checkpoint
    is loaded again (to fingerprint its layers) but a layer whose weights did not change is not analysed again."""
    calls: list[str] = []

    def loader(path):
        calls.append(os.path.basename(path))
        return tli.head_source(path)  # the checkpoint-file source (no model is built)

    ck = _copy_checkpoints(lineage.checkpoints[:3], tmp_path / "ck")
    cache = tmp_path / "cache"
    first = trajectory(ck, loader=loader, cache_dir=cache, progress=False)
    assert calls == ["ckpt_step0", "ckpt_step20", "ckpt_step40"] and analysed == [0, 1] * 3
    assert not first.checkpoints["cached"].any()
    # one resume directory per checkpoint, one part (JSON record + parquet) per layer, no pickles
    dirs = sorted(p for p in cache.iterdir() if p.is_dir())
    # <order>-<label>-<hash of the options key>: other options are another folder
    assert [d.name.rsplit("-", 1)[0] for d in dirs] == ["0000-step0", "0001-step20", "0002-step40"]
    assert len({d.name.rsplit("-", 1)[1] for d in dirs}) == 1
    for d in dirs:
        assert sorted(p.name for p in d.glob("layer_*.json")) == ["layer_00000.json", "layer_00001.json"]
        assert (d / "manifest.json").is_file() and not list(d.glob("*.pkl"))
    analysed.clear()
    second = trajectory(ck, loader=loader, cache_dir=cache, progress=False)
    assert len(calls) == 6  # loaded again, to fingerprint the layers ...
    assert analysed == []  # ... but nothing was analysed again
    assert second.checkpoints["cached"].all()
    pd.testing.assert_frame_equal(first.heads, second.heads)
    # the new checkpoints columns: fingerprints and relations between checkpoints
    c = second.checkpoints
    assert (c["weights_fingerprint"].str.len() == 64).all() and c["weights_fingerprint"].nunique() == 3
    assert (c["identical_to"] == "").all() and (c["shares_layers_with"] == "").all()
    assert (c["n_shared_layers"] == 0).all() and c["processing_raw"].all()
    # a changed weight invalidates that checkpoint's changed layer only (content, not file times)
    f = ck[0][1] / "model.safetensors"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a touched file is still the same weights
    w = load_file(str(ck[1][1] / "model.safetensors"))
    w["model.layers.1.self_attn.o_proj.weight"] = w["model.layers.1.self_attn.o_proj.weight"] * 1.5
    save_file(w, str(ck[1][1] / "model.safetensors"), metadata={"format": "pt"})
    analysed.clear()
    with pytest.warns(UserWarning, match=r"0001-step20-[0-9a-f]{12}/layer_00001\.json: the layer's weights changed"):
        third = trajectory(ck, loader=loader, cache_dir=cache, progress=False)
    assert analysed == [1]
    assert third.checkpoints["cached"].tolist() == [True, False, True]
    changed = third.heads[third.heads["checkpoint"] == "step20"]
    direct = tli.idempotence_report(str(ck[1][1]), progress=False).heads.reset_index(drop=True)
    np.testing.assert_array_equal(changed["P"].to_numpy(), direct["P"].to_numpy())
    assert not np.array_equal(changed["P"].to_numpy(), first.heads[first.heads["checkpoint"] == "step20"]["P"])


def test_cache_with_other_options_is_another_key(lineage, tmp_path):
    ck = lineage.checkpoints[:2]
    trajectory(ck, cache_dir=tmp_path, progress=False)
    other = trajectory(ck, cache_dir=tmp_path, progress=False, threshold=0.5)
    assert not other.checkpoints["cached"].any() and other.threshold == 0.5


def test_identical_and_shared_checkpoints_are_marked(lineage, tmp_path):
    p0, p200 = lineage.checkpoints[0][1], lineage.checkpoints[-1][1]
    # a "checkpoint" whose layer 1 is step 200's and layer 0 is step 0's (a shard copied between releases)
    mixed = tmp_path / "mixed"
    shutil.copytree(p0, mixed)
    w0, w200 = load_file(str(p0 / "model.safetensors")), load_file(str(p200 / "model.safetensors"))
    w = {k: (w200[k] if k.startswith("model.layers.1.") else v) for k, v in w0.items()}
    save_file(w, str(mixed / "model.safetensors"), metadata={"format": "pt"})
    ck = [("step0", p0), ("again", p0), ("step200", p200), ("mixed", mixed)]
    with pytest.warns(
        UserWarning, match=r"again is identical to step0; mixed shares 2 layer\(s\) with step0,again,step200"
    ):
        tr = trajectory(ck, progress=False)
    c = tr.checkpoints.set_index("checkpoint")
    assert c["identical_to"].to_dict() == {"step0": "", "again": "step0", "step200": "", "mixed": ""}
    # layer 0 is step0's (and so also "again"'s), layer 1 is step200's
    assert c.loc["mixed", "shares_layers_with"] == "step0,again,step200" and c.loc["mixed", "n_shared_layers"] == 2
    assert c.loc["again", "weights_fingerprint"] == c.loc["step0", "weights_fingerprint"]
    assert c.loc["mixed", "weights_fingerprint"] not in (
        c.loc["step0", "weights_fingerprint"],
        c.loc["step200", "weights_fingerprint"],
    )
    assert tr.summary["n_identical"] == 1 and tr.summary["n_mixed"] == 1


def test_mixed_processing_is_refused_unless_allowed():
    a = SyntheticSource([gaussian_layer(l, 4, 2, 16, 4, seed=l) for l in range(2)], name="a")
    b = SyntheticSource([gaussian_layer(l, 4, 2, 16, 4, seed=10 + l) for l in range(2)], name="b")
    a.info = dataclasses.replace(a.info, processing={"raw": True, "fold_ln": False})
    b.info = dataclasses.replace(b.info, processing={"raw": False, "fold_ln": True})
    with pytest.raises(
        OptionError,
        match=r"processed differently \(a: raw=True, fold_ln=False.*b: raw=False, "
        r"fold_ln=True.*allow_mixed_processing=True",
    ):
        trajectory([("a", a), ("b", b)], progress=False)
    with pytest.warns(UserWarning, match="processed differently"):
        tr = trajectory([("a", a), ("b", b)], allow_mixed_processing=True, progress=False)
    c = tr.checkpoints.set_index("checkpoint")
    assert c["processing_raw"].to_dict() == {"a": True, "b": False}
    assert c["processing_fold_ln"].to_dict() == {"a": False, "b": True}
    assert c["kind"].eq("object").all()


def test_heads_subset_and_figures(lineage, traj):
    sub = trajectory(lineage.checkpoints, heads=[(1, 2), (0, 3)], progress=False)
    assert sorted(set(zip(sub.heads["layer"], sub.heads["head"]))) == [(0, 3), (1, 2)]
    assert len(sub.heads) == 2 * len(lineage.checkpoints)
    full = traj.heads.set_index(["checkpoint", "layer", "head"])["P"]
    for _, r in sub.heads.iterrows():
        assert r["P"] == full.loc[(r["checkpoint"], r["layer"], r["head"])]
    only1 = trajectory(lineage.checkpoints[-1:], heads=[(1, 0)], progress=False)
    assert only1.layers["layer"].tolist() == [1]  # only the needed layer was measured

    tr = traj.tracked_heads()
    assert tr["why"].eq("final P >= threshold").all()
    assert sorted(zip(tr["layer"], tr["head"])) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    fig = traj.figure()
    names = [t.name for t in fig.data]
    for h in range(4):
        assert f"L1H{h} P" in names and f"L1H{h} scramble median" in names
    trace = next(t for t in fig.data if t.name == "L1H1 P")
    assert list(trace.x) == [0, 20, 40, 60, 100, 200]
    np.testing.assert_allclose(trace.y, traj.wide().loc[(1, 1)].to_numpy())
    assert fig.layout.yaxis.type == "log"
    assert "final P ≥ 0.9" in fig.layout.title.text

    # no head closes at threshold 0.99: the figure says so and follows the top-k by final P
    strict = trajectory(lineage.checkpoints[-2:], threshold=0.99, progress=False)
    tk = strict.tracked_heads(top_k=3)
    assert tk["why"].eq("top-k by final P (none closed)").all()
    assert tk["final_P"].tolist() == sorted(strict.final()["P"], reverse=True)[:3]
    assert "NO head reached P ≥ 0.99" in strict.figure(top_k=3).layout.title.text
    s = traj.summary_figure()
    assert [t.name for t in s.data][:2] == ["median P (all heads)", "fraction with P ≥ 0.9"]
    np.testing.assert_allclose(s.data[1].y, [0, 0, 0, 0.25, 0.5, 0.5])


@pytest.mark.slow  # ~55 s on a loaded 2-core machine (the search dominates)
def test_search_capacity(lineage):
    """The layer's feasible P (constructive search, SPEC 5) is tracked next to the attained P."""
    tr = trajectory(lineage.checkpoints[::5], heads=[(1, 1)], search=True, progress=False)
    assert {"feasible_P", "layer_feasible_P"} <= set(tr.heads.columns)
    assert "feasible_P" in tr.layers.columns
    fin = tr.final().iloc[0]
    # search keeps S and D and optimizes orientation: it can reach at least the attained P
    assert fin["layer_feasible_P"] >= fin["P"] - 1e-6
    assert tr.heads["layer_feasible_P"].between(0, 1).all()
    # measured: the capacity is there at random init already (feasible P 0.94 at step 0, 0.99 at
    # step 200) while the attained P goes 0.017 -> 0.93: "capacity early, orientation late"
    init = tr.heads[tr.heads["checkpoint"] == "step0"].iloc[0]
    assert init["layer_feasible_P"] > 0.9 > 0.05 > init["P"]
    assert fin["P_searched"] >= fin["P"] - 1e-9
    names = [t.name for t in tr.figure().data]
    assert {
        "layer 1 feasible P (best searched P in the layer)",
        "L1H1 searched P (constructive search)",
        "L1H1 P",
    } <= set(names)


def test_bad_inputs(lineage, tmp_path, monkeypatch):
    ck = lineage.checkpoints
    with pytest.raises(OptionError, match="checkpoints is empty"):
        trajectory([], progress=False)
    with pytest.raises(OptionError, match=r"labels must be unique; repeated: \['step0'\]"):
        trajectory([ck[0], ck[0]], progress=False)
    with pytest.raises(OptionTypeError, match="pair"):
        trajectory([ck[0][1]], progress=False)
    with pytest.raises(OptionTypeError, match="cannot load a int"):
        trajectory([("a", 3)], progress=False)
    with pytest.raises(MissingFileError, match="does not exist"):
        trajectory([("a", tmp_path / "nope")], progress=False)
    with pytest.raises(OptionError, match=r"takes options from \['checkpoint_index', 'checkpoint_value', 'revision'\]"):
        trajectory([("a", ("EleutherAI/pythia-14m", {"step": 3}))], progress=False)
    with pytest.raises(OptionError, match=r"Checkpoint 'step0' has no heads \[\(1, 7\)\]"):
        trajectory(ck[:1], heads=[(1, 7)], progress=False)
    with pytest.raises(OptionError, match="threshold must be in"):
        trajectory(ck[:1], threshold=1.5, progress=False)
    with pytest.raises(OptionError, match=r"heads name layers \[1\] that are not in layers=\[0\]"):
        trajectory(ck[:1], heads=[(1, 0)], layers=[0], progress=False)
    with pytest.raises(TypeError, match="report_kwargs"):  # no passthrough any more: every option is explicit
        trajectory(ck[:1], report_kwargs={"nulls": 4}, progress=False)
    # the hub route fails clearly offline
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="HF_HUB_OFFLINE") as e:
        trajectory([("step1000", ("EleutherAI/pythia-14m", {"checkpoint_index": 3}))], progress=False)
    assert "local directories" in str(e.value)


def test_lineage_dir_and_step_parsing(lineage):
    tr = trajectory(str(lineage.root), heads=[(0, 0)], progress=False)
    assert tr.checkpoints["checkpoint"].tolist() == [lab for lab, _ in lineage.checkpoints]
    assert tr.checkpoints["step"].tolist() == [0.0, 20.0, 40.0, 60.0, 100.0, 200.0]
    unnamed = trajectory(
        [("init", lineage.checkpoints[0][1]), ("end", lineage.checkpoints[-1][1])], heads=[(0, 0)], progress=False
    )
    assert unnamed.heads["step"].isna().all()
    assert unnamed.x_axis() == ("order", "checkpoint") and tr.x_axis() == ("step", "training step")
    fig = unnamed.figure()  # x falls back to the checkpoint order
    assert fig.layout.xaxis.title.text == "checkpoint"
    assert list(fig.data[0].x) == [0, 1]
    assert tr.figure().layout.xaxis.title.text == "training step"
    explicit = trajectory(
        [("init", lineage.checkpoints[0][1], 0), ("end", lineage.checkpoints[-1][1], 200)],
        heads=[(0, 0)],
        progress=False,
    )
    assert explicit.heads["step"].tolist() == [0.0, 200.0]


def test_hub_route_loads_by_checkpoint_index(lineage, traj, tmp_path, monkeypatch, analysed):
    """(model_name, {"checkpoint_index"/"checkpoint_value": ...}) goes through TransformerBridge.boot_transformers
    (the hub is replaced by the local lineage here); results are cached by the layers' content."""
    from transformer_lens.model_bridge import TransformerBridge

    orig = TransformerBridge.boot_transformers
    paths = dict(lineage.checkpoints)
    calls = []

    def fake_boot(name, **kw):
        calls.append((name, kw))
        step = kw.get("checkpoint_value", [0, 20, 40, 60, 100, 200][kw.get("checkpoint_index", 0)])
        return orig(str(paths[f"step{step}"]), device=kw["device"])

    monkeypatch.setattr(TransformerBridge, "boot_transformers", fake_boot)
    ck = [("first", ("org/lineage", {"checkpoint_index": 0})), ("last", ("org/lineage", {"checkpoint_value": 200}))]
    tr = trajectory(ck, heads=[(1, 0), (1, 1)], cache_dir=tmp_path, progress=False)
    assert calls == [
        ("org/lineage", {"device": "cpu", "checkpoint_index": 0}),
        ("org/lineage", {"device": "cpu", "checkpoint_value": 200}),
    ]
    assert tr.checkpoints["kind"].eq("hub").all()
    # no number in "first" -> step unknown; "last" takes its checkpoint_value
    assert tr.heads["step"].iloc[:2].isna().all() and tr.heads["step"].iloc[2:].eq(200.0).all()
    ref = traj.heads.set_index(["checkpoint", "layer", "head"])["P"]
    for lab, src in (("first", "step0"), ("last", "step200")):
        got = tr.heads[tr.heads["checkpoint"] == lab].set_index(["layer", "head"])["P"]
        for (l, h), p in got.items():
            assert p == pytest.approx(ref.loc[(src, l, h)], rel=1e-10)
    assert analysed == [1, 1]  # only the layer of the selected heads, once per checkpoint
    analysed.clear()
    again = trajectory(ck, heads=[(1, 0), (1, 1)], cache_dir=tmp_path, progress=False)
    assert len(calls) == 4  # booted again, to fingerprint the layer ...
    assert analysed == [] and again.checkpoints["cached"].all()  # ... but served from the cache
    pd.testing.assert_frame_equal(again.heads, tr.heads)


def test_the_step_is_the_checkpoints_recorded_one(lineage, tmp_path):
    """A step comes from what the checkpoint records (checkpoint_value, trainer_state.json, the lineage manifest),
    never from a size in a name; a label or a given step that disagrees with the record is refused."""
    src = lineage.checkpoints[-1][1]
    tr = trajectory(str(lineage.root), heads=[(0, 0)], progress=False)
    assert tr.checkpoints["step_source"].eq("lineage manifest").all()
    assert tr.checkpoints["threshold"].eq(0.9).all()
    sized = trajectory([("pythia-70m", src)], heads=[(0, 0)], progress=False)
    assert sized.heads["step"].isna().all() and sized.checkpoints["step_source"].tolist() == [""]
    hf = tmp_path / "checkpoint-final"
    shutil.copytree(src, hf)
    (hf / "trainer_state.json").write_text(json.dumps({"global_step": 200}))
    with pytest.warns(UserWarning, match="identical"):
        got = trajectory([("final", hf), ("checkpoint-200", hf, 200)], heads=[(0, 0)], progress=False)
    assert got.checkpoints["step"].tolist() == [200.0, 200.0]
    assert got.checkpoints["step_source"].tolist() == ["trainer_state.json", "given"]
    with pytest.raises(OptionError, match=r"label 'step7' names step 7 but the checkpoint records step 200"):
        trajectory([("step7", hf)], progress=False)
    with pytest.raises(OptionError, match=r"step 5 was given for 'x' \(given\) but the checkpoint records step 200"):
        trajectory([("x", hf, 5)], progress=False)
    with pytest.raises(OptionError, match=r"names step 5 but the checkpoint records step 200 \(checkpoint_value\)"):
        trajectory([("step5", ("org/model", {"checkpoint_value": 200}))], progress=False)
    (hf / "trainer_state.json").write_text(json.dumps({"global_step": "late"}))
    with pytest.raises(tli.errors.CheckpointError, match=r"trainer_state\.json: global_step"):
        trajectory([("final", hf)], progress=False)


def test_client_with_a_loader_is_refused_up_front(lineage, tmp_path):
    class NotRun:
        def submit(self, *a, **k):
            raise AssertionError("nothing may be submitted")

        gather = submit

    ck = lineage.checkpoints[:2]
    with pytest.raises(OptionError, match="cannot be combined"):
        trajectory(ck, client=NotRun(), loader=bridge_from_dir, cache_dir=tmp_path / "c", progress=False)
    assert not (tmp_path / "c").exists()  # refused before anything was made
    with pytest.raises(OptionTypeError, match=r"client must be a distributed\.Client"):
        trajectory(ck, client=object(), progress=False)
