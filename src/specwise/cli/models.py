"""`specwise models`: the catalog, its pairs, the requantized copies made here and the GGUF
models already on this machine (`list`), `pull` (of NAME@RECIPE: pulled, then requantized) and
`path`.

It reads and downloads through `specwise.models` and `specwise.stores`; it loads no model.
"""

from __future__ import annotations

import argparse

from specwise.cli.common import UsageError

__all__ = ["add_parser", "cmd_models"]


def cmd_models(a: argparse.Namespace) -> int:
    from specwise import models
    from specwise.backends.requant import list_derived, requantized, split_name

    if a.models_command == "list":
        print(f"{'name':32} {'role':7} {'size':>9}  {'pulled':6}  description")
        for e in models.CATALOG.values():
            size = f"{e.size / 2**20:.0f} MiB" if e.size else "?"
            pulled = "yes" if models.is_pulled(e.name) else "no"
            print(f"{e.name:32} {e.role:7} {size:>9}  {pulled:6}  {e.description}")
        print()
        for p in models.PAIRS.values():
            default = " (default)" if p.name == models.DEFAULT_PAIR else ""
            print(f"pair {p.name}{default}: target {p.target} + draft {p.draft}")
        derived = list_derived()
        if derived:
            print("\nrequantized here (NAME@RECIPE, `specwise.backends.requant`):")
        for d in derived:
            print(
                f"  {d['source_name'] + '@' + d['recipe']:40} {d['bytes'] / 2**20:5.0f} MiB  "
                f"{d['description']}"
            )
        print(f"\ncache: {models.home() / 'models'}")
        print("\n".join(_found_lines()))
    elif a.models_command == "pull":
        source, recipe = split_name(a.name)
        path = models.pull(source, source=a.source)
        print(path if recipe is None else requantized(path, recipe, source))
    elif a.models_command == "path":
        if a.name in models.PAIRS:
            raise UsageError(f"{a.name!r} is a pair; ask for one model: `models path NAME`")
        source, recipe = split_name(a.name)
        if source.startswith("ollama:"):
            from specwise.stores import resolve_ollama

            path = resolve_ollama(source).path
        else:
            path = models.resolve(source, pull_missing=False)
        if recipe is not None:
            try:
                path = requantized(path, recipe, source, make=False)
            except FileNotFoundError as exc:
                raise UsageError(str(exc)) from None
        print(path)
    return 0


def _found_lines() -> list[str]:
    """`models list`'s second part: the GGUF models of Ollama, LM Studio and the Hugging Face
    cache on this machine, each with what runs it and the draft to try with it."""
    from specwise.stores import discover, hf_cache_root, suggest_draft

    stores, missing = discover()
    found = [m for st in stores for m in st.models]
    lines = ["", "GGUF models already on this machine (read from their headers, never copied):"]
    lines += [f"  {sentence}" for sentence in missing]
    for st in stores:
        n = len(st.models)
        lines.append(f"{st.kind} ({st.root}): {n or 'no'} model{'' if n == 1 else 's'}")
        for m in st.models:
            h = m.header
            lines.append(
                f"  {m.name:40} {m.size / 2**30:6.2f} GiB  {h.file_type or '?':8} "
                f"{h.parameter_size:>6}  {h.architecture:10} tokenizer {h.tokenizer_family}"
            )
            advice = suggest_draft(m, found)
            lines.append(f"      --target {m.ref}  ·  draft: {advice.flags}: {advice.why}")
        lines += [f"  ! {p}" for p in st.problems]
    kinds = {st.kind for st in stores}
    looked = {
        "ollama": "OLLAMA_MODELS, ~/.ollama/models, /usr/share/ollama/.ollama/models",
        "lm-studio": "~/.lmstudio/models, ~/.cache/lm-studio/models",
        "hf-cache": str(hf_cache_root()),
    }
    lines += [
        f"{k}: none found (looked in {where})" for k, where in looked.items() if k not in kinds
    ]
    return lines


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`models` and its subcommands."""
    m = sub.add_parser("models", help="the model catalog and the models on this machine")
    msub = m.add_subparsers(dest="models_command", required=True)
    msub.add_parser(
        "list",
        help="catalog models and pairs, whether they are pulled, and the GGUF models of Ollama, "
        "LM Studio and the Hugging Face cache on this machine, each with a draft to try",
    )
    mp = msub.add_parser(
        "pull",
        help="download, assemble and verify a model (or a pair); NAME@RECIPE (q4_0, q5_0, "
        "iq4_nl; best: the one `bench drafts` kept here) also makes that model requantized, "
        "a cheaper draft",
    )
    mp.add_argument("name")
    mp.add_argument("--from", dest="source", help="use this local file instead of downloading")
    mpath = msub.add_parser(
        "path", help="print the file of a pulled model (or of ollama:NAME[:TAG] in Ollama's store)"
    )
    mpath.add_argument("name")
    m.set_defaults(func=cmd_models)
