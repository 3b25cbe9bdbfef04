"""Any model -> a :class:`~tl_idempotence.core.heads.HeadSource`: the one entry every analysis uses.

:func:`head_source` accepts a TransformerLens model, a ``transformers`` model, a
checkpoint path, a user-written ``HeadSource``, or ``LayerHeads`` (one, or a list), and
returns a source that streams ``LayerHeads`` layer by layer.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..core.heads import HeadSource, LayerHeads, ModelInfo
from ..core.options import check_bool, strict_kwargs
from ..errors import OptionError, OptionTypeError, TLIError, UnsupportedModelError
from .architectures import check_architecture
from .checkpoint import CheckpointSource, from_path, from_transformers, is_transformers_model
from .names import missing_path_error, named_inputs, resolve_name
from .tl import TLModelSource, is_tl_model
from .zoo import cache_dir
from .zoo import source as zoo_source

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import ArchitectureLike, ModelLike

__all__ = ["LayerHeadsSource", "head_source", "model_inputs"]


class LayerHeadsSource:
    """A :class:`~tl_idempotence.core.heads.HeadSource` over ``LayerHeads`` already in memory.

    Args:
        layers: one ``LayerHeads`` or a sequence of them with distinct ``layer`` indices and
            the same ``(n_heads, n_kv_heads, d_model, d_head)``.
        info: what they are (default: sizes from the layers, ``model_name="LayerHeads"``).

    Raises:
        UnsupportedModelError: an item that is not a LayerHeads. OptionError: empty, repeated
            layer indices or layers of different sizes.
    """

    def __init__(self, layers: LayerHeads | Sequence[LayerHeads], info: ModelInfo | None = None):
        items = [layers] if isinstance(layers, LayerHeads) else list(layers)
        if not items:
            raise OptionError("No LayerHeads given.")
        bad = [type(x).__name__ for x in items if not isinstance(x, LayerHeads)]
        if bad:
            raise UnsupportedModelError(f"Expected LayerHeads; got {bad[:3]}.")
        idx = [x.layer for x in items]
        if len(set(idx)) != len(idx):
            raise OptionError(f"LayerHeads with repeated layer indices {sorted({i for i in idx if idx.count(i) > 1})}.")
        shapes = {(x.n_heads, x.n_kv_heads, x.d_model, x.d_head) for x in items}
        if len(shapes) != 1:
            raise OptionError(
                f"LayerHeads of different sizes (n_heads, n_kv_heads, d_model, d_head): {sorted(shapes)}."
            )
        n, nkv, d, r = shapes.pop()
        self._by_layer = {x.layer: x for x in items}
        self.info = info or ModelInfo(
            n_layers=max(idx) + 1,
            n_heads=n,
            n_kv_heads=nkv,
            d_model=d,
            d_head=r,
            model_name="LayerHeads",
            model_class="LayerHeads",
            processing={"source": "LayerHeads given directly"},
        )

    def layers(self) -> Iterator[int]:
        """The layer indices of the given LayerHeads, ascending."""
        return iter(sorted(self._by_layer))

    def layer_heads(self, layer: int) -> LayerHeads:
        """The LayerHeads given for ``layer`` (IndexError for any other layer)."""
        if layer not in self._by_layer:
            raise IndexError(f"Layer {layer} was not given (layers: {sorted(self._by_layer)}).")
        return self._by_layer[layer]

    def __iter__(self) -> Iterator[LayerHeads]:
        for layer in self.layers():
            yield self._by_layer[layer]


@strict_kwargs
def head_source(
    model: ModelLike,
    *,
    architecture: ArchitectureLike | None = None,
    prefix: str | None = None,
    check_finite: bool = True,
) -> HeadSource:
    """Turn a model, a loaded ``transformers`` model, a checkpoint path or LayerHeads into a HeadSource.

    Args:
        model: a TransformerLens model (HookedTransformer, HookedEncoder, TransformerBridge),
            a Hugging Face ``transformers`` ``PreTrainedModel``, a path (``str``/``Path``) to
            a model directory or ``.gguf`` file, a zoo name (``"smollm2-135m"``, or
            ``"zoo:smollm2-135m"``; a string that is also an existing path is refused as ambiguous:
            write ``zoo:NAME`` or pass ``pathlib.Path(NAME)``, see :mod:`~tl_idempotence.sources.names`),
            a ``LayerHeads`` or a list of them, or an existing
            :class:`~tl_idempotence.core.heads.HeadSource` (returned as is).
        architecture: for checkpoint directories and ``transformers`` models only: ``None``,
            a table name (``str``) or an entry dict forcing the architecture-table entry.
        prefix: for the same: ``None`` or the tensor-name root (``str``).
        check_finite: (``bool``) for checkpoint and ``transformers`` sources: raise on NaN/inf
            as each layer is read (the report loop checks every source's layers in any case).

    Raises:
        OptionTypeError / OptionError: an option of the wrong type or value (checked for every
            kind of model, before anything is read).
        UnknownOptionError: an unknown keyword (names the closest valid ones).
        UnsupportedModelError: an unsupported object (names what is supported).
        OptionError: ``architecture``/``prefix`` with a model that has no use for them.
        OptionError: a string that is both a zoo model name and an existing path (ambiguous).
        UnknownModelError: ``"zoo:NAME"`` with an unknown NAME.
        MissingFileError: a string that is neither an existing path nor a zoo name.
        MissingFileError / CheckpointError: see :func:`~tl_idempotence.sources.checkpoint.from_path`.
    """
    architecture = check_architecture(architecture)
    if prefix is not None and not isinstance(prefix, str):
        raise OptionTypeError(f"prefix must be None or the tensor-name root as a string; got {type(prefix).__name__}.")
    check_finite = check_bool(check_finite, "check_finite")
    file_opts = architecture is not None or prefix is not None
    if is_tl_model(model) or (isinstance(model, HeadSource) and not isinstance(model, (str, os.PathLike))):
        if file_opts:
            raise OptionError(
                "architecture= and prefix= apply to checkpoint directories and transformers models; a "
                f"{type(model).__name__} already knows its layout."
            )
        return TLModelSource(model) if is_tl_model(model) else cast(HeadSource, model)
    if isinstance(model, LayerHeads) or (
        isinstance(model, (list, tuple)) and model and all(isinstance(x, LayerHeads) for x in model)
    ):
        if file_opts:
            raise OptionError("architecture= and prefix= do not apply to LayerHeads.")
        return LayerHeadsSource(model)
    if isinstance(model, (str, os.PathLike)):
        named = resolve_name(model)  # the one rule (sources/names.py): an ambiguous name is refused
        if named.kind == "zoo":
            if file_opts:
                raise OptionError("architecture= and prefix= do not apply to a zoo model (its layout is known).")
            return zoo_source(str(named.value), progress=False)
        if named.kind == "unknown":
            raise missing_path_error(model)
        return from_path(model, architecture=architecture, prefix=prefix, check_finite=check_finite)
    if is_transformers_model(model):
        return from_transformers(model, architecture=architecture, prefix=prefix, check_finite=check_finite)
    raise UnsupportedModelError(
        f"Cannot read attention heads from a {type(model).__name__}. Supported: transformer_lens "
        "HookedTransformer / HookedEncoder / TransformerBridge, a transformers PreTrainedModel, a path to a "
        "Hugging Face model directory (config.json + *.safetensors) or a .gguf file, LayerHeads, or a HeadSource."
    )


def model_inputs(model: object) -> list[tuple[str, Path]]:
    """What a report over ``model`` reads from disk, as ``(what, path)`` pairs for
    :func:`~tl_idempotence.core.files.refuse_outputs_over_inputs` (checked before anything is opened).

    A string or path: :func:`~tl_idempotence.sources.names.named_inputs` (the checkpoint, or the zoo cache);
    a :class:`~tl_idempotence.sources.checkpoint.CheckpointSource`: the folder or GGUF file it streams (and
    the zoo cache for a zoo model's source); anything else (a model in memory, LayerHeads): nothing.

    Raises nothing: a name that cannot be resolved reads nothing here (:func:`head_source` then says why).
    """
    if isinstance(model, (str, os.PathLike)):
        try:
            return named_inputs(resolve_name(model))
        except TLIError:
            return []
    if isinstance(model, CheckpointSource):
        out = [] if model.path is None else [("the checkpoint", model.path)]
        if "zoo_model" in model.info.processing:
            out.append(("the zoo cache", cache_dir()))
        return out
    return []
