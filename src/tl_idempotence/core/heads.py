"""The per-layer head factors every analysis consumes (SPEC section 1), and what describes a model.

* :class:`LayerHeads` — one attention layer in the paper's **column form**: ``O`` (output
  writes, ``= W_O[l]ᵀ`` per head), ``V`` (value reads, ``= W_V[l]``, *unexpanded* kv heads)
  and ``kv_head_of`` (query head -> kv head). It checks its own shapes and dtypes, finds
  non-finite weights (naming layer and head) and fingerprints its exact bytes.
* :class:`Sizes` / :class:`ModelInfo` — attention sizes, and what was measured (name,
  class, weight processing; SPEC 10).
* :class:`HeadSource` — anything that yields ``LayerHeads`` layer by layer.
* :func:`kv_layout` — the standard GQA layout ``h -> h // (n_heads // n_kv_heads)``.

Sources (``tl_idempotence.sources``) produce these; analyses consume them. Imports torch and jaxtyping.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..errors import TLIError, UnsupportedModelError, WeightError
from .frozen import frozen

__all__ = [
    "HeadSource",
    "LayerHeads",
    "ModelInfo",
    "Sizes",
    "all_finite",
    "check_storage",
    "check_weights",
    "combined_fingerprint",
    "kv_layout",
    "read_layer",
    "source_info",
]


def _is_weight_dtype(t: Tensor) -> bool:
    return t.is_floating_point() and not t.is_complex()


def check_storage(x: Tensor, name: str) -> None:
    """Refuse tensors whose values cannot be read as a dense matrix: sparse layouts and the ``meta``
    device (a model built with ``device="meta"`` / ``init_empty_weights`` has shapes but no values).

    Raises:
        WeightError: a sparse (COO/CSR/CSC/BSR) tensor or a meta tensor (names it and the fix).
    """
    if x.layout != torch.strided:
        raise WeightError(
            f"{name} is a sparse tensor ({x.layout}); the OV products need dense weights: pass {name}.to_dense()."
        )
    if x.device.type == "meta":
        raise WeightError(
            f"{name} is on the 'meta' device: it has a shape but no values (a model built with device='meta' or "
            "init_empty_weights whose weights were never loaded). Load the weights first."
        )


def _storage_order(x: Tensor) -> Tensor | None:
    """``x``'s elements as a 1-D view in the order they lie in memory, or None when they do not fill one
    dense block (a slice with gaps, an expanded view): a permutation of a contiguous tensor (a
    transposed or split weight) becomes contiguous when its dims are sorted by stride."""
    if x.is_contiguous():
        return x.reshape(-1)
    strides = x.stride()
    order = sorted(range(x.ndim), key=lambda d: (-strides[d], -x.shape[d]))
    y = x.permute(order)
    return y.reshape(-1) if y.is_contiguous() else None


def all_finite(x: Tensor) -> bool:
    """Whether every element of a real floating-point tensor is finite, without copying it.

    ``min`` and ``max`` are NaN when any element is NaN, and ``±inf`` when one is ``±inf``, so both
    finite means every element is. Elements that fill one dense block (contiguous, or a permutation
    of a contiguous tensor) are reduced by one ``aminmax`` in storage order; any other layout (gaps,
    stride 0) by ``amax`` and ``amin`` over the view (``aminmax`` would first copy it). An empty
    tensor is finite.
    """
    if x.numel() == 0:
        return True
    x = x.detach()
    flat = _storage_order(x)
    lo, hi = torch.aminmax(flat) if flat is not None else (x.amin(), x.amax())
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def check_weights(x: Tensor, name: str, index_name: str | None = None) -> None:
    """Refuse weights that have no closure: non-float dtypes and NaN/inf values.

    The min and max over all of ``x``'s elements detect NaN/inf (:func:`all_finite`: both reductions
    propagate NaN; no copy). A permuted view (a checkpoint's ``o_proj`` split into heads) is reduced
    in storage order, one ``aminmax`` pass: head by head over the strided view it costs ~10x more; a
    235B layer is checked in ~10 ms. The elementwise scan that names the bad heads runs only when
    something is wrong.

    Args:
        x: ``[*lead, rows, cols]`` weights (a batch of heads, or one head).
        name: what ``x`` is, for the message ("W_O of layer 3").
        index_name: the name of the first leading dim ("head", "kv head").

    Raises:
        WeightError: integer/bool/complex dtype, a sparse or meta tensor (:func:`check_storage`), or NaN/inf
            (names the first bad index).
    """
    check_storage(x, name)
    if not _is_weight_dtype(x):
        raise WeightError(
            f"{name} has dtype {x.dtype}; OV weights must be real floating point (float16/bfloat16/float32/float64). "
            "Integer or quantized weights need dequantizing first; complex weights are not an OV circuit."
        )
    if x.numel() == 0:
        return
    if all_finite(x):
        return
    lead = x.shape[:-2]
    flat = x.reshape(-1, *x.shape[-2:]) if x.ndim >= 2 else x.reshape(1, 1, -1)
    bad = (~torch.isfinite(flat).flatten(1).all(dim=1)).nonzero().flatten().tolist()
    first = bad[0]
    where = "the matrix"
    if lead:
        idx = list(torch.unravel_index(torch.tensor(first), lead)) if len(lead) > 1 else [torch.tensor(first)]
        label = index_name or "index"
        where = f"{label} {[int(i) for i in idx] if len(idx) > 1 else int(idx[0])}"
        if len(bad) > 1:
            where += f" (and {len(bad) - 1} more: {bad[1:10]}{' ...' if len(bad) > 10 else ''})"
    n_nan = int(torch.isnan(flat[first]).sum())
    raise WeightError(
        f"{name} contains NaN or inf at {where} ({n_nan} NaN in the first). Closure is undefined for non-finite "
        "weights: check the checkpoint file or the weight processing that produced them."
    )


@dataclass(frozen=True)
class Sizes:
    """Attention sizes of a model (``d_head`` may differ from ``d_model // n_heads``, e.g. Gemma).

    Raises:
        WeightError: a size that is not a positive integer, or ``n_heads`` not a multiple of
            ``n_kv_heads``.
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int

    def __post_init__(self) -> None:
        for f in ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise WeightError(f"Attention size {f}={v!r} must be a positive integer.")
        if self.n_heads % self.n_kv_heads:
            raise WeightError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}: query heads cannot be "
                "grouped onto kv heads."
            )

    @property
    def sizes(self) -> Sizes:
        """The sizes alone (drops any description a subclass adds)."""
        return Sizes(self.n_layers, self.n_heads, self.n_kv_heads, self.d_model, self.d_head)


@dataclass(frozen=True)
class ModelInfo(Sizes):
    """What was measured: sizes, the model's name and class, and its weight processing (SPEC 10).

    Attributes:
        model_name, model_class: for the report.
        processing: flags of the weights measured (``raw``, ``fold_ln``,
            ``center_writing_weights``, ...), where they come from, and file provenance.
        extra: source details (format, path, architecture, tensor root, notes such as a
            post-attention norm after ``W_O``).

    ``processing`` and ``extra`` are read-only (:class:`~tl_idempotence.core.frozen.FrozenDict`, equal to and
    ``isinstance`` of ``dict``): every result that holds an info is immutable. ``dataclasses.replace`` or
    ``copy.deepcopy(info.processing)`` make changed copies.
    """

    model_name: str = "model"
    model_class: str = "unknown"
    processing: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        # read-only, like the report that holds it: rep.info.processing["fold_ln"] = True raised nothing and
        # changed what the report says it measured (and what rep.save wrote); a copy is copy.deepcopy(...)
        object.__setattr__(self, "processing", frozen(dict(self.processing)))
        object.__setattr__(self, "extra", frozen(dict(self.extra)))


def kv_layout(n_heads: int, n_kv_heads: int) -> Int[Tensor, " n_heads"]:  # type: ignore[name-defined]
    """Query head -> kv head for the standard ``repeat_interleave`` GQA layout.

    Used by TransformerLens, Hugging Face Llama/Qwen/Mistral/Gemma (``repeat_kv``)
    and llama.cpp: query head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``.

    Raises:
        WeightError: ``n_heads`` is not a positive multiple of ``n_kv_heads``.
    """
    if (
        isinstance(n_heads, bool)
        or isinstance(n_kv_heads, bool)
        or n_kv_heads <= 0
        or n_heads <= 0
        or n_heads % n_kv_heads
    ):
        raise WeightError(f"n_heads={n_heads} is not a positive multiple of n_kv_heads={n_kv_heads}.")
    return torch.arange(n_heads) // (n_heads // n_kv_heads)


@dataclass(frozen=True)
class LayerHeads:
    """One attention layer's heads in the paper's column form (SPEC section 1).

    Attributes:
        layer: layer index in the model (>= 0).
        O: ``[n_heads, d_model, d_head]`` output writes, ``O = W_O[l].transpose(-1, -2)``.
        V: ``[n_kv_heads, d_model, d_head]`` value reads, unexpanded (``= W_V`` per kv head).
        kv_head_of: ``[n_heads]`` int64, query head -> kv head, from the model's layout.

    Tensors keep the stored dtype (fp32/fp16/bf16); analyses promote to float64. The fields
    are annotated ``Tensor`` (not their jaxtyping shapes) because this constructor is where
    user tensors enter: ``__post_init__`` checks ranks, sizes and dtypes itself and raises
    :class:`~tl_idempotence.errors.WeightError` naming the layer.

    Raises:
        WeightError: O/V of another rank or disagreeing on ``(d_model, d_head)``, a non-float
            dtype, or a ``kv_head_of`` of the wrong shape/dtype or pointing outside ``V``.
    """

    layer: int
    O: Tensor  # [n_heads, d_model, d_head], checked in __post_init__
    V: Tensor  # [n_kv_heads, d_model, d_head]
    kv_head_of: Tensor  # [n_heads] integer

    def __post_init__(self) -> None:
        where = f"Layer {self.layer}"
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise WeightError(f"LayerHeads.layer must be a non-negative int; got {self.layer!r}.")
        for name, t in (("O", self.O), ("V", self.V)):
            if not isinstance(t, Tensor) or t.ndim != 3:
                raise WeightError(
                    f"{where}: {name} must be a 3-D tensor [heads, d_model, d_head]; got "
                    f"{getattr(t, 'shape', type(t).__name__)}."
                )
            check_storage(t, f"{where}: {name}")
            if not _is_weight_dtype(t):
                raise WeightError(f"{where}: {name} has dtype {t.dtype}; OV weights must be real floating point.")
        n_heads, d_model, d_head = self.O.shape
        n_kv, d_model_v, d_head_v = self.V.shape
        if (d_model, d_head) != (d_model_v, d_head_v):
            raise WeightError(
                f"{where}: O {tuple(self.O.shape)} and V {tuple(self.V.shape)} disagree on (d_model, d_head)."
            )
        if n_heads == 0 or n_kv == 0 or d_model == 0 or d_head == 0:
            raise WeightError(f"{where}: empty O {tuple(self.O.shape)} or V {tuple(self.V.shape)}.")
        kv = self.kv_head_of
        if not isinstance(kv, Tensor) or kv.is_floating_point() or kv.is_complex() or kv.dtype == torch.bool:
            raise WeightError(f"{where}: kv_head_of must be an integer tensor; got {getattr(kv, 'dtype', type(kv))}.")
        if kv.shape != (n_heads,):
            raise WeightError(f"{where}: kv_head_of has shape {tuple(kv.shape)}, expected ({n_heads},).")
        if int(kv.min()) < 0 or int(kv.max()) >= n_kv:
            raise WeightError(f"{where}: kv_head_of points outside the {n_kv} kv heads ({kv.tolist()}).")

    @property
    def n_heads(self) -> int:
        """Number of query heads (``O.shape[0]``)."""
        return int(self.O.shape[0])

    @property
    def n_kv_heads(self) -> int:
        """Number of kv heads (``V.shape[0]``; = n_heads for MHA, 1 for MQA)."""
        return int(self.V.shape[0])

    @property
    def d_model(self) -> int:
        """Residual width (``O.shape[1]``)."""
        return int(self.O.shape[1])

    @property
    def d_head(self) -> int:
        """Head dimension (``O.shape[2]``)."""
        return int(self.O.shape[2])

    def V_of_heads(self) -> Float[Tensor, "n_heads d_model d_head"]:
        """V expanded to query heads (a gather; avoid on huge layers)."""
        return self.V[self.kv_head_of]

    def check_finite(self, o_name: str | None = None, v_name: str | None = None) -> None:
        """Raise :class:`~tl_idempotence.errors.WeightError` naming layer and head if O or V holds NaN/inf.

        ``o_name``/``v_name`` say what O and V are in the message (a source names its file and
        tensor; default ``"W_O of layer 3"``). The layer remembers that it passed: a second call
        on the same object (a source checks what it read, then :func:`read_layer` checks every
        source's layers) does not scan again. O and V are not to be changed in place afterwards.
        """
        if self.__dict__.get("_checked_finite"):
            return
        check_weights(self.V, v_name or f"W_V of layer {self.layer}", "kv head")
        check_weights(self.O, o_name or f"W_O of layer {self.layer}", "head")
        object.__setattr__(self, "_checked_finite", True)  # frozen: its fields stay as they are

    def fingerprint(self) -> str:
        """sha256 (hex) of exactly what is measured: dtype, shapes, the bytes of O and V, the kv layout.

        Two layers with the same fingerprint have bit-identical factors (so identical
        numbers); any changed bit changes it. The bytes are hashed in C order whatever the
        layout: a strided tensor (a checkpoint's ``o_proj`` split into heads) is copied one
        head at a time into a small block, so no layer-sized copy is made (a fresh one costs
        page faults; the digest is the same). Cost: one pass over the layer's bytes (~1.7 GB/s
        here), small next to the products.
        """
        h = hashlib.sha256()
        for name, t in (("O", self.O), ("V", self.V), ("kv", self.kv_head_of.to(torch.int64))):
            t = t.detach()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
            if t.numel() == 0:
                continue
            # reshape(-1) before the byte view: a contiguous tensor with a size-1 dim may keep any stride
            # there (d_head = 1: O = W_Oᵀ has stride d_model in its last dim), which view(uint8) refuses.
            if t.ndim < 2 or (t.is_contiguous() and t.device.type == "cpu"):
                h.update(t.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().data)
                continue
            block = torch.empty(t.shape[1:], dtype=t.dtype)  # one head: the bytes of t[i] in C order
            for i in range(t.shape[0]):
                h.update(block.copy_(t[i]).reshape(-1).view(torch.uint8).numpy().data)
        return h.hexdigest()


def combined_fingerprint(layer_fingerprints: Any) -> str:
    """sha256 over ``layer:fingerprint`` lines in layer order (pairs of layer and :meth:`LayerHeads.fingerprint`):
    one key for all measured weights (a report's ``summary.weights_fingerprint``). Raises nothing of its own."""
    h = hashlib.sha256()
    for layer, fp in sorted(layer_fingerprints):
        h.update(f"{int(layer)}:{fp}\n".encode())
    return h.hexdigest()


def source_info(src: Any) -> ModelInfo:
    """``src.info`` when it is a :class:`ModelInfo`.

    Raises:
        UnsupportedModelError: the source has no ``ModelInfo`` in ``.info`` (names its class).
    """
    info = getattr(src, "info", None)
    if not isinstance(info, ModelInfo):
        raise UnsupportedModelError(
            f"The head source {type(src).__name__} has no ModelInfo in .info (got {type(info).__name__}); a "
            "HeadSource must describe its model with tl_idempotence.ModelInfo."
        )
    return info


def read_layer(src: Any, layer: int, info: ModelInfo | None = None) -> LayerHeads:
    """``src.layer_heads(layer)``, checked: for every source, built-in or user-written.

    Every analysis reads layers through this function, so what reaches the maths is a
    :class:`LayerHeads` of the layer asked for, with the sizes ``info`` promises, and finite
    weights.

    Args:
        src: a :class:`HeadSource`.
        layer: the layer index asked for.
        info: the source's :class:`ModelInfo` (sizes checked against it), or None.

    Raises:
        UnsupportedModelError: the source returned something that is not a ``LayerHeads``.
        WeightError: another layer than asked for, sizes that disagree with ``info``, NaN/inf
            weights (names layer and head), or the source itself failed (its error is chained
            and named).
    """
    name = type(src).__name__
    try:
        lh = src.layer_heads(layer)
    except (TLIError, MemoryError):
        raise
    except Exception as e:
        raise WeightError(f"The head source {name} failed to read layer {layer}: {type(e).__name__}: {e}") from e
    if not isinstance(lh, LayerHeads):
        raise UnsupportedModelError(
            f"The head source {name} returned a {type(lh).__name__} for layer {layer}; expected LayerHeads."
        )
    if lh.layer != layer:
        raise WeightError(f"The head source {name} returned layer {lh.layer} when asked for layer {layer}.")
    if info is not None:
        got = (lh.n_heads, lh.n_kv_heads, lh.d_model, lh.d_head)
        want = (info.n_heads, info.n_kv_heads, info.d_model, info.d_head)
        if got != want:
            raise WeightError(
                f"Layer {layer} from {name}: (n_heads, n_kv_heads, d_model, d_head) = {got}, but the source's "
                f"info says {want}."
            )
    lh.check_finite()
    return lh


@runtime_checkable
class HeadSource(Protocol):
    """Anything that streams :class:`LayerHeads` layer by layer.

    ``info`` describes the model; ``layers()`` lists the attention layer indices;
    ``layer_heads(l)`` reads one layer (and may raise ``IndexError`` for others).
    """

    info: ModelInfo

    def layers(self) -> Iterator[int]: ...

    def layer_heads(self, layer: int) -> LayerHeads: ...

    def __iter__(self) -> Iterator[LayerHeads]: ...
