"""The report object: :class:`IdempotenceReport` (its tables, summary, what was measured and the options; immutable,
and its tables handed out as copies), what it derives on read (another threshold, the algebra, the hook points,
tensors) and what it is written as. Made by :func:`~tl_idempotence.report.report.idempotence_report` and
:func:`~tl_idempotence.report.report.load_report` (both importable, with this class, from
:mod:`tl_idempotence.report.report`)."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ..analyses.algebra import RANGES_THRESHOLD, AlgebraAnalysis, SharedValueAlgebra
from ..analyses.registry import report_analyses, threshold_rules
from ..analyses.report_options import ReportOptions
from ..analyses.threshold import derive_at_threshold
from ..core.files import refuse_outputs_over_inputs
from ..core.heads import ModelInfo
from ..core.kwargs import warn_at_caller
from ..core.options import check_bool, check_threshold, strict_kwargs
from ..core.outputs import FOLDER, write_output
from ..core.readings import report_headline
from ..core.selection import head_labels
from ..core.stored import StoredResult, StoreSpec
from ..core.tables import ImmutableResult
from ..errors import OptionError, OptionTypeError
from ..views.results import DrawnResult
from .ablation_spec import ABLATION
from .attention_spec import ATTENTION
from .causal_spec import CAUSAL
from .export import report_output
from .hooks import HookPoint, hook_points_of
from .join_spec import check_identity
from .mechanism_spec import MECHANISM
from .roles_spec import CIRCUIT, ROLES
from .store import REPORT_STORE, add_q_values, read_record
from .summary import REPR_FIELDS, RecordMap, ReportSummary, build_summary, format_paper_table, paper_table

if TYPE_CHECKING:  # pragma: no cover
    from typing import Literal

    from typing_extensions import Unpack

    from ..core.hints import HeadPairs, HeadsLike, IntLike, PathLike, RealLike, TLModel
    from ..probes.ablation import Ablation, AblationArgs
    from ..probes.roles import HeadRoles
    from .causal import CausalTest
    from .mechanism import Mechanism
    from .roles import Circuit, RoleAssociation

__all__ = ["FrameTables", "IdempotenceReport"]


class FrameTables(RecordMap[pd.DataFrame]):
    """A report's long tables as a read-only mapping: ``tables[name]`` is a copy of the stored frame, made on
    each read (editing it leaves the report as it is); names in the report's order."""

    __slots__ = ()

    def __getitem__(self, name: str) -> pd.DataFrame:
        return super().__getitem__(name).copy()

    def __repr__(self) -> str:
        return f"FrameTables({list(self)})"


class IdempotenceReport(
    StoredResult,
    ImmutableResult,
    DrawnResult,
    display_kind="report",
    # the summary's repr fields but the mismatch count (eight fit the one-line repr)
    repr_keys=tuple(k for k in REPR_FIELDS if k != "n_mismatch_closed"),
    frozen=(
        "a report is",
        "rep.with_threshold(t) for another threshold, rep.with_summary(...) for a route's additions to its summary",
    ),
):
    """Result of :func:`idempotence_report`.

    Attributes:
        heads: one row per (layer, head), indexed by TransformerLens labels (``"L10H8"``):
            ``layer, head, kv_head, alpha, P, norm, norm_T2, rank_O, rank_V, closed, reason``
            (SPEC 2-3); with ``nulls`` the scramble columns (SPEC 4b); with ``search`` the
            searched (feasible) P (SPEC 5).
        layers: one row per layer: counts and medians; with ``nulls`` trained-vs-scrambled
            medians and the O/V mismatch (SPEC 4a); with ``search`` the feasible P; the layer's
            weight ``fingerprint`` (sha256) and a ``note`` for every NaN.
        tables: long tables of the analyses (``scramble_draws``, ``mismatch_pairs``,
            ``algebra_pairs``, ...).
        summary: headline numbers, model sizes, processing flags, options, versions.
        info: the :class:`~tl_idempotence.core.heads.ModelInfo` of what was measured.
        options: the validated :class:`~tl_idempotence.analyses.report_options.ReportOptions`.
        threshold: P threshold of ``closed`` (paper: 0.9); :meth:`with_threshold` gives the report at another
            (assigning it is a deprecated shim that warns and recomputes every threshold-dependent column, count
            and summary number in place).
        inputs: what the report was read from on this machine, as ``(what, path)`` pairs (the checkpoint
            folder or file, the zoo cache, the resume folder; for a loaded report its folder; empty for a
            model in memory): what :meth:`save_html` and :meth:`save` refuse to write over. Never saved or
            shown (a saved report holds no machine path).

    The report is immutable: assigning an attribute raises ``dataclasses.FrozenInstanceError`` (except the
    deprecated ``rep.threshold = t``); :meth:`with_threshold` and :meth:`with_summary` return new reports. Its
    tables cannot be edited through what it hands out either: :attr:`heads`, :attr:`layers`, :attr:`closed_heads`
    and every ``tables[name]`` are copies made on each read (``rep.heads.loc["L0H0", "P"] = 9`` changes that copy,
    never the report or its summary), and :attr:`tables` is a read-only mapping. Take a frame once
    (``h = rep.heads``) when reading it in a loop.

    The report holds no model: :meth:`show_attention` and the attention section of
    :meth:`save_html` take the model as an argument (or use a weak reference to the model
    the report was made from, while it is alive), so a report pickles and saves
    (:meth:`save`, :func:`~tl_idempotence.report.store.load_report`).
    """

    #: (a class default: a report unpickled without this attribute read from nothing known)
    inputs: tuple[tuple[str, Path], ...] = ()
    _heads: pd.DataFrame
    _layers: pd.DataFrame
    _tables: dict[str, pd.DataFrame]
    summary: ReportSummary
    info: ModelInfo
    options: ReportOptions
    _model_ref: Any

    store: ClassVar[StoreSpec] = REPORT_STORE

    def __init__(
        self,
        heads: pd.DataFrame,
        layers: pd.DataFrame,
        tables: dict[str, pd.DataFrame],
        summary: ReportSummary,
        info: ModelInfo,
        options: ReportOptions,
        model: TLModel | None = None,
        inputs: Sequence[tuple[str, Path]] = (),
    ) -> None:
        model_ref = None
        if model is not None:
            try:
                model_ref = weakref.ref(model)
            except TypeError:  # pragma: no cover - objects without weakref support
                model_ref = None
        # immutable once built (ImmutableResult); the frames are never handed out: the properties give copies
        self._freeze(_heads=heads, _layers=layers, _tables=dict(tables), summary=summary, info=info, options=options)
        self._freeze(inputs=tuple(inputs), _model_ref=model_ref)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "threshold":  # the documented deprecation shim (it warns)
            type(self).threshold.fset(self, value)  # type: ignore[attr-defined]
            return
        super().__setattr__(name, value)

    def _evolve(self, **changes: Any) -> IdempotenceReport:
        """A copy with some attributes changed (the model reference kept)."""
        new = object.__new__(IdempotenceReport)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def with_summary(self, **changes: Any) -> IdempotenceReport:
        """The same report with fields of its summary set that the measurement does not give but a route knows
        (``n_params`` from a comparison's checkpoint headers, ``n_layers_resumed`` from a resume folder).

        Raises:
            OptionTypeError / OptionError: as :meth:`~tl_idempotence.report.summary.ReportSummary.replace`.
        """
        return self._evolve(summary=self.summary.replace(**changes))

    # ------------------------------------------------------------------ state
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_model_ref"] = None  # never pickle (or keep alive) the model
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        for name in ("heads", "layers", "tables"):  # a report pickled before its frames were private
            if name in state:
                state[f"_{name}"] = state.pop(name)
        self.__dict__.update(state)

    @property
    def heads(self) -> pd.DataFrame:
        """One row per (layer, head) (class docstring): a copy, made on each read (editing it leaves the report)."""
        return self._heads.copy()

    @property
    def layers(self) -> pd.DataFrame:
        """One row per measured layer (class docstring): a copy, made on each read."""
        return self._layers.copy()

    @property
    def tables(self) -> Mapping[str, pd.DataFrame]:
        """The analyses' long tables by name (class docstring): a read-only mapping whose ``[name]`` is a copy,
        made on each read."""
        return FrameTables(self._tables)

    @property
    def model(self) -> Any:
        """The TransformerLens model the report was made from while it is alive (a weak reference), else None."""
        return self._model_ref() if self._model_ref is not None else None

    @property
    def threshold(self) -> float:
        """The P threshold of ``closed``. To change it, :meth:`with_threshold` (assigning it is deprecated)."""
        return self.options.threshold

    @threshold.setter
    def threshold(self, value: Any) -> None:  # checked in with_threshold (OptionTypeError), not by annotation
        # attributed to the user's line (the setter is reached through __setattr__: a fixed stacklevel named
        # this file, and Python's default filters then hid the warning in a script)
        warn_at_caller(
            "Assigning rep.threshold is deprecated and will be removed: use rep = rep.with_threshold(t), which "
            "returns a new report and leaves this one as it is.",
            DeprecationWarning,
        )
        new = self.with_threshold(value)
        for name in ("_heads", "_layers", "_tables", "options", "summary"):
            object.__setattr__(self, name, new.__dict__[name])

    def with_threshold(self, threshold: RealLike) -> IdempotenceReport:
        """The same report at another P threshold: every threshold-dependent column, table, count and summary
        number re-derived from the stored results (the analyses' declared threshold rules applied by
        :func:`~tl_idempotence.analyses.threshold.derive_at_threshold`, then each analysis's ``summarize``),
        equal to a run at that threshold (checked by the analyses' contract test and, for the whole summary,
        ``tests/unit/report/test_store_hostile.py``). This report is not changed.

        Raises:
            OptionTypeError: not a real number. OptionError: NaN or outside [0, 1].

        Warns:
            UserWarning: an ``algebra=True`` report without the ``algebra_ranges`` table (every pair's range
                angles), taken below its run's threshold (the angles of the pairs closed only below it are not there).
        """
        t = check_threshold(threshold)
        layers, tables = self._layers, self._tables
        if self.options.algebra and RANGES_THRESHOLD not in layers.columns:  # layer rows that do not say it
            layers = layers.assign(**{RANGES_THRESHOLD: self._ranges_threshold()})
        if self.options.algebra and "algebra_ranges" not in tables:  # a saved report without every pair's angles
            rt = AlgebraAnalysis.ranges_threshold(layers, self.options.threshold)
            if t < rt:
                warnings.warn(
                    f"This report holds no algebra_ranges table (the algebra's range angles of every pair): "
                    f"its algebra_closed_ranges (and the summary's algebra n_closed_range_pairs and "
                    f"median_min_angle_deg_closed) cover only the pairs closed at its run's threshold {rt:g}, not "
                    f"every pair closed at {t:g}; summary algebra_ranges_threshold stays {rt:g}. Make the report "
                    f"again for the angles at {t:g}.",
                    UserWarning,
                    stacklevel=2,
                )
        ran = [a for a in report_analyses() if a.enabled(self.options)]
        heads, layers, tables = derive_at_threshold(self._heads, layers, tables, threshold_rules(ran), t)
        opts = self.options.with_threshold(t)
        summary = build_summary(heads, layers, tables, self.info, opts, ran)
        # what the re-derivation cannot know: the code that computed the numbers, the route's additions
        summary = summary.replace(
            versions=self.summary.versions,
            n_layers_resumed=self.summary.n_layers_resumed,
            n_params=self.summary.n_params,
        )
        rep = IdempotenceReport(heads, layers, tables, summary, self.info, opts, inputs=self.inputs)
        return rep._evolve(_model_ref=self._model_ref)

    def _ranges_threshold(self) -> float:
        """The threshold the summary says the algebra's range angles are at (the run's, when it does not say)."""
        record = self.summary.analyses.get("algebra")
        return self.options.threshold if record is None else float(record["algebra_ranges_threshold"])

    # ------------------------------------------------------------------ views of the data
    @property
    def headline(self) -> str:
        """The report's first sentence, which the notebook display and the page lead with: how many heads are closed
        (``P >= threshold``, an effect size) and, in a separate clause, how many have a scramble ``q <= 0.05``
        (trained orientation vs Haar-scrambled orientation with the same spectra: a significance, not closure), e.g.
        ``"13 of 270 heads are closed (P ≥ 0.9); q ≤ 0.05 for 247 of 270 (trained orientation beats its scramble
        almost everywhere, as in the paper)."`` Computed from :attr:`summary`
        (:func:`~tl_idempotence.core.readings.report_headline`; docs/definitions.md, "Reading a report")."""
        return report_headline(self.summary, self.threshold)

    @property
    def closed_heads(self) -> pd.DataFrame:
        """Rows of :attr:`heads` with ``P >= threshold``, sorted by P descending (a new frame on each read)."""
        h = self._heads
        return h[h["closed"]].sort_values("P", ascending=False, kind="stable").copy()

    @property
    def algebra(self) -> SharedValueAlgebra | None:
        """The shared-value algebra (SPEC 7) when the report ran it (``algebra=True``), else None."""
        if not self.options.algebra:
            return None
        rt = AlgebraAnalysis.ranges_threshold(self._layers, self._ranges_threshold())
        # copies: the algebra's frames are the user's to edit, never this report's (or a with_threshold sibling's)
        tables = {k: v.copy() for k, v in self._tables.items() if k.startswith("algebra_")}
        return AlgebraAnalysis.combine(tables, self.info, self.threshold, rt)

    @strict_kwargs
    def paper_table(self, formatted: bool = False) -> pd.DataFrame:
        """The abstract's headline quantities for this model next to the paper's figures.

        Args:
            formatted: return display strings (``quantity, this model, paper``) instead of numbers.

        Returns:
            Numbers (default): ``quantity, value, n, of, paper_low, paper_high, note`` (see
            :func:`~tl_idempotence.report.summary.paper_table`); rows whose analysis did not run
            have NaN and say so in ``note``.

        Raises:
            OptionTypeError: ``formatted`` is not a bool.
        """
        formatted = check_bool(formatted, "formatted")
        t = paper_table(self.summary, len(self._layers))
        return format_paper_table(t) if formatted else t

    @strict_kwargs
    def to_tensor(self, column: str = "P") -> torch.Tensor:
        """A numeric column as a ``[n_layers, n_heads]`` float64 tensor (TransformerLens layout);
        NaN where a layer was not measured or has no attention.

        Raises:
            OptionTypeError: ``column`` is not a string. OptionError: not a numeric column of :attr:`heads`.
        """
        if not isinstance(column, str):
            raise OptionTypeError(f"column must be a column name (str); got {type(column).__name__}.")
        if column not in self._heads.columns:
            raise OptionError(f"{column!r} is not a column of report.heads; columns: {list(self._heads.columns)}.")
        col = self._heads[column]
        if col.dtype.kind not in "biuf":
            raise OptionError(f"Column {column!r} is not numeric (dtype {col.dtype}).")
        out = torch.full((self.info.n_layers, self.info.n_heads), float("nan"), dtype=torch.float64)
        L = torch.tensor(self._heads["layer"].to_numpy(dtype=np.int64))  # copies: pandas' arrays may be read-only
        H = torch.tensor(self._heads["head"].to_numpy(dtype=np.int64))
        out[L, H] = torch.tensor(col.to_numpy(dtype=np.float64))
        return out

    @strict_kwargs
    def hook_points(
        self,
        heads: Literal["closed", "all"] | HeadsLike = "closed",
        hook: Literal["z", "q", "result", "pattern", "attn_scores", "k", "v"] = "z",
        model: TLModel | None = None,
    ) -> list[HookPoint]:
        """The hook points of the chosen heads, ready for ``run_with_hooks``, activation patching or an
        ``ActivationCache``: each a :class:`HookPoint`, a ``(hook name, index)`` pair such as
        ``("blocks.10.attn.hook_z", 8)`` that also carries ``layer``, ``axis`` (the dim of the
        activation that ``index`` indexes) and ``query_heads`` (the heads it stands for).

        The index is right for the hook it names (TransformerLens's shapes, the same on
        HookedTransformer and TransformerBridge):

        * ``"z"``, ``"q"`` ``[batch, pos, n_heads, d_head]`` and ``"result"`` ``[batch, pos, n_heads,
          d_model]``: the query head, ``axis=2``;
        * ``"pattern"``, ``"attn_scores"`` ``[batch, n_heads, query_pos, key_pos]``: the query head, ``axis=1``;
        * ``"k"``, ``"v"`` ``[batch, pos, n_kv_heads, d_head]``: the **kv head** the chosen heads read
          (``axis=2``); on GQA/MQA one kv head serves several query heads, so the points are
          deduplicated per ``(layer, kv head)`` and ``query_heads`` lists the chosen query heads it serves.
          Intervening there changes every query head that reads that kv head, not only the chosen ones.

        ``hook_result`` fires only when the model computes per-head results
        (``model.set_use_attn_result(True)``): with ``hook="result"`` and a model (``model=``, or the
        one the report was made from while it is alive) whose ``cfg.use_attn_result`` is off, this
        refuses with that fix.

        Args:
            heads: ``"closed"`` (default; highest P first), ``"all"``, or ``(layer, head)`` pairs / a
                DataFrame with ``layer``/``head`` columns (layer order).
            hook: ``"z"``, ``"pattern"``, ``"attn_scores"``, ``"result"``, ``"q"``, ``"k"`` or ``"v"``
                (TransformerLens names ``blocks.{l}.attn.hook_{hook}``).
            model: the TransformerLens model the points are for (only checked for ``"result"``).

        Returns:
            ``list[HookPoint]`` (each unpacks as ``name, index``).

        Raises:
            OptionTypeError: ``hook`` is not a string. OptionError: an unknown selector or hook name; ``"result"``
                on a model without ``use_attn_result``.
        """
        return hook_points_of(self, heads, hook, model)

    # ------------------------------------------------------------------ views (drawn by tl_idempotence.views)
    @strict_kwargs
    def figure(self, value: str = "P") -> Any:
        """Plotly heatmap (layer x head) of ``value`` (default P) with the closed heads marked."""
        from ..views import heads_heatmap

        return heads_heatmap(self, value=value)

    @strict_kwargs
    def figures(self) -> list[Any]:
        """Every figure of the report page (heatmap, controls, algebra summary)."""
        from ..views import report_figures

        return list(report_figures(self))

    @strict_kwargs
    def save_html(
        self,
        path: PathLike,
        attention_text: str | None = None,
        model: TLModel | None = None,
        attention_heads: HeadPairs | None = None,
        top_k: IntLike | None = None,
        max_tokens: IntLike = 64,
        roles: RoleAssociation | None = None,
        mechanism: Mechanism | None = None,
        joins: Mapping[str, Any] | None = None,
    ) -> str:
        """Write a standalone HTML report (plotly.js and the table code inlined, no CDN) and return the path.

        Args:
            path: output file (its folder must exist).
            attention_text: add a circuitsvis view of the flagged heads' attention on this text
                (needs ``model``, or the TransformerLens model the report was made from).
            model: the TransformerLens model for the attention view.
            attention_heads: ``(layer, head)`` pairs to show (default: every closed head, else the top 8 by P).
            top_k: cap on the default heads.
            max_tokens: cut the text to this many tokens (the page says so when it cuts).
            roles: this report's :meth:`roles` result: adds the section "What the closed heads do" (SPEC 11).
            mechanism: this report's :meth:`mechanism` result: adds the section "What the closed heads do to
                tokens" (SPEC 12).
            joins: join name -> result, for any registered join's section (:mod:`tl_idempotence.report.joins`;
                ``{"roles": rep.roles(...)}`` is ``roles=``).

        Raises:
            OutputOverInputError (an ``OptionError``): ``path`` is (or links to) a file the report was read
                from (:attr:`inputs`: a checkpoint file, a resume part, a saved report's file).
            OptionError: ``path`` is empty, a folder, or its folder does not exist; an extension other than
                ``.html``/``.htm`` (the output registry, :mod:`tl_idempotence.core.outputs`); ``attention_heads``,
                ``top_k`` or ``max_tokens`` without ``attention_text``; an attention view without a model; ``roles``
                joined with another report (names the heads); a ``mechanism`` of another report; an unknown join.
            OptionTypeError: ``path`` is not a path; ``roles`` is not a ``rep.roles(...)`` result; ``mechanism`` is
                not a ``rep.mechanism(...)`` result.
        """
        from .attention_spec import refuse_unused_options

        refuse_outputs_over_inputs([("path", path)], self.inputs)  # first, as every writer (write_output again)
        out = report_output(  # checks the joins against the report (renders nothing yet)
            self,
            joins=joins,
            attention_text=attention_text,
            model=model,
            attention_heads=attention_heads,
            top_k=top_k,
            max_tokens=max_tokens,
            roles=roles,
            mechanism=mechanism,
        )
        if attention_text is None:  # options of the attention view alone would be silently ignored
            refuse_unused_options(attention_heads, top_k, max_tokens)
        return str(write_output(out, path, ("html",)))

    @strict_kwargs
    def export(self, path: PathLike, overwrite: bool = False, joins: Mapping[str, Any] | None = None) -> str:
        """Write the report in the format the extension of ``path`` chooses (the output registry,
        :mod:`tl_idempotence.core.outputs`; docs/definitions.md "Output formats"):

        * ``.html``/``.htm``: the page of :meth:`save_html` (without an attention view);
        * ``.json``: ``{"summary": ..., "closed_heads": [...]}`` (the CLI's ``--json``; NaN as ``null``);
        * ``.csv`` / ``.parquet``: :attr:`heads` with its label first (the CLI's ``--csv``);
        * a path without extension (or an existing folder): the save format of :meth:`save`.

        ``joins`` (join name -> result, e.g. ``{"roles": rep.roles(...)}``; :mod:`tl_idempotence.report.joins`) adds
        each join's section to the page, its record to the JSON and its per-head columns to the JSON's closed heads
        and the tables (refused, as by :meth:`save_html`, when it is not of this report).

        Returns:
            The path written.

        Raises:
            OutputOverInputError (an ``OptionError``): ``path`` is (or links to) something the report was read
                from (:attr:`inputs`).
            OptionError: another extension (names the known ones); a folder where a file goes; a missing folder;
                an existing file without ``overwrite=True``; a file that cannot be written; the folder errors of
                :meth:`save`.
            OptionTypeError: ``path`` is not a path, ``overwrite`` is not a bool.
        """
        overwrite = check_bool(overwrite, "overwrite")
        out = report_output(self, joins=joins)
        return str(write_output(out, path, overwrite=overwrite, replace_files=overwrite))

    @strict_kwargs
    def show_attention(
        self,
        text: str,
        model: TLModel | None = None,
        heads: HeadPairs | None = None,
        top_k: IntLike | None = None,
        max_tokens: IntLike = 64,
    ) -> Any:
        """circuitsvis view of the flagged heads' attention patterns on ``text`` (notebooks, offline).

        Args:
            text: the text to run.
            model: the TransformerLens model (default: the one the report was made from, if alive).
            heads: ``(layer, head)`` pairs (default: every closed head, else the top 8 by P).
            top_k: cap on the default heads.
            max_tokens: cut the text to this many tokens (the view says so when it cuts).

        Returns:
            :class:`tl_idempotence.views.attention.AttentionView` (displays itself in Jupyter).

        Raises:
            OptionError: no TransformerLens model is available; ``top_k`` below 1 or ``max_tokens`` below 2 (checked
                first; OptionTypeError: not integers). ReportMismatchError (an OptionError): a model that is not
                the one the report measured (sizes or weights).
        """
        return ATTENTION(self, text, model, heads, top_k=top_k, max_tokens=max_tokens)

    def ablation(self, model: TLModel | None = None, **kwargs: Unpack[AblationArgs]) -> Ablation:
        """Ablate the report's closed heads in ``model`` against matched random sets (see ``tli.ablation``).

        The model (given, or the report's own while it is alive) must be the one the report measured, by content
        (:meth:`check_joins`, weight processing may differ).

        Raises:
            ReportMismatchError (an OptionError): another model, or the report's own edited in place since.
            OptionError: no model. The errors of ``tli.ablation``.
        """
        return ABLATION(self, model, **kwargs)

    @strict_kwargs
    def roles(
        self,
        model: TLModel | None = None,
        roles: HeadRoles | None = None,
        repeat_len: IntLike | None = None,
        n_sequences: IntLike | None = None,
        n_permutations: IntLike = 999,
        seed: IntLike = 0,
        n_tokens: IntLike | None = None,
        *,
        progress: bool = True,
    ) -> RoleAssociation:
        """What the closed heads do (SPEC 11): :func:`~tl_idempotence.probes.roles.head_roles` of ``model`` joined
        with this report's P, α and closed set, and each role's association with closure
        (:func:`~tl_idempotence.report.roles.role_association`: Spearman ρ with a seeded permutation p, medians
        among closed and other heads, Mann-Whitney p, BH q across roles).

        Args:
            model: the TransformerLens model (default: the report's own, while it is alive), checked against the
                report by content first (:meth:`check_joins`); the report's own model edited in place is refused.
            roles: a :class:`~tl_idempotence.probes.roles.HeadRoles` of the report's model (checked as
                :meth:`check_joins` does); ``repeat_len``/``n_sequences`` other than what it was made with and a
                ``model`` that is not, by content, the report's are refused.
            repeat_len: the length of ``x`` in each ``BOS x x`` sequence of the head detector, passed to
                ``head_roles`` (default 24).
            n_sequences: passed to ``head_roles`` (default 8).
            seed: its tokens' seed and the permutations'.
            n_permutations: permutations of each Spearman test.
            n_tokens: the deprecated name of ``repeat_len`` (a ``DeprecationWarning``; ``n_tokens`` is the token
                readout's sample in :meth:`mechanism`).
            progress: tqdm bars on stderr (as the report's): ``head_roles``' over the layers (when the roles are
                computed here) and the association's over the roles. About 5 CPU-s with the defaults on
                SmolLM2-135M (README, "What each analysis costs").

        Returns:
            :class:`~tl_idempotence.report.roles.RoleAssociation` (``.table``, ``.association``).

        Raises:
            ReportMismatchError (an OptionError): ``model`` (also the report's own, edited in place) or ``roles``
                is not of the model this report measured (other sizes, weight processing or weights; names the
                layer or what differs); ``roles`` with a ``model`` that is not the report's.
            OptionError: no model; ``roles`` with ``repeat_len`` or ``n_sequences`` other than what they were made
                with (names them); both ``repeat_len`` and ``n_tokens``. OptionTypeError: ``roles`` is not a
                HeadRoles; ``progress`` is not a bool. UnsupportedModelError / WeightError: as ``head_roles``.
        """
        return ROLES(
            self,
            model,
            roles,
            repeat_len=repeat_len,
            n_sequences=n_sequences,
            n_permutations=n_permutations,
            seed=seed,
            n_tokens=n_tokens,
            progress=progress,
        )

    @strict_kwargs
    def mechanism(
        self,
        model: TLModel | None = None,
        texts: Any = None,
        heads: Any = None,
        roles: HeadRoles | RoleAssociation | None = None,
        *,
        n_tokens: IntLike = 512,
        k: IntLike = 20,
        seq_len: IntLike | None = None,
        max_tokens: IntLike | None = 2048,
        batch_size: IntLike = 8,
        n_permutations: IntLike = 999,
        seed: IntLike = 0,
        match_by: str = "abs_alpha",
        n_controls: IntLike = 1,
        predicted_k: IntLike | None = 10,
        n_boot: IntLike = 1000,
        progress: bool = True,
    ) -> Mechanism:
        """What the closed heads do to tokens, and what holds it up (SPEC 12-13; :mod:`.mechanism`): whether sign(α)
        predicts the direction of the effect among closed heads, against matched non-closed heads, α·P's Spearman
        permuted within layers, base rates, intervals, stability across text sets, the copy-suppression split.

        Args:
            model: the TransformerLens model (default: the report's own, while it is alive), checked against the
                report by content first (:meth:`check_joins`): the report's own model edited in place is refused.
            texts: the attended-token effect's text (None: the default corpus; as ``attended_token_effect``), or a
                list of two or more text sets (each as ``texts``): the table is of the first, and each closed head's
                direction in every set gives the stability across sets.
            heads: the heads to join (None: every head measured; pairs, ``"L10H8"`` labels or a DataFrame such as
                ``rep.closed_heads``); the closed heads' matched controls are joined with them.
            roles: head roles of the report's model (``tli.head_roles`` or ``rep.roles(...)``), added to the table.
            n_tokens: the token readout's sample of source tokens.
            k: the token readout's top/bottom size.
            seq_len: the attended-token effect's window (None: 128, or ``n_ctx`` when smaller).
            max_tokens: the attended-token effect's token budget.
            batch_size: the attended-token effect's windows per pass.
            n_permutations: of the Spearman tests and the matched comparison when not exact.
            seed: the token sample's, null sources', permutations' and bootstrap's seed.
            match_by: ``"abs_alpha"`` (``|α|``) or ``"norm"`` (``‖T‖_F``): the size controls are matched on.
            n_controls: matched controls per closed head.
            predicted_k: the copy-suppression condition's ``k`` (None: not measured).
            n_boot: bootstrap replicates (10 .. 10,000).
            progress: the probes' bars on stderr.

        Returns:
            :class:`~tl_idempotence.report.mechanism.Mechanism`. Cost: README "What each analysis costs".

        Raises:
            ReportMismatchError (an OptionError): ``model`` (also the report's own, edited in place) or ``roles``
                is not of the model this report measured (names the layer or what differs). OptionError: no model;
                heads outside the measured layers or unknown; counts out of range. OptionTypeError: an option of
                the wrong type; ``roles`` neither result; a list mixing text sets and texts.
            UnsupportedModelError / WeightError: as the probes.
        """
        options = dict(n_tokens=n_tokens, k=k, seq_len=seq_len, max_tokens=max_tokens, batch_size=batch_size, seed=seed)
        more = dict(match_by=match_by, n_controls=n_controls, predicted_k=predicted_k, n_boot=n_boot, progress=progress)
        return MECHANISM(self, model, texts, heads, roles, **options, n_permutations=n_permutations, **more)

    @strict_kwargs
    def causal(
        self,
        model: TLModel | None = None,
        texts: Any = None,
        heads: HeadsLike | None = None,
        *,
        variants: str | Sequence[str] = ("closure_free", "closure_only", "zero", "mean"),
        n_controls: IntLike = 1,
        match_by: Literal["abs_alpha", "norm"] = "abs_alpha",
        seq_len: IntLike = 128,
        max_tokens: IntLike | None = 512,
        batch_size: IntLike = 8,
        n_permutations: IntLike = 9999,
        seed: IntLike = 0,
        progress: bool = True,
    ) -> CausalTest:
        """A causal test of closure (SPEC 13; :mod:`tl_idempotence.report.causal`): the closed heads (or ``heads``)
        and ``n_controls`` non-closed heads of each one's layer nearest in ``match_by`` edited by
        :func:`~tl_idempotence.probes.causal.causal_closure`; closed against controls per variant (relabelling
        within layers, exact up to 100,000 relabellings, else ``n_permutations`` draws seeded by ``seed``).

        Args:
            model: the TransformerLens model (default: the report's own while alive), checked against the report by
                content first (:meth:`check_joins`). texts: the text (None: the default corpus). seq_len, max_tokens,
                batch_size: the probe's windows (``max_tokens`` in whole windows; None: all). progress: a bar.

        Returns:
            :class:`~tl_idempotence.report.causal.CausalTest` (``.headline``, ``.comparison``, ``.table``, ``.pairs``).

        Cost: about one forward pass of the text per variant and head run, batched (README's cost table).

        Raises:
            ReportMismatchError (an OptionError): ``model`` is not of the model this report measured.
            OptionError: no model or closed head; ``heads`` not closed or not measured; options out of range.
                OptionTypeError: an option's type. UnsupportedModelError: as the probe (a norm after ``W_O``).
        """
        options = dict(variants=variants, n_controls=n_controls, match_by=match_by, seq_len=seq_len)
        return CAUSAL(self, model, texts, heads, **options, max_tokens=max_tokens, batch_size=batch_size,
                      n_permutations=n_permutations, seed=seed, progress=progress)  # fmt: skip

    @strict_kwargs
    def circuit(
        self, heads: Any, roles: HeadRoles | RoleAssociation | None = None, n_sets: IntLike = 999, seed: IntLike = 0
    ) -> Circuit:
        """A circuit tested against this report's closed set (SPEC 11).

        Args:
            heads: ``[(layer, head)]``, ``"L10H8"`` labels, or :meth:`hook_points` output (``hook_k``/``hook_v``
                points stand for the query heads they list).
            roles: add these head roles (a ``HeadRoles`` or ``rep.roles(...)``) to the circuit's rows; they must
                be of this report's model, by content (:meth:`check_joins`).
            n_sets: random layer-matched sets of the permutation p-value (floor ``1/(n_sets + 1)``).
            seed: their seed.

        Returns:
            :class:`~tl_idempotence.report.roles.Circuit`: ``.heads``, ``.n_overlap``, ``.p_hypergeom``
            (scipy's hypergeometric tail over the measured heads), ``.p_layer_matched``.

        Raises:
            OptionTypeError: heads that are not pairs, labels or hook points.
            OptionError: no heads; heads the model lacks, duplicates, or heads outside the measured layers (named);
                a ``rep.roles(...)`` of another report.
            ReportMismatchError (an OptionError): ``roles`` of another model (sizes, processing, weights).
        """
        return CIRCUIT(self, heads, roles, n_sets=n_sets, seed=seed)

    def check_joins(
        self, *, model: Any = None, roles: Any = None, processing_may_differ: bool = False
    ) -> HeadRoles | None:
        """The one check every join with this report takes (``rep.roles``, ``rep.circuit(roles=...)``, the
        attention views, ``rep.ablation``): ``model`` and ``roles`` must be of the model this report measured, by
        content, never by object identity
        (:func:`~tl_idempotence.report.identity.check_report_matches`).

        * ``model``: its sizes, weight processing (SPEC 10; ``processing_may_differ=True``: a model processed
          otherwise is accepted, its bytes cannot be compared) and every measured layer's O/V sha256 fingerprint
          read now (:meth:`~tl_idempotence.core.heads.LayerHeads.fingerprint`). The report's own model is checked
          too: one edited in place after the report was made is another model.
        * ``roles``: a :class:`~tl_idempotence.probes.roles.HeadRoles` (its sizes, processing and the per-layer
          fingerprints it records of the weights its scores came from), or a ``rep.roles(...)``
          :class:`~tl_idempotence.report.roles.RoleAssociation` (its heads, P and threshold must be this report's,
          and its HeadRoles as above).

        Cost: one pass over each measured layer's O and V bytes for a model (hashing, no product); none for roles.

        Returns:
            The HeadRoles of ``roles`` (None without ``roles``).

        Raises:
            ReportMismatchError (an OptionError): other sizes, processing or weights (names the layer and what
                differs); roles that record no fingerprints (made by hand; compute them with tli.head_roles).
            OptionError: a RoleAssociation joined with another report (names the heads).
            OptionTypeError: ``roles`` is neither result.
        """
        return check_identity(self, model=model, roles=roles, processing_may_differ=processing_may_differ)

    def join(self, name: str, *inputs: Any, **options: Any) -> Any:
        """Run the registered join ``name`` with this report (:mod:`tl_idempotence.report.joins`: ``"roles"``,
        ``"mechanism"``, ``"circuit"``, ``"ablation"``, ``"causal"``, ``"attention"`` or one registered since): what
        :meth:`roles`, :meth:`mechanism`, :meth:`circuit`, :meth:`ablation` and :meth:`show_attention` call. Its
        options take their declared defaults and validators; a model is checked against this report by content
        first (:meth:`check_joins`).

        Returns:
            The join's result (for the page and the exports: ``rep.save_html(path, joins={name: result})``).

        Raises:
            OptionError: no such join (names the registered ones).
            UnknownOptionError: a keyword it does not take.
            Exception: the join's own errors pass through unchanged.
        """
        from .joins import join_spec

        return join_spec(name)(self, *inputs, **options)

    @classmethod
    def load(cls, path: PathLike) -> IdempotenceReport:
        """A report saved with :meth:`save` (:func:`~tl_idempotence.report.report.load_report`, which calls this).

        Raises:
            MissingFileError / ReportFileError / OptionTypeError: as :func:`~tl_idempotence.report.report.load_report`.
        """
        rec = read_record(path)
        heads = rec.heads if "q_value" in rec.heads.columns else add_q_values(rec.heads)  # a table without q-values
        heads.index = head_labels(heads["layer"], heads["head"])
        return cls(
            heads=heads,
            layers=rec.layers,
            tables=rec.tables,
            summary=rec.summary,
            info=rec.info,
            options=rec.options,
            inputs=[("the saved report", Path(path).expanduser().absolute())],
        )

    @strict_kwargs
    def save(self, path: PathLike, overwrite: bool = False) -> str:
        """Save the report as a folder of parquet tables and one JSON record (no pickle); reload it with
        :func:`load_report`. See :mod:`tl_idempotence.report.store` for the layout.

        Raises:
            OutputOverInputError (an ``OptionError``): ``path`` is a folder or file the report was read from
                (:attr:`inputs`: its checkpoint, its resume folder, the folder it was loaded from).
            OptionError: ``path`` is a file, a non-empty folder (without ``overwrite``), or its parent is missing.
            OptionTypeError: ``path`` is not a path, ``overwrite`` is not a bool.
        """
        return str(write_output(report_output(self), path, (FOLDER,), overwrite=overwrite))
