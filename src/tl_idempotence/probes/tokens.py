"""Real text as token windows for the model-running analyses (SPEC 8; attention views; ablations).

* :func:`default_corpus` — English text that exists on every machine: the docstrings of
  a fixed list of standard-library modules.
* :func:`prepare_tokens` — texts (or token ids) -> windows of ``seq_len`` tokens wrapped
  the way the model expects, and the mask of positions that count in statistics (every
  special-token position — BOS/CLS/EOS/SEP/PAD — is run but not counted).
* :func:`tokenizer_of`, :func:`special_ids`, :func:`special_wrapping` — what those need
  from a TransformerLens model's tokenizer.
* :func:`token_texts` — a token's text for display: a token that is not whole UTF-8 text (one byte of a
  character) as the ``repr`` of its bytes, never ``'\ufffd'``.
"""

from __future__ import annotations

import functools
import inspect
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from jaxtyping import Bool, Int
from torch import Tensor

from ..core.options import check_int, strict_kwargs
from ..errors import OptionError, OptionTypeError

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import IntLike

__all__ = [
    "DEFAULT_CORPUS_MODULES",
    "corpus_name",
    "default_corpus",
    "prepare_tokens",
    "special_ids",
    "special_wrapping",
    "token_texts",
    "tokenizer_of",
]

#: Standard-library modules whose docstrings form the default corpus (sorted, fixed).
#: Pure-Python modules with long English docstrings, present in every CPython >= 3.9.
DEFAULT_CORPUS_MODULES = (
    "argparse",
    "ast",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email.message",
    "enum",
    "fractions",
    "functools",
    "heapq",
    "inspect",
    "ipaddress",
    "json",
    "logging",
    "mailbox",
    "numbers",
    "operator",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "shlex",
    "shutil",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "urllib.parse",
    "uuid",
    "warnings",
    "weakref",
    "zipfile",
)


#: Longest window :func:`prepare_tokens` makes (tokens).
MAX_SEQ_LEN = 1 << 24


def corpus_name(texts: Any) -> str:
    """What a probe's ``options`` record as its corpus: ``"default (stdlib docstrings)"`` for ``None``
    (:func:`default_corpus`), else the type of what was given (``"list"``, ``"Tensor"``, ``"Dataset"``). Raises
    nothing."""
    return "default (stdlib docstrings)" if texts is None else type(texts).__name__


@strict_kwargs
def default_corpus(min_chars: IntLike = 200) -> list[str]:
    """English text that exists on every machine: docstrings of the Python standard library (SPEC 8 corpus).

    For each module of :data:`DEFAULT_CORPUS_MODULES` (in that order): the module's
    docstring, then the docstrings of its public classes and functions in sorted name
    order, each via ``inspect.getdoc`` (dedented), keeping those with at least
    ``min_chars`` characters and dropping exact duplicates. Deterministic for a given
    Python version (docstrings change slightly between versions).

    Args:
        min_chars (int): shortest docstring kept, in characters (>= 0; bools refused).

    Returns:
        A list of strings (a few hundred documents, ~1M characters).

    Raises:
        OptionTypeError / OptionError: ``min_chars`` not a non-negative int.
        RuntimeError: no docstrings are available (Python run with ``-OO``).
    """
    import importlib

    min_chars = check_int(min_chars, "min_chars", 0)

    seen: set[str] = set()
    out: list[str] = []

    def add(doc: str | None) -> None:
        if doc and len(doc) >= min_chars and doc not in seen:
            seen.add(doc)
            out.append(doc)

    for name in DEFAULT_CORPUS_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # pragma: no cover - stdlib stripped
            continue
        add(inspect.getdoc(mod))
        for attr in sorted(dir(mod)):
            if attr.startswith("_"):
                continue
            with warnings.catch_warnings():  # e.g. typing.io is deprecated
                warnings.simplefilter("ignore", DeprecationWarning)
                obj = getattr(mod, attr, None)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == mod.__name__:
                add(inspect.getdoc(obj))
    if not out:
        raise RuntimeError(
            "The default corpus is empty: this Python has no docstrings (run with -OO?). "
            "Pass texts explicitly: activation_returns(model, ['some text', ...])."
        )
    return out


def tokenizer_of(model: Any) -> Any:
    """``model.tokenizer`` (for the text inputs of SPEC 8).

    Raises:
        OptionError: the model has none (pass token ids instead of text).
    """
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise OptionError(
            f"{type(model).__name__} has no tokenizer (model.tokenizer is None): pass token ids "
            "(a LongTensor [batch, pos]) instead of text, or set model.tokenizer."
        )
    return tok


def special_ids(tok: Any) -> set[int]:
    """Every special token id of a tokenizer (BOS/CLS/EOS/SEP/PAD and ``all_special_ids``): excluded from SPEC 8's
    statistics. Raises nothing (attributes a tokenizer lacks are skipped)."""
    ids = set(int(i) for i in (getattr(tok, "all_special_ids", None) or []))
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "cls_token_id", "sep_token_id"):
        v = getattr(tok, attr, None)
        if isinstance(v, int):
            ids.add(v)
    return ids


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet read back: each of its 256 characters -> the byte it stands for."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _token_bytes(tok: Any, i: int) -> bytes | None:
    """The bytes token ``i`` stands for, when its piece says (SentencePiece byte fallback ``<0xE2>``, or GPT-2's
    byte-level alphabet); else None."""
    try:
        piece = tok.convert_ids_to_tokens(int(i))
    except Exception:  # noqa: BLE001 - a display string only
        return None
    if not isinstance(piece, str) or not piece:
        return None
    m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
    if m:
        return bytes([int(m.group(1), 16)])
    dec = _byte_decoder()
    if all(c in dec for c in piece):
        return bytes(dec[c] for c in piece)
    return None


def token_texts(tok: Any, ids: list[int]) -> list[str | None]:
    """Each token id's text for display (SPEC 12 token lists): the tokenizer's ``decode([id])``, except that a token
    whose bytes are not whole UTF-8 text (one or two bytes of a character: ``decode`` gives ``'\ufffd'``) is shown
    as the ``repr`` of its bytes, e.g. ``"b'\\xe2\\x80'"``. None without a tokenizer or where decoding fails.
    Raises nothing."""
    if tok is None:
        return [None] * len(ids)
    out: list[str | None] = []
    for i in ids:
        try:
            text = str(tok.decode([int(i)]))
        except Exception:  # noqa: BLE001 - a display string only
            out.append(None)
            continue
        if "\ufffd" in text:
            raw = _token_bytes(tok, i)
            if raw is not None:
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    text = repr(raw)
        out.append(text)
    return out


def special_wrapping(model: Any, tok: Any) -> tuple[list[int], list[int]]:
    """Special tokens to put around each window, ``(prefix ids, suffix ids)`` (SPEC 8 windows): what the tokenizer
    adds to a probe text, else BOS when ``cfg.default_prepend_bos``.

    Raises:
        Whatever the tokenizer raises on the probe text ``"text"`` (a broken tokenizer).
    """
    probe = "text"
    with_sp = list(tok(probe, add_special_tokens=True)["input_ids"])
    without = list(tok(probe, add_special_tokens=False)["input_ids"])
    prefix: list[int] = []
    suffix: list[int] = []
    if without and len(with_sp) > len(without):
        for start in range(len(with_sp) - len(without) + 1):
            if with_sp[start : start + len(without)] == without:
                prefix, suffix = with_sp[:start], with_sp[start + len(without) :]
                break
    bos = getattr(tok, "bos_token_id", None)
    if not prefix and bool(getattr(model.cfg, "default_prepend_bos", False)) and isinstance(bos, int):
        prefix = [bos]
    return prefix, suffix


def texts_from(texts: Any, text_column: str) -> list[str]:
    """Texts (SPEC 8 input) from ``None`` (the default corpus), a string, ``Path`` files, a list of those or a
    ``datasets.Dataset``.

    Raises:
        OptionTypeError: an unsupported item. OptionError: empty input, a missing file or column.
    """
    if texts is None:
        return default_corpus()
    if isinstance(texts, (str, Path)):
        texts = [texts]
    if isinstance(texts, (bytes, bytearray, Mapping)) or not isinstance(texts, Iterable):
        raise OptionTypeError(
            "texts_or_tokens must be None, a string, a list of strings / pathlib.Path files, a datasets.Dataset or "
            f"an integer tensor [batch, pos] of token ids; got {type(texts).__name__} {texts!r:.60}."
        )
    if hasattr(texts, "column_names") and hasattr(texts, "__getitem__") and not isinstance(texts, (list, tuple)):
        if text_column not in texts.column_names:
            raise OptionError(
                f"texts_or_tokens: the dataset has no column {text_column!r} (columns: {texts.column_names}); "
                "pass text_column=..."
            )
        return [str(t) for t in texts[text_column]]
    out = []
    for t in texts:
        if isinstance(t, Path):
            if not t.is_file():
                raise OptionError(f"texts_or_tokens: {t} is not a file; pass text as str and files as pathlib.Path.")
            out.append(t.read_text(encoding="utf-8", errors="replace"))
        elif isinstance(t, str):
            out.append(t)
        else:
            raise OptionTypeError(
                "texts_or_tokens: texts must be strings, pathlib.Path files or a datasets.Dataset (token ids as an "
                f"integer tensor [batch, pos]); got an item of type {type(t).__name__}."
            )
    if not out:
        raise OptionError("No texts given in texts_or_tokens (an empty list); pass None for the default corpus.")
    return out


@strict_kwargs
def prepare_tokens(
    model: Any,
    texts_or_tokens: Any = None,
    *,
    seq_len: Any = 128,
    max_tokens: Any = 8192,
    text_column: Any = "text",
) -> tuple[Int[Tensor, "n_windows pos"], Bool[Tensor, "n_windows pos"]]:
    """Token windows to run and the mask of positions that count in statistics (SPEC 8).

    Args:
        model: a TransformerLens model with ``model.tokenizer`` (for text input).
        texts_or_tokens: ``None`` (the :func:`default_corpus`), a string, a list of
            strings and/or ``pathlib.Path`` files, a ``datasets.Dataset`` (column
            ``text_column``), or a LongTensor ``[batch, pos]`` of token ids (run as given).
        seq_len: window length in tokens including the special tokens (text input).
        max_tokens: a lower bound, not a cap: whole windows (token-id rows: whole rows) are
            taken in order until they hold at least this many *counted* (non-special) positions,
            so the counted total is ``max_tokens`` or more, below ``max_tokens + seq_len`` (rows:
            ``+ pos``), or all there is when the input runs out first (None: no limit).
        text_column: the text column of a ``datasets.Dataset``.

    Returns:
        ``(tokens [n_windows, pos] int64, counted [n_windows, pos] bool)``; ``counted``
        is False at special-token positions (BOS/CLS/EOS/SEP/PAD).

    Raises:
        OptionError: empty input (no text, texts that tokenize to no non-special token, a tensor
            with no id), token ids outside ``[0, d_vocab)`` (negative ones included), ``seq_len`` too
            short for the special tokens, text without a tokenizer, ``max_tokens``/``seq_len`` < 1 or
            ``seq_len`` above :data:`MAX_SEQ_LEN`.
        OptionTypeError: unsupported input type (an int, bytes, a dict, a float/bool/complex
            tensor, a tensor of more than 2 dimensions, an item that is not a str/Path), a
            non-integer ``seq_len``/``max_tokens`` (bools refused), a non-str ``text_column``.
    """
    seq_len = check_int(seq_len, "seq_len", 1, MAX_SEQ_LEN)
    if max_tokens is not None:
        max_tokens = check_int(max_tokens, "max_tokens", 1)
    if not isinstance(text_column, str):
        raise OptionTypeError(f"text_column must be a column name (str); got {type(text_column).__name__}.")
    if isinstance(texts_or_tokens, Tensor) or isinstance(texts_or_tokens, np.ndarray):
        try:
            toks = torch.as_tensor(texts_or_tokens)
        except (TypeError, RuntimeError) as e:
            raise OptionTypeError(
                f"Token ids must be an integer tensor [batch, pos] (texts_or_tokens); got an array of dtype "
                f"{getattr(texts_or_tokens, 'dtype', '?')} ({e})."
            ) from e
        if toks.ndim == 1:
            toks = toks[None]
        if toks.ndim != 2 or toks.is_floating_point() or toks.is_complex() or toks.dtype == torch.bool:
            raise OptionTypeError(
                f"Token ids must be an integer tensor [batch, pos] or [pos] (texts_or_tokens); got shape "
                f"{tuple(toks.shape)} {toks.dtype}."
            )
        if toks.numel() == 0:
            raise OptionError(f"No token ids given in texts_or_tokens (shape {tuple(toks.shape)}).")
        toks = toks.long().cpu()
        vocab = getattr(getattr(model, "cfg", None), "d_vocab", None)
        lo, hi = int(toks.min()), int(toks.max())
        if lo < 0 or (isinstance(vocab, int) and hi >= vocab):
            raise OptionError(
                f"Token ids must lie in [0, d_vocab={vocab}) (texts_or_tokens); got ids from {lo} to {hi}. "
                "They would index outside the embedding (or wrap around silently)."
            )
        tok = getattr(model, "tokenizer", None)
        special = special_ids(tok) if tok is not None else set()
        counted = torch.ones_like(toks, dtype=torch.bool)
        for s in special:
            counted &= toks != s
        if max_tokens is not None:
            keep = int((counted.sum(1).cumsum(0) < max_tokens).sum()) + 1
            toks, counted = toks[:keep], counted[:keep]
        return toks, counted
    tok = tokenizer_of(model)
    texts = texts_from(texts_or_tokens, text_column)
    prefix, suffix = special_wrapping(model, tok)
    body = int(seq_len) - len(prefix) - len(suffix)
    if body < 1:
        raise OptionError(
            f"seq_len={seq_len} leaves no room for text between the special tokens {prefix} ... {suffix}."
        )
    # Document separator: [SEP] for tokenizers that have one (BERT), else EOS (causal LMs).
    sep = getattr(tok, "sep_token_id", None) if getattr(tok, "sep_token", None) else None
    if not isinstance(sep, int):
        sep = getattr(tok, "eos_token_id", None) if getattr(tok, "eos_token", None) else None
    special = special_ids(tok)
    stream: list[int] = []
    windows: list[list[int]] = []
    n_counted = 0
    for text in texts:
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        stream += ids + ([sep] if isinstance(sep, int) else [])
        while len(stream) >= body:
            w = prefix + stream[:body] + suffix
            stream = stream[body:]
            windows.append(w)
            n_counted += sum(1 for t in w if t not in special)
            if max_tokens is not None and n_counted >= max_tokens:
                break
        if max_tokens is not None and n_counted >= max_tokens:
            break
    if not windows and any(t not in special for t in stream):
        windows.append(prefix + stream + suffix)  # a single short text: one shorter window
    if not windows:
        raise OptionError(
            "texts_or_tokens: the texts tokenized to no (non-special) token: empty or whitespace-only text? "
            "There is nothing to measure."
        )
    toks = torch.tensor(windows, dtype=torch.long)
    counted = torch.ones_like(toks, dtype=torch.bool)
    for s in special:
        counted &= toks != s
    return toks, counted
