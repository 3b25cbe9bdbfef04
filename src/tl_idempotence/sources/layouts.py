"""The stored layouts of a layer's value (V) and output (O) tensors: each one object (SPEC section 9).

A :class:`Layout` is everything the package knows about one way a checkpoint stores a layer's V or O
weight: its name (what ``layout`` says in an architecture entry), its description (the
``_format.layouts`` of :func:`~tl_idempotence.sources.architectures.architecture_table`), the stored
2-D shape for given attention sizes, the sizes it cannot hold (with the reason), and its reader: the
slices of the stored tensor that hold the heads, in the column form of
:class:`~tl_idempotence.core.heads.LayerHeads`. :mod:`.architectures` checks entries and shapes
against :data:`V_LAYOUTS` / :data:`O_LAYOUTS`, and :mod:`.checkpoint` reads every layer through them.

Adding a layout is one new :class:`Layout` in :data:`V_LAYOUTS` or :data:`O_LAYOUTS` (and a tiny
checkpoint in that layout in ``tests/sources``); ``scripts/derive_architectures.py`` keeps its own,
independent decoder of the same layouts to verify them against a forward pass.

Notation: ``nq`` query heads, ``nkv`` kv heads, ``dh = d_head``, ``dm = d_model``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from ..core.heads import Sizes
from ..errors import CheckpointError

__all__ = ["O_LAYOUTS", "V_LAYOUTS", "Layout", "TensorReader", "get_layout", "layout_docs"]


class TensorReader(Protocol):
    """What a layout reads through: one tensor by name, optionally only some rows or columns
    (the ``reader()`` of the stores in :mod:`.stores`)."""

    def read(self, name: str, rows: slice = ..., cols: slice = ...) -> Tensor:  # pragma: no cover - protocol
        ...


@dataclass(frozen=True)
class Layout:
    """One stored layout of a layer's V or O tensor.

    Attributes:
        name: the ``layout`` value of an architecture entry (``"linear"``, ``"fused_qkv"``, ...).
        kind: ``"v"`` (a value tensor, possibly fused with Q and K) or ``"o"`` (an output tensor).
        doc: what the stored tensor is and which of its rows/columns hold each head (one sentence or two).
        shape: sizes -> the stored 2-D shape.
        read: ``(reader, tensor name, sizes)`` -> the heads in column form: V ``[n_kv_heads, d_model,
            d_head]`` (kind ``"v"``), O ``[n_heads, d_model, d_head]`` (kind ``"o"``), in the stored dtype.
            Only the rows/columns that hold V are read from a fused tensor.
        misfit: ``(sizes, where they come from)`` -> ``None``, or why this layout cannot hold a model of
            these sizes (a clause that follows "the <name> layout ...", ending with what the sizes say).
    """

    name: str
    kind: Literal["v", "o"]
    doc: str
    shape: Callable[[Sizes], tuple[int, int]]
    read: Callable[[TensorReader, str, Sizes], Tensor]
    misfit: Callable[[Sizes, str], str | None] = lambda s, declared_by: None

    def check_sizes(self, s: Sizes, arch: str, declared_by: str) -> None:
        """Raise :class:`~tl_idempotence.errors.CheckpointError` when these sizes cannot be stored in this layout.

        Args:
            s: the attention sizes. arch: the architecture's name; declared_by: where the sizes come
                from (both for the message).
        """
        why = self.misfit(s, declared_by)
        if why is not None:
            raise CheckpointError(f"{arch}: the {self.name} layout {why}")


# ----------------------------------------------------------------------------- the readers


def _read_linear_v(r: TensorReader, name: str, s: Sizes) -> Tensor:
    return r.read(name).reshape(s.n_kv_heads, s.d_head, s.d_model).transpose(1, 2)


def _read_fused_v(r: TensorReader, name: str, s: Sizes) -> Tensor:
    nq, nkv, dh, dm = s.n_heads, s.n_kv_heads, s.d_head, s.d_model
    return r.read(name, rows=slice((nq + nkv) * dh, (nq + 2 * nkv) * dh)).reshape(nkv, dh, dm).transpose(1, 2)


def _read_neox_v(r: TensorReader, name: str, s: Sizes) -> Tensor:
    dh = s.d_head
    V = torch.stack([r.read(name, rows=slice((3 * h + 2) * dh, (3 * h + 3) * dh)) for h in range(s.n_heads)])
    return V.transpose(1, 2)


def _read_grouped_v(r: TensorReader, name: str, s: Sizes) -> Tensor:
    # [n_kv, group + 2, d_head, d_model]: a group's q heads, then k, then v
    dh, g = s.d_head, s.n_heads // s.n_kv_heads
    return torch.stack(
        [r.read(name, rows=slice((k * (g + 2) + g + 1) * dh, (k * (g + 2) + g + 2) * dh)) for k in range(s.n_kv_heads)]
    ).transpose(1, 2)


def _read_codegen_v(r: TensorReader, name: str, s: Sizes) -> Tensor:
    # 4 blocks of [q; v; k], each n_heads/4 heads wide
    nq, dh = s.n_heads, s.d_head
    local, per = nq * dh // 4, nq // 4
    starts = [(h // per) * 3 * local + local + (h % per) * dh for h in range(nq)]
    return torch.stack([r.read(name, rows=slice(a, a + dh)) for a in starts]).transpose(1, 2)


def _read_conv1d_v(r: TensorReader, name: str, s: Sizes) -> Tensor:
    nq, nkv, dh, dm = s.n_heads, s.n_kv_heads, s.d_head, s.d_model
    return r.read(name, cols=slice((nq + nkv) * dh, (nq + 2 * nkv) * dh)).reshape(dm, nkv, dh).permute(1, 0, 2)


def _read_linear_o(r: TensorReader, name: str, s: Sizes) -> Tensor:
    return r.read(name).reshape(s.d_model, s.n_heads, s.d_head).permute(1, 0, 2)


def _read_conv1d_o(r: TensorReader, name: str, s: Sizes) -> Tensor:
    return r.read(name).reshape(s.n_heads, s.d_head, s.d_model).transpose(1, 2)


# ----------------------------------------------------------------------------- what sizes a layout cannot hold


def _one_kv_per_query(s: Sizes, declared_by: str) -> str | None:
    if s.n_kv_heads != s.n_heads:
        return f"has one kv head per query head; {declared_by} says {s.n_heads} heads, {s.n_kv_heads} kv heads."
    return None


def _codegen_misfit(s: Sizes, declared_by: str) -> str | None:
    if (why := _one_kv_per_query(s, declared_by)) is not None:
        return why
    if s.n_heads % 4:
        return f"splits the heads into 4 blocks; {declared_by} says {s.n_heads} heads, not a multiple of 4."
    return None


# ----------------------------------------------------------------------------- the registries


def _by_name(*layouts: Layout) -> dict[str, Layout]:
    return {x.name: x for x in layouts}


#: Layouts of a value tensor, by name (in the order messages list them).
V_LAYOUTS: dict[str, Layout] = _by_name(
    Layout(
        "linear",
        "v",
        "torch.nn.Linear weight [out_features, in_features]. V: [n_kv_heads*d_head, d_model], kv head k = rows "
        "k*d_head:(k+1)*d_head.",
        lambda s: (s.n_kv_heads * s.d_head, s.d_model),
        _read_linear_v,
    ),
    Layout(
        "fused_qkv",
        "v",
        "one Linear weight with rows [q (n_heads*d_head); k (n_kv_heads*d_head); v (n_kv_heads*d_head)] (Phi-3 "
        "qkv_proj, llama.cpp attn_qkv); V = the last n_kv_heads*d_head rows.",
        lambda s: ((s.n_heads + 2 * s.n_kv_heads) * s.d_head, s.d_model),
        _read_fused_v,
    ),
    Layout(
        "neox_qkv",
        "v",
        "GPT-NeoX query_key_value Linear weight [n_heads*3*d_head, d_model] viewed as [n_heads, 3, d_head, "
        "d_model] (q, k, v per head, interleaved); V of head h = rows (3h+2)*d_head:(3h+3)*d_head.",
        lambda s: (3 * s.n_heads * s.d_head, s.d_model),
        _read_neox_v,
        _one_kv_per_query,
    ),
    Layout(
        "conv1d_qkv",
        "v",
        "GPT-2 c_attn Conv1D weight [d_model, (n_heads + 2 n_kv_heads)*d_head], columns [q; k; v]; V = the last "
        "n_kv_heads*d_head columns.",
        lambda s: (s.d_model, (s.n_heads + 2 * s.n_kv_heads) * s.d_head),
        _read_conv1d_v,
    ),
    Layout(
        "grouped_qkv",
        "v",
        "one Linear weight viewed as [n_kv_heads, n_heads/n_kv_heads + 2, d_head, d_model]: each kv group's query "
        "heads, then its k, then its v (Falcon new_decoder_architecture); V of kv head k = rows (k*(g+2) + "
        "g+1)*d_head:(k*(g+2) + g+2)*d_head with g = n_heads/n_kv_heads.",
        lambda s: ((s.n_heads + 2 * s.n_kv_heads) * s.d_head, s.d_model),
        _read_grouped_v,
    ),
    Layout(
        "codegen_qkv",
        "v",
        "CodeGen qkv_proj Linear weight [3*n_heads*d_head, d_model] in 4 blocks, each [q; v; k] of n_heads/4 "
        "heads; V of head h = rows b*3*L + L + j*d_head, b = h // (n_heads/4), j = h % (n_heads/4), L = "
        "n_heads*d_head/4.",
        lambda s: (3 * s.n_heads * s.d_head, s.d_model),
        _read_codegen_v,
        _codegen_misfit,
    ),
)

#: Layouts of an output tensor, by name.
O_LAYOUTS: dict[str, Layout] = _by_name(
    Layout(
        "linear",
        "o",
        "torch.nn.Linear weight [out_features, in_features]. O: [d_model, n_heads*d_head], head h = columns "
        "h*d_head:(h+1)*d_head.",
        lambda s: (s.d_model, s.n_heads * s.d_head),
        _read_linear_o,
    ),
    Layout(
        "conv1d",
        "o",
        "transformers Conv1D weight [in_features, out_features] (GPT-2). O: [n_heads*d_head, d_model], head h = "
        "rows h*d_head:(h+1)*d_head (transposed).",
        lambda s: (s.n_heads * s.d_head, s.d_model),
        _read_conv1d_o,
    ),
)


def get_layout(kind: str, name: str) -> Layout:
    """The layout ``name`` of a ``kind`` (``"v"`` or ``"o"``) tensor.

    Raises:
        CheckpointError: no such layout (an entry that skipped
            :func:`~tl_idempotence.sources.architectures.check_entry`; names the valid ones).
    """
    table = V_LAYOUTS if kind == "v" else O_LAYOUTS
    try:
        return table[name]
    except (KeyError, TypeError):
        what = "value" if kind == "v" else "output"
        raise CheckpointError(f"Unknown {what} tensor layout {name!r} (valid: {', '.join(table)}).") from None


def layout_docs() -> dict[str, str]:
    """``{layout name: description}`` of every layout (a name both V and O use has both sentences), in the
    order of the architecture table's documentation: ``linear``, ``conv1d``, then the fused V layouts."""
    names = ["linear", "conv1d", *[n for n in V_LAYOUTS if n != "linear"]]
    out: dict[str, str] = {}
    for n in names:
        docs = [t[n].doc for t in (V_LAYOUTS, O_LAYOUTS) if n in t]
        out[n] = docs[0] if len(docs) == 1 else f"{docs[0]} {docs[1].split('. ', 1)[1]}"
    return out
