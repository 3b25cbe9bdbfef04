"""``tl-idempotence models`` and ``tl-idempotence fetch``: the offline model zoo and its cache."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import EXIT_OK


def cmd_models(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``models``: the zoo's table (name, upstream model, sizes, wheel, what is cached) and the cache folder."""
    import pandas as pd

    from ..sources import zoo

    rows = []
    for name in zoo.known_models():
        spec = zoo.model_spec(name)
        a = spec["architecture"]
        cached = zoo.is_cached(name)
        rows.append(
            {
                "name": name,
                "model": spec["upstream"],
                "arch": a["family"],
                "layers x heads (kv)": f"{a['n_layers']} x {a['n_heads']} ({a['n_kv_heads']})",
                "d_model/d_head": f"{a['d_model']}/{a['d_head']}",
                "wheel": f"{spec['package']}=={spec['version']}",
                "cached": ", ".join(k for k, v in cached.items() if v) or "no",
            }
        )
    print(pd.DataFrame(rows).to_string(index=False))
    print(f"cache: {zoo.cache_dir()} (override with ${zoo.CACHE_ENV}); every use verifies the cached files by sha256")
    return EXIT_OK


def cmd_fetch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``fetch NAME``: fill (or with ``--force`` rebuild) the cache of NAME and verify it; an unknown NAME or a
    missing ``--source`` exits 2."""
    from ..sources import zoo

    if args.name not in zoo.known_models():
        parser.error(f"unknown zoo model {args.name!r}; known: {', '.join(zoo.known_models())}")
    if args.source is not None and not Path(args.source).expanduser().exists():
        parser.error(f"--source {args.source}: no such file or folder")
    path = zoo.fetch(args.name, source=args.source, force=args.force, progress=not args.quiet)
    checked = zoo.verify(args.name)
    print(f"{path}  (verified: {', '.join(f'{k} {v} files' for k, v in checked.items())})")
    return EXIT_OK
