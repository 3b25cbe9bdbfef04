"""What the token probes' results share when saved and when joined with a model (SPEC 12).

A :class:`~tl_idempotence.probes.head_tokens.HeadTokens` or
:class:`~tl_idempotence.probes.token_effect.AttendedTokenEffect` is saved as a report is
(:func:`~tl_idempotence.core.records.write_tables_record`: a folder of parquet tables and one JSON record holding
their sha256s and its own digest; no pickle). The record holds ``summary``, ``options``, ``info`` (the
:class:`~tl_idempotence.core.heads.ModelInfo`'s fields) and ``float_keys``; :func:`write_probe` writes it and
:func:`read_probe` reads it back, checked; each result's loader recomputes from its tables what the record states.

A result knows the weights it was computed from: ``summary["weights_fingerprint"]`` (sha256 over the measured
layers' :meth:`~tl_idempotence.core.heads.LayerHeads.fingerprint`, the report's combined key) and
``summary["embedding_fingerprint"]`` (:func:`embedding_fingerprint` of ``W_E`` and ``W_U``). :func:`check_model_fits`
compares them, the sizes and the weights' processing with a model's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..core.frozen import thawed
from ..core.heads import LayerHeads, ModelInfo, check_weights, combined_fingerprint, read_layer
from ..core.jsonio import json_restore
from ..core.legacy import NOT_MEASURED, summary_after_check
from ..core.legacy import upgrade as upgrade_layout
from ..core.outputs import check_save_target
from ..core.processing import PROCESSING_FLAGS
from ..core.records import (
    check_float_keys,
    check_identity,
    float_keys,
    index_column,
    read_tables_record,
    write_tables_record,
)
from ..core.selection import head_labels, select_heads
from ..core.store import saved_folder
from ..core.stored import StoredResult
from ..core.tables import ModelResult
from ..errors import OptionTypeError, ReportFileError, ReportMismatchError, UnsupportedModelError
from ..sources.tl import TLModelSource, is_tl_model
from ..views.results import DrawnResult
from .legacy import V030_COSINES

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import PathLike

__all__ = [
    "FREE_MODEL_FIELDS",
    "FREE_WINDOW_FIELDS",
    "ProbeSave",
    "TokenResult",
    "check_missing_cosines",
    "check_model_fits",
    "check_summary",
    "edited_error",
    "embedding_fingerprint",
    "embedding_matrices",
    "label_heads",
    "model_fingerprints",
    "probe_fields",
    "probe_info",
    "probe_model",
    "read_probe",
    "read_probe_save",
    "same_floats",
    "write_probe",
]

#: Record fields of a token probe's save that nothing else states (``StoreSpec.free_fields``): the model's sizes it
#: did not use and the weights' sha256s, recorded once; :meth:`TokenResult.check_model` compares them with a model
#: (an edited one refuses the model the result came from: loud, never a wrong number).
FREE_MODEL_FIELDS = (
    ("info.n_layers", "the model's layer count, recorded once (check_model compares it with a model)"),
    ("info.d_model", "the model's width, recorded once (check_model compares it with a model)"),
    ("info.d_head", "the model's head size, recorded once (check_model compares it with a model)"),
    ("summary.weights_fingerprint", "the sha256 of the measured layers, recorded once (check_model reads it)"),
    ("summary.embedding_fingerprint", "the sha256 of W_E and W_U, recorded once (check_model reads it)"),
)
#: Record fields of a save of a probe run over windows of text (the attended-token effect, the causal test of
#: closure) that nothing else states: what was asked for and how the model's final norm was read.
FREE_WINDOW_FIELDS = (
    ("summary.final_norm", "how the model's final norm was read, recorded once from the model"),
    ("summary.n_windows", "the windows run (the positions table holds those with a counted position)"),
    ("options.seq_len", "the window length asked for (the positions table holds the windows as run)"),
    ("options.max_tokens", "the token budget asked for (the positions table holds what was run)"),
    ("options.corpus", "the name of the text given, recorded once"),
)


#: What ``summary["processing"]`` says of a flag TransformerLens keeps no record of and the weights cannot show.
NOT_RECORDED = "not recorded: TransformerLens keeps no flag for it and the weights read here cannot show it"


def probe_info(model: Any, info: ModelInfo, W_U: torch.Tensor) -> ModelInfo:
    """``info`` with every weight-processing flag (:data:`~tl_idempotence.core.processing.PROCESSING_FLAGS`) in its
    ``processing``: a flag the model's record lacks (a model not loaded by ``tli.models.load``) is read where the
    weights show it (``center_unembed``: every row of ``W_U`` has mean 0 over the vocabulary, within float rounding
    of its scale; None for ``W_U = 0``) or recorded as None with a note (``fold_value_biases``). The same for the
    probes' results and :func:`check_model_fits`. Raises nothing of its own.
    """
    proc = dict(info.processing)
    if all(k in proc for k in PROCESSING_FLAGS):
        return info
    if "center_unembed" not in proc:
        with torch.no_grad():  # row by row: no float64 copy of W_U
            top = max((float(r.abs().max()) for r in W_U), default=0.0)
            worst = max((float(r.double().mean().abs()) for r in W_U), default=0.0)
        eps = torch.finfo(W_U.dtype).eps if W_U.dtype.is_floating_point else 0.0
        proc["center_unembed"] = None if top == 0 else bool(worst <= 4 * eps * top)
        proc["center_unembed_note"] = (
            "inferred from W_U's row means over the vocabulary (TL records no flag)" if top else "W_U is zero"
        )
    for k in PROCESSING_FLAGS:
        if k not in proc:
            proc[k] = None
            proc[f"{k}_note"] = NOT_RECORDED
    return dataclasses.replace(info, processing=proc)


def embedding_matrices(model: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_E [d_vocab, d_model], W_U [d_model, d_vocab])`` of a TransformerLens model, checked (SPEC 12).

    Raises:
        UnsupportedModelError: not a TransformerLens model, no ``W_E``/``W_U``, shapes that do not chain, or
            ``d_vocab_out != d_vocab`` (names which).
        WeightError: NaN/inf, non-float, sparse or meta weights (:func:`~tl_idempotence.core.heads.check_weights`).
    """
    if not is_tl_model(model):
        raise UnsupportedModelError(
            f"{where} reads a TransformerLens model (HookedTransformer or TransformerBridge); got "
            f"{type(model).__name__}. Load one with tli.models.load(name)."
        )
    mats = []
    for name in ("W_E", "W_U"):
        try:
            w = getattr(model, name)
        except Exception as e:  # any failure means the model has no such matrix
            raise UnsupportedModelError(
                f"{where} needs the model's embedding and unembedding (model.W_E, model.W_U); "
                f"{type(model).__name__} has no {name} ({type(e).__name__})."
            ) from e
        if not isinstance(w, torch.Tensor) or w.ndim != 2:
            raise UnsupportedModelError(
                f"{where}: model.{name} must be a 2-D tensor; got {getattr(w, 'shape', type(w).__name__)}."
            )
        mats.append(w.detach())
    W_E, W_U = mats
    d_model = int(model.cfg.d_model)
    if W_E.shape[1] != d_model or W_U.shape[0] != d_model:
        raise UnsupportedModelError(
            f"{where}: W_E {tuple(W_E.shape)} and W_U {tuple(W_U.shape)} do not chain through d_model={d_model}."
        )
    if W_U.shape[1] != W_E.shape[0]:
        raise UnsupportedModelError(
            f"{where}: d_vocab_out ({W_U.shape[1]}, W_U's columns) != d_vocab ({W_E.shape[0]}, W_E's rows); a "
            "token's row of the OV circuit has no logit of its own token to compare."
        )
    if W_E.shape[0] < 2:
        raise UnsupportedModelError(f"{where}: d_vocab = {W_E.shape[0]}; a rank needs at least two tokens.")
    check_weights(W_E, "W_E (model.W_E)")
    check_weights(W_U, "W_U (model.W_U)")
    return W_E, W_U


def embedding_fingerprint(W_E: torch.Tensor, W_U: torch.Tensor) -> str:
    """sha256 (hex) of W_E's and W_U's dtype, shape and bytes (C order). Raises nothing of its own."""
    h = hashlib.sha256()
    for name, w in (("W_E", W_E), ("W_U", W_U)):
        w = w.detach()
        h.update(f"{name}:{w.dtype}:{tuple(w.shape)};".encode())
        for s in range(0, w.shape[0], 4096):  # row blocks: no full copy of a transposed or tied matrix
            h.update(w[s : s + 4096].contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def probe_model(
    model: Any, heads: Any, where: str
) -> tuple[torch.Tensor, torch.Tensor, TLModelSource, ModelInfo, dict[int, list[int]]]:
    """What a token probe reads of ``model`` first (SPEC 12): ``(W_E, W_U, source, info, heads)``: the checked
    embedding and unembedding (:func:`embedding_matrices`; ``where``: the probe, for messages), its head source,
    its info with every processing flag (:func:`probe_info`) and ``heads`` selected
    (:func:`~tl_idempotence.core.selection.select_heads`, labels accepted: ``{layer: sorted heads}``).

    Raises:
        The errors of :func:`embedding_matrices` and of ``select_heads`` (OptionTypeError / OptionError).
    """
    W_E, W_U = embedding_matrices(model, where)
    src = TLModelSource(model)
    info = probe_info(model, src.info, W_U)
    return W_E, W_U, src, info, select_heads(heads, list(src.layers()), info.n_heads, labels=True)


def model_fingerprints(layers: Mapping[int, LayerHeads], W_E: torch.Tensor, W_U: torch.Tensor) -> dict[str, str]:
    """A token probe's summary fields of the weights it read: ``weights_fingerprint`` (of the measured ``layers``,
    :func:`~tl_idempotence.core.heads.combined_fingerprint`) and ``embedding_fingerprint``
    (:func:`embedding_fingerprint`). Raises nothing."""
    return {
        "weights_fingerprint": combined_fingerprint([(lay, lh.fingerprint()) for lay, lh in layers.items()]),
        "embedding_fingerprint": embedding_fingerprint(W_E, W_U),
    }


class TokenResult(StoredResult, ModelResult, DrawnResult):
    """Base of the token probes' results (``HeadTokens``, ``AttendedTokenEffect``): their headline, their text
    (:meth:`ranked_text`) and :meth:`check_model`, which refuses a model the result was not computed from."""

    #: The probe's name in a refusal (``"head_tokens"``): the name its :class:`~tl_idempotence.core.stored.StoreSpec`
    #: declares (the probe's function's name).
    probe_name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that declares its own ``store`` and no ``probe_name`` gets the store's name. Raises nothing."""
        super().__init_subclass__(**kwargs)
        store = cls.__dict__.get("store")
        if store is not None and "probe_name" not in cls.__dict__:
            cls.probe_name = store.name

    @property
    def headline(self) -> str:
        """One sentence: what was asked, the answer, the supporting number."""
        return str(self.summary["headline"])

    def to_text(self, n: int = 10) -> str:
        """The result as plain text (each subclass says what)."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.to_text()

    def ranked_text(self, by: str, cols: list[str], n: int) -> str:
        """The headline, the convention and the ``cols`` of the ``n`` heads lowest and highest in ``by``.

        Raises:
            TypeError / ValueError: ``n`` is not a non-negative whole number (pandas' ``head``/``tail``).
        """
        t = self._table.sort_values(by, kind="stable")[cols]
        parts = [self.headline, f"({self.summary['convention']})", t.head(n).to_string()]
        if len(t) > n:
            parts += ["...", t.tail(min(n, len(t) - n)).to_string()]
        return "\n".join(parts)

    def check_model(self, model: Any) -> None:
        """Refuse a model this result was not computed from: other sizes, weight processing, weights of a measured
        layer (``summary["weights_fingerprint"]``) or embeddings (``summary["embedding_fingerprint"]``).

        Raises:
            OptionTypeError: not a TransformerLens model. ReportMismatchError (an ``OptionError``): names what
                differs.
        """
        layers = sorted({int(x) for x in self._table["layer"]})
        check_model_fits(self.probe_name, self.summary, self.info, layers, model)


def edited_error(f: Path, what: str, again: str) -> ReportFileError:
    """The refusal of a saved file that disagrees with the rest of its save: names the file and what differs."""
    return ReportFileError(f"{f}: {what}: the record or a table was edited. Compute {again} again.")


def label_heads(table: pd.DataFrame, f: Path, again: str) -> list[str]:
    """Index a saved per-head ``table`` (read from ``f``) by the ``"L10H8"`` labels of its ``layer``/``head``
    columns, in place, and return them.

    Raises:
        ReportFileError: ``layer``/``head`` not whole numbers (:func:`~tl_idempotence.core.records.index_column`); no
            heads, or a head that repeats (:func:`edited_error`, naming ``f``; ``again``: what to compute again).
    """
    table.index = head_labels(index_column(table, "layer", f), index_column(table, "head", f))
    if table.index.duplicated().any() or not len(table):
        raise edited_error(f, "no heads, or a head that repeats", again)
    return list(table.index)


def check_summary(summary: Any, fresh: Mapping[str, Any], rec: Path, again: str) -> Any:
    """Refuse a saved ``summary`` (of the record ``rec``) whose fields differ from ``fresh``, what the tables give;
    the headline wanted is ``fresh``'s followed by what was not measured (a save of an earlier layout,
    :mod:`tl_idempotence.core.legacy`). Returns the summary to keep (an upgraded one with its headline set).

    Raises:
        ReportFileError: names the record and the first field that differs (:func:`edited_error`).
    """
    if "headline" in fresh:
        summary, want = summary_after_check(summary, fresh["headline"])
        fresh = {**fresh, "headline": want}
    for key, v in fresh.items():
        if summary.get(key) != v:
            raise edited_error(rec, f"summary[{key!r}] is {summary.get(key)!r} but {v!r} from the tables", again)
    return summary


def same_floats(a: Any, b: Any) -> bool:
    """Whether two arrays of numbers are equal element by element, NaN equal to NaN (exactly; same shape)."""
    return bool(np.array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float), equal_nan=True))


def write_probe(
    what: str,
    path: PathLike,
    fmt: str,
    record: str,
    tables: dict[str, pd.DataFrame],
    result: Any,
    overwrite: bool,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Save ``result`` (its ``summary``, ``options``, ``info``, ``loaded_from``) with ``tables`` to the folder ``path``.

    Raises:
        OptionTypeError: ``path`` not a path; ``overwrite`` not a bool. OutputOverInputError (an ``OptionError``):
            ``path`` is the folder ``result`` was loaded from, or in it. OptionError: ``path`` ends in a file
            extension; as :func:`~tl_idempotence.core.records.write_tables_record` (a non-empty folder, a missing
            parent, an edited earlier record; names it).
    """
    check_save_target(path, f"A {what} save", what, result.loaded_from)
    return str(write_tables_record(path, fmt, record, tables, probe_fields(result, extra), overwrite))


def probe_fields(result: Any, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record fields of a token probe's save: ``summary``, ``options``, ``info`` (the
    :class:`~tl_idempotence.core.heads.ModelInfo`'s fields), ``extra`` and ``float_keys``. Raises nothing."""
    summary, options = thawed(dict(result.summary)), thawed(dict(result.options))
    info = {f.name: thawed(getattr(result.info, f.name)) for f in dataclasses.fields(result.info)}
    fields: dict[str, Any] = {"summary": summary, "options": options, "info": info, **thawed(dict(extra or {}))}
    fields["float_keys"] = sorted(float_keys(fields))
    return fields


def read_probe(
    path: PathLike, fmt: str, record: str, names: frozenset[str], restated: tuple[str, ...] = ("seed",)
) -> tuple[Path, dict[str, Any], dict[str, pd.DataFrame], ModelInfo]:
    """Read what :func:`write_probe` wrote: ``(folder, record fields, tables, info)``, every digest checked, and THE
    identity check (:func:`~tl_idempotence.core.records.check_identity`: the summary's model fields against the info,
    ``restated``, the options the summary restates, against the options, the table's heads and kv map against the
    info's sizes).

    Raises:
        MissingFileError: no such folder, no record, a listed table missing (names it).
        ReportFileError: another format, an edited record or table (names it), tables other than ``names``, a
            malformed record (no summary, options, info or float_keys).
        OptionTypeError: ``path`` is not a path.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise OptionTypeError(f"The saved folder must be a path; got {type(path).__name__}.")
    d = saved_folder(Path(path).expanduser(), record)  # an overwrite stopped between its two renames
    rec = d / record
    raw, tables = read_tables_record(d, record, (fmt,), frozenset())
    raw, tables = upgrade_layout(rec, raw, tables)  # a save of an earlier layout (0.3.0), checked as written
    fk = raw.get("float_keys")
    if not (isinstance(fk, list) and all(isinstance(k, str) for k in fk)):
        raise ReportFileError(f"{rec}: a malformed record (float_keys is not a list of names).")
    fields = json_restore(raw, frozenset(fk), int_keys=False)
    if set(tables) != set(names):
        raise ReportFileError(f"{rec} lists tables {sorted(tables)}; this save has {sorted(names)}.")
    for k in ("summary", "options", "info"):
        if not isinstance(fields.get(k), dict):
            raise ReportFileError(f"{rec}: a malformed record (no {k}).")
    try:
        info = ModelInfo(**fields["info"])
    except (TypeError, ValueError) as e:
        raise ReportFileError(f"{rec}: a malformed info ({type(e).__name__}: {e}).") from e
    check_float_keys(rec, fields, fk)
    check_identity(rec, fields["summary"], fields["options"], restated, info, tables.get("table"), d / "table.parquet")
    return d, fields, tables, info


@dataclasses.dataclass(frozen=True)
class ProbeSave:
    """A probe's save read back by :func:`read_probe_save`: its folder, record file, record fields, tables, info and
    head labels (its table indexed by them), and ``again``, what to compute again when a file was edited."""

    folder: Path
    record: Path
    fields: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    info: ModelInfo
    labels: list[str]
    again: str

    def file(self, name: str) -> Path:
        """The file of the table ``name`` (``table.parquet``)."""
        return self.folder / f"{name}.parquet"

    def edited(self, f: Path, what: str) -> ReportFileError:
        """:func:`edited_error` of ``f``, with what to compute again."""
        return edited_error(f, what, self.again)


def read_probe_save(
    path: PathLike,
    fmt: str,
    record: str,
    names: frozenset[str],
    restated: tuple[str, ...],
    again: str,
    columns: Mapping[str, tuple[tuple[str, ...], str]],
) -> ProbeSave:
    """What every token probe's loader reads first: :func:`read_probe`, then the columns of the tables in
    ``columns`` (name -> (columns, what they are for the message)), in order, then the head labels of its
    ``table`` (:func:`label_heads`; ``again``: what to compute again).

    Raises:
        The errors of :func:`read_probe` and :func:`label_heads`. ReportFileError: a table of other columns
            (``"{file} has columns [...], not {what}."``).
    """
    d, fields, tables, info = read_probe(path, fmt, record, names, restated)
    for name, (want, what) in columns.items():
        if tuple(tables[name].columns) != want:
            raise ReportFileError(f"{d / f'{name}.parquet'} has columns {list(tables[name].columns)}, not {what}.")
    labels = label_heads(tables["table"], d / "table.parquet", again)
    return ProbeSave(d, d / record, fields, tables, info, labels, again)


def check_model_fits(what: str, summary: Mapping[str, Any], info: ModelInfo, layers: list[int], model: Any) -> None:
    """Refuse a model whose sizes, weight processing, measured layers' weights (``weights_fingerprint``) or
    embeddings (``embedding_fingerprint``) are not those the result was computed from.

    Raises:
        OptionTypeError: not a TransformerLens model. ReportMismatchError (an ``OptionError``): names what differs.
    """
    if not is_tl_model(model):
        raise OptionTypeError(
            f"A {what} result is checked against a TransformerLens model (HookedTransformer or TransformerBridge); "
            f"got {type(model).__name__}."
        )
    src = TLModelSource(model)
    with torch.no_grad():
        mine = probe_info(model, src.info, model.W_U.detach())
    again = f"compute the {what} result again from this model."
    if mine.sizes != info.sizes:
        raise ReportMismatchError(
            f"This {what} result is of a model of sizes {info.sizes}; this one has {mine.sizes}: {again}"
        )
    proc = dict(mine.processing)
    if NOT_MEASURED in summary:  # a 0.3.0 save predates two flags: not compared (W_U's fingerprint is, below)
        proc = {k: v for k, v in proc.items() if k in info.processing}
    if proc != dict(info.processing):
        raise ReportMismatchError(
            f"This {what} result was computed from weights processed as {dict(info.processing)}; this model's are "
            f"{dict(mine.processing)}: {again}"
        )
    fp = combined_fingerprint([(lay, read_layer(src, lay, mine).fingerprint()) for lay in layers])
    if fp != summary.get("weights_fingerprint"):
        raise ReportMismatchError(
            f"This {what} result was computed from other attention weights (layers {layers[:8]}: weights_fingerprint "
            f"{str(summary.get('weights_fingerprint'))[:12]}..., this model's {fp[:12]}...): {again}"
        )
    with torch.no_grad():
        efp = embedding_fingerprint(model.W_E, model.W_U)
    if efp != summary.get("embedding_fingerprint"):
        raise ReportMismatchError(
            f"This {what} result was computed from other embeddings (W_E, W_U: embedding_fingerprint "
            f"{str(summary.get('embedding_fingerprint'))[:12]}..., this model's {efp[:12]}...): {again}"
        )


def check_missing_cosines(fc: Path, fr: Path, ranked: np.ndarray, has_cosine: np.ndarray, summary: Any) -> None:
    """A self-cosine is missing at a ranked token only where the token's unembedding column is zero (the cosine's
    denominator): then for every head that ranks the token, so the same tokens for every head, and not at every
    ranked token at once (a head's output would then have to vanish on every token with an unembedding), unless the
    save says the cosines were not measured (``summary["not_measured"]`` holds
    :data:`~tl_idempotence.probes.legacy.V030_COSINES`: a 0.3.0 save). ``ranked``, ``has_cosine``: ``[heads,
    tokens]``.

    Raises:
        ReportFileError: missing cosines that no unembedding gives (names ``fc``).
    """
    again = "tli.head_tokens"
    gap = ranked & ~has_cosine
    if not gap.any():
        return
    nm = summary.get(NOT_MEASURED) if isinstance(summary, dict) else None
    if isinstance(nm, dict) and V030_COSINES in nm:
        return
    if (gap.any(axis=0) & (ranked & has_cosine).any(axis=0)).any():
        why = f"a missing self-cosine at a token another head has one for ({fr.name} ranks both)"
        raise edited_error(fc, why, again)
    if not (ranked & has_cosine).any():
        why = f"no self-cosine at any token {fr.name} ranks, and its record does not say they were not measured"
        raise edited_error(fc, why, again)
