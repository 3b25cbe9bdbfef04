"""A small, seeded training lineage with saved checkpoints — a real trajectory without the hub.

:func:`train_lineage` trains a tiny Llama-architecture model (``transformers``
``LlamaForCausalLM``: RMSNorm, RoPE, GQA, tied embeddings) on a synthetic
induction task — a random token sequence followed by its repeat, loss on the
repeat only — and writes Hugging Face checkpoint directories
``ckpt_step{N}/`` (``config.json``, ``model.safetensors``, a word-level
tokenizer), including ``ckpt_step0`` = the random initialisation. Both
TransformerLens's ``TransformerBridge.boot_transformers(dir)`` (transformer-lens
3.x and 4.x) and the checkpoint-file source of :func:`tl_idempotence.idempotence_report`
read these directories.

Why this task (SPEC section 6, "retrospective trajectories"): a two-layer model
learns it with an induction circuit (a previous-token head in layer 0, copying
heads in layer 1) within ~100 steps. With tied embeddings the copying heads' OV
maps a token's embedding back onto the same embedding direction, so their
``T = O Vᵀ`` becomes close to a scaled projection: with the defaults (seed 0,
200 steps) every layer-1 head ends with ``P ≈ 0.91–0.93`` while at step 0 all
heads have ``P ~ 1e-3`` (random-init level). With untied embeddings the same
training reaches the same accuracy and no head closes — so the lineage also
illustrates that closure is a property of how the circuit is written, not of
solving the task.

Runtime: ~10 s on one idle CPU thread for the defaults (20-30 s measured on a loaded 2-core machine).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from ..core.files import check_work_folder, read_json
from ..core.options import check_bool, check_int, check_seed, strict_kwargs
from ..core.progress import quiet_transformers
from ..errors import CheckpointError, MissingFileError, OptionError, OptionTypeError

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterable

    from ..core.hints import IntLike, PathLike

__all__ = ["Lineage", "lineage_checkpoints", "tiny_tokenizer", "train_lineage"]

#: Token ids 0..3 are reserved (unk, BOS, EOS, PAD) by :func:`tiny_tokenizer`.
N_SPECIAL = 4
_CKPT_RE = re.compile(r"^ckpt_step(\d+)$")


def tiny_tokenizer(vocab_size: int = 100) -> Any:
    """Word-level fast tokenizer over tokens ``w0..w{vocab_size-1}`` (w0 = UNK, w1 = BOS, w2 = EOS, w3 = PAD).

    Used by the training lineage and by tests; needs ``tokenizers`` and ``transformers``.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w0", bos_token="w1", eos_token="w2", pad_token="w3")


@dataclass
class Lineage:
    """A trained lineage on disk.

    Attributes:
        root: the output directory.
        checkpoints: ``[(label, path)]`` ordered by step; labels are ``"step{N}"``,
            paths are the ``ckpt_step{N}`` directories — directly usable as the
            ``checkpoints`` argument of :func:`tl_idempotence.trajectory`.
        metrics: one row per saved checkpoint: ``step``, ``loss`` (mean cross-entropy
            in nats on a fixed held-out batch, repeat half only), ``induction_acc``
            (fraction of repeat tokens predicted exactly, in [0, 1]).
        config: the training configuration (also in ``root/lineage.json``).
    """

    root: Path
    checkpoints: list[tuple[str, Path]]
    metrics: pd.DataFrame
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> list[int]:
        """The training steps of the saved checkpoints, in order."""
        return [int(s) for s in self.metrics["step"]]


def _batch(gen: torch.Generator, batch_size: int, seq_len: int, vocab_size: int) -> torch.Tensor:
    """``[batch, 2*seq_len + 1]`` token ids: BOS, x, x with x uniform over non-special tokens."""
    x = torch.randint(N_SPECIAL, vocab_size, (batch_size, seq_len), generator=gen)
    bos = torch.ones(batch_size, 1, dtype=torch.long)
    return torch.cat([bos, x, x], dim=1)


def _repeat_loss(model: Any, ids: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy (nats) and exact-match accuracy on the predictions of the repeated half."""
    logits = model(ids).logits  # [batch, pos, vocab]
    pred = logits[:, seq_len + 1 : -1]  # positions whose next token is in the repeat (after its first token)
    target = ids[:, seq_len + 2 :]
    loss = torch.nn.functional.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1))
    acc = (pred.argmax(-1) == target).float().mean()
    return loss, acc


def tiny_llama_config(
    d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, vocab_size: int, max_positions: int, **more: Any
) -> Any:
    """The ``transformers.LlamaConfig`` of the tiny models (the training lineage and
    ``tl_idempotence.testing.tiny_hf_dir``): MLP width ``2 * d_model``, token ids 1/2/3 for BOS/EOS/PAD
    (:func:`tiny_tokenizer`), ``more`` config fields on top. Sizes are not checked here (the callers do)."""
    import transformers

    return transformers.LlamaConfig(
        hidden_size=d_model,
        intermediate_size=2 * d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        **more,
    )


def _finished_lineage(root: Path, config: dict[str, Any]) -> Lineage | None:
    """The lineage already in ``root`` when its manifest says it was trained with ``config`` and every saved
    checkpoint is there; else ``None`` (a manifest that cannot be read, or is not what :func:`train_lineage`
    writes, is not reused: the lineage is trained again and the manifest rewritten)."""
    manifest = root / "lineage.json"
    if not manifest.is_file():
        return None
    try:
        old: Any = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        old = None
    metrics = None
    if (
        isinstance(old, dict)
        and old.get("config") == config
        and all((root / f"ckpt_step{s}" / "model.safetensors").is_file() for s in config["saved_steps"])
    ):
        try:
            metrics = pd.DataFrame(old["metrics"])
        except (KeyError, TypeError, ValueError):
            metrics = None
    if metrics is not None and list(metrics.columns) == ["step", "loss", "induction_acc"]:
        ckpts = [(f"step{s}", root / f"ckpt_step{s}") for s in config["saved_steps"]]
        return Lineage(root=root, checkpoints=ckpts, metrics=metrics, config=config)
    return None


def _train_and_save(
    hf_cfg: Any, root: Path, config: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[tuple[str, Path]]]:
    """Initialise the model from ``config["seed"]`` (the caller's global RNG untouched), train it
    ``config["steps"]`` AdamW steps and save it at ``config["saved_steps"]`` (with ``config["num_threads"]``
    torch threads, restored after). Returns the metric rows and the ``(label, folder)`` of each checkpoint."""
    import transformers

    seed, steps, seq_len, vocab_size = config["seed"], config["steps"], config["seq_len"], config["vocab_size"]
    batch_size, num_threads, to_save = config["batch_size"], config["num_threads"], set(config["saved_steps"])
    lr, weight_decay = config["lr"], config["weight_decay"]
    tokenizer = tiny_tokenizer(vocab_size)
    old_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    rows: list[dict[str, Any]] = []
    checkpoints: list[tuple[str, Path]] = []
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = transformers.LlamaForCausalLM(hf_cfg)
        model.train()
        gen = torch.Generator().manual_seed(seed)
        eval_ids = _batch(torch.Generator().manual_seed(seed + 10_000), 128, seq_len, vocab_size)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

        def save(step: int) -> None:
            with torch.no_grad():
                loss, acc = _repeat_loss(model, eval_ids, seq_len)
            d = root / f"ckpt_step{step}"
            with quiet_transformers():  # no "Writing model shards" bar per checkpoint
                model.save_pretrained(d)
                tokenizer.save_pretrained(d)
            rows.append({"step": step, "loss": float(loss), "induction_acc": float(acc)})
            checkpoints.append((f"step{step}", d))

        save(0)
        for step in range(1, steps + 1):
            loss, _ = _repeat_loss(model, _batch(gen, batch_size, seq_len, vocab_size), seq_len)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step in to_save:
                save(step)
    finally:
        torch.set_num_threads(old_threads)
    return rows, checkpoints


def _check_rate(v: Any, name: str) -> Any:
    """``v`` as given when a finite number (``lr``: > 0, ``weight_decay``: >= 0); OptionTypeError / OptionError."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise OptionTypeError(f"{name} must be a number; got {type(v).__name__} {v!r}.")
    if not math.isfinite(v) or v < 0 or (name == "lr" and v == 0):
        raise OptionError(f"{name} must be a finite number {'> 0' if name == 'lr' else '>= 0'}; got {v!r}.")
    return v


def _saved_steps(save_steps: Any, steps: int, save_every: int) -> list[int]:
    """The steps to save, ascending: every ``save_every``-th (or the given ``save_steps``), with 0 and ``steps``."""
    if save_steps is None:
        to_save = set(range(0, steps + 1, save_every))
    else:
        if isinstance(save_steps, (str, bytes)) or not hasattr(save_steps, "__iter__"):
            raise OptionTypeError(f"save_steps must be None or a sequence of integer steps; got {save_steps!r:.60}.")
        to_save = {check_int(v, f"save_steps[{i}]", 0, steps) for i, v in enumerate(save_steps)}
    to_save |= {0, steps}
    return sorted(to_save)


@strict_kwargs
def train_lineage(
    out_dir: PathLike,
    *,
    steps: IntLike = 200,
    save_every: IntLike = 20,
    seed: IntLike = 0,
    n_layers: IntLike = 2,
    d_model: IntLike = 64,
    n_heads: IntLike = 4,
    n_kv_heads: IntLike = 2,
    vocab_size: IntLike = 64,
    seq_len: IntLike = 16,
    batch_size: IntLike = 32,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    tie_word_embeddings: bool = True,
    num_threads: IntLike | None = 1,
    save_steps: Iterable[IntLike] | None = None,
    reuse: bool = True,
) -> Lineage:
    """Train a tiny GQA Llama on repeated random sequences, saving HF checkpoints (SPEC section 6).

    Seeded and deterministic: the initialisation uses ``torch.manual_seed(seed)``
    inside :func:`torch.random.fork_rng` (the caller's global RNG is untouched) and
    the data a ``torch.Generator`` seeded with ``seed``; with the same
    ``num_threads`` on the same machine two runs write bit-identical weights.

    Args:
        out_dir: directory to write ``ckpt_step{N}/`` subdirectories and ``lineage.json``
            into (``str`` or ``os.PathLike``; created, its parent folder must exist). Avoid
            model-family words ("llama", "gpt2") in the path: transformer-lens 3.x dispatches on
            substrings of model paths.
        steps: optimizer steps (AdamW), >= 1.
        save_every: save a checkpoint every this many steps; step 0 (random init) and
            the last step are always saved.
        seed: seed of the initialisation and of the data.
        n_layers: model size: layers.
        d_model: model size: residual width (``d_head = d_model // n_heads``).
        n_heads: model size: query heads.
        n_kv_heads: model size: key/value heads (``n_kv_heads < n_heads`` gives GQA).
        vocab_size: model size: vocabulary.
        seq_len: length of the random sequence; each example is ``BOS, x, x``
            (``2 * seq_len + 1`` tokens).
        batch_size: examples per step.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        tie_word_embeddings: tie the unembedding to the embedding (default True; this is
            what makes the copying heads close, see the module docstring).
        num_threads: torch intra-op threads during training (restored afterwards);
            ``None`` keeps the current setting. One thread is fastest at this size.
        save_steps: explicit steps to save instead of ``save_every`` (0 and ``steps``
            are always added).
        reuse: if ``out_dir`` already holds a complete lineage trained with the same
            configuration (``lineage.json`` and every ``ckpt_step{N}``), return it without
            training (lets tests and notebooks share one lineage).

    Returns:
        :class:`Lineage` with the checkpoint list and the per-checkpoint loss/accuracy.

    Raises:
        OptionTypeError / OptionError: a non-integer or non-positive size, ``seq_len < 2``, a
            non-finite or negative ``lr``/``weight_decay``, ``n_heads`` not a multiple of
            ``n_kv_heads``, ``d_model`` not divisible by ``n_heads``, or a vocabulary with fewer
            than 2 non-special tokens; ``out_dir`` not a path (OptionTypeError), empty, an existing
            file or in a folder that does not exist (OptionError, naming the path).
    """
    config, reuse = _lineage_config(
        steps,
        save_every,
        seed,
        n_layers,
        d_model,
        n_heads,
        n_kv_heads,
        vocab_size,
        seq_len,
        batch_size,
        lr,
        weight_decay,
        tie_word_embeddings,
        num_threads,
        save_steps,
        reuse,
    )
    # not "", not a file, its parent existing (the rule of every folder a run creates): refused before training
    root = check_work_folder(out_dir, "out_dir")
    if reuse and (done := _finished_lineage(root, config)) is not None:
        return done
    root.mkdir(parents=True, exist_ok=True)
    (root / "lineage.json").unlink(missing_ok=True)  # re-written when the new lineage is complete
    hf_cfg = tiny_llama_config(
        config["d_model"],
        config["n_layers"],
        config["n_heads"],
        config["n_kv_heads"],
        config["vocab_size"],
        max(64, 2 * config["seq_len"] + 1),
        tie_word_embeddings=config["tie_word_embeddings"],
    )
    rows, checkpoints = _train_and_save(hf_cfg, root, config)
    _write_manifest(root, config, rows)
    return Lineage(root=root, checkpoints=checkpoints, metrics=pd.DataFrame(rows), config=config)


def _lineage_config(
    steps: Any,
    save_every: Any,
    seed: Any,
    n_layers: Any,
    d_model: Any,
    n_heads: Any,
    n_kv_heads: Any,
    vocab_size: Any,
    seq_len: Any,
    batch_size: Any,
    lr: Any,
    weight_decay: Any,
    tie_word_embeddings: Any,
    num_threads: Any,
    save_steps: Any,
    reuse: Any,
) -> tuple[dict[str, Any], bool]:
    """:func:`train_lineage`'s options checked, in the order of its signature, as the configuration its
    manifest records (``lineage.json``'s ``config``, in this key order), and ``reuse``. Raises what it documents."""
    config: dict[str, Any] = {
        "steps": check_int(steps, "steps", 1, 10_000_000),
        "save_every": check_int(save_every, "save_every", 1),
        "seed": check_seed(seed),
        "n_layers": check_int(n_layers, "n_layers", 1, 1024),
        "d_model": check_int(d_model, "d_model", 1, 1 << 16),
        "n_heads": check_int(n_heads, "n_heads", 1, 1024),
        "n_kv_heads": check_int(n_kv_heads, "n_kv_heads", 1, 1024),
        "vocab_size": check_int(vocab_size, "vocab_size", N_SPECIAL + 2, 1 << 20),
        "seq_len": check_int(seq_len, "seq_len", 2, 1 << 14),  # the loss needs at least one repeated token
        "batch_size": check_int(batch_size, "batch_size", 1, 1 << 16),
        "lr": _check_rate(lr, "lr"),
        "weight_decay": _check_rate(weight_decay, "weight_decay"),
        "tie_word_embeddings": check_bool(tie_word_embeddings, "tie_word_embeddings"),
        "task": "BOS x x (repeat), loss on repeat",
        "architecture": "LlamaForCausalLM",
    }
    reuse = check_bool(reuse, "reuse")
    if num_threads is not None:
        num_threads = check_int(num_threads, "num_threads", 1, 1024)
    if config["n_heads"] % config["n_kv_heads"] or config["d_model"] % config["n_heads"]:
        raise OptionError(
            f"Need n_heads % n_kv_heads == 0 and d_model % n_heads == 0; got d_model={config['d_model']}, "
            f"n_heads={config['n_heads']}, n_kv_heads={config['n_kv_heads']}."
        )
    config["saved_steps"] = _saved_steps(save_steps, config["steps"], config["save_every"])
    config["num_threads"] = num_threads
    return config, reuse


def _write_manifest(root: Path, config: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """``root/lineage.json`` (the configuration and the metric rows), written atomically and last: a lineage with
    a manifest is complete."""
    manifest = root / "lineage.json"
    tmp = manifest.with_name(f"lineage.json.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"config": config, "metrics": rows}, indent=1))
    os.replace(tmp, manifest)


@strict_kwargs
def lineage_checkpoints(root: Any) -> list[tuple[str, Path]]:
    """``[("step{N}", root/ckpt_step{N})]`` for the checkpoints of a lineage directory, by step.

    Uses the saved steps of ``root/lineage.json`` when present (so stale directories of an
    earlier run with other settings are ignored), else every ``ckpt_step{N}`` directory.

    Raises:
        MissingFileError: ``root`` is not a directory, holds no ``ckpt_step{N}`` directory,
            or lacks one that its ``lineage.json`` lists.
        CheckpointError: ``lineage.json`` is unreadable or malformed (names it).
    """
    if not isinstance(root, (str, os.PathLike)):
        raise OptionTypeError(f"root must be a directory path; got {type(root).__name__}.")
    root = Path(root)
    if not root.is_dir():
        raise MissingFileError(f"{root} is not a directory; expected a lineage written by train_lineage().")
    manifest = root / "lineage.json"
    if manifest.is_file():
        rec = read_json(manifest, CheckpointError, "lineage manifest")
        try:
            steps = [int(v) for v in rec["config"]["saved_steps"]]
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{manifest} has no list config.saved_steps of integers ({type(e).__name__}).") from e
        missing = [s for s in steps if not (root / f"ckpt_step{s}").is_dir()]
        if missing:
            raise MissingFileError(f"{manifest} lists steps {missing} but their ckpt_step directories are missing.")
        return [(f"step{s}", root / f"ckpt_step{s}") for s in steps]
    found = []
    for p in root.iterdir():
        m = _CKPT_RE.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    if not found:
        raise MissingFileError(f"No ckpt_step{{N}} directories under {root}.")
    return [(f"step{s}", p) for s, p in sorted(found)]
