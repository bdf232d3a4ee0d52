"""What a `specwise bench engines` run found best, written as another engine's settings:
llama-server's command line, vLLM's `--speculative-config`, SGLang's flags.

`recommend(summary, engine, level)` picks, at one level of the run (requests in flight), the
speculative setting with the highest throughput over its own engine's speculation-off setting
among those whose ratio's 95% interval lies above 1, and says "speculate" only where there is
one (else it names the fastest, and says not to). For
llama-server the setting is one it ran: its command line is the one measured (less the port
and the metrics endpoint). vLLM and SGLang were not run here (they need a GPU): their settings
translate the best measured llama-server mode — its drafter kind and the mean draft length it
measured — into their options, and say so:

| llama-server mode | vLLM `speculative_config` | SGLang |
|---|---|---|
| ngram-simple, ngram-map-k, ngram-mod | `{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}` | `--speculative-algorithm NGRAM --speculative-num-draft-tokens K` |
| draft | `{"model": DRAFT, "num_speculative_tokens": K}` | `--speculative-algorithm STANDALONE --speculative-draft-model-path DRAFT --speculative-num-steps K --speculative-eagle-topk 1 --speculative-num-draft-tokens K+1` |

K: the measured mean draft length, rounded, at least 1. DRAFT, TARGET: the pair's Hugging Face
repositories (the GGUF files' originals).
"""

from __future__ import annotations

import json
import math
import shlex

__all__ = ["FOR", "recommend"]

FOR = ("llama-server", "vllm", "sglang")
_DROP = {"--port": 1, "--metrics": 0, "--host": 1}  # flags of the measurement, not of a user's


def _beats_plain(c: dict) -> bool:
    lo = c["own"]["ci95"][0]
    return not math.isnan(lo) and lo > 1.0


def _best(summary: dict, engine: str, level: str) -> tuple[dict | None, dict | None]:
    """(the engine's best speculative comparison at `level`: the fastest of those that beat
    speculation off beyond noise, else the fastest; its speculation-off one)."""
    rows = [c for c in summary["comparisons"] if c["level"] == level and c["engine"] == engine]
    spec = [c for c in rows if c["own"] is not None]
    best = max(spec, key=lambda c: (_beats_plain(c), c["own"]["ratio"]), default=None)
    return best, next((c for c in rows if c["own"] is None), None)


def _setting(summary: dict, label: str) -> dict:
    return next(s for s in summary["settings"] if s["label"] == label)


def _level(summary: dict, level: str, label: str) -> dict:
    return next(v for v in summary["levels"] if v["level"] == level and v["setting"] == label)


def _user_command(cmd: list[str]) -> list[str]:
    """A measured server's command line without what only the measurement needed."""
    out, skip = [], 0
    for a in cmd:
        if skip:
            skip -= 1
        elif a in _DROP:
            skip = _DROP[a]
        else:
            out.append(a)
    return out


def _repos(summary: dict) -> tuple[str, str]:
    """The run's target and draft as Hugging Face repositories (the GGUFs' originals), where
    the catalog knows one; else their names."""
    from specwise.models import CATALOG

    def repo(name: str) -> str:
        hub = CATALOG[name].hub if name in CATALOG else None
        return hub.repo.removesuffix("-GGUF") if hub else name

    return repo(summary["models"]["target"]), repo(summary["models"]["draft"])


def recommend(summary: dict, engine: str, level: str | None = None) -> dict:
    """The recommendation for `engine` (one of FOR) at `level` (default: the run's first):
    {"speculate", "setting", "ratio", "ci95", "text", and "command" (llama-server),
    "speculative_config" (vLLM) or "flags" (SGLang)}. Raises ValueError when the run has no
    llama-server settings to judge by."""
    if engine not in FOR:
        raise ValueError(f"--for {engine!r} is unknown; use one of {', '.join(FOR)}")
    levels = list(dict.fromkeys(c["level"] for c in summary["comparisons"]))
    level = level if level is not None else levels[0]
    if level not in levels:
        raise ValueError(f"level {level!r} was not run; the run has {', '.join(levels)}")
    best, plain = _best(summary, "llama-server", level)
    if best is None or plain is None:
        raise ValueError(
            "the run has no llama-server settings with speculation on and off; run "
            "`specwise bench engines --engines specwise,llama-server`"
        )
    lo, hi = best["own"]["ci95"]
    ratio = best["own"]["ratio"]
    speculate = _beats_plain(best)
    mode = _setting(summary, best["setting"])["mode"]
    evidence = (
        f"{best['setting']} at {ratio:.2f}x {plain['setting']} with {level} in flight "
        f"(95% CI {lo:.2f}–{hi:.2f})"
    )
    out = {"engine": engine, "level": level, "speculate": speculate, "setting": best["setting"]}
    out |= {"ratio": ratio, "ci95": [lo, hi]}
    if not speculate:
        out["text"] = f"do not speculate: the best mode measured was {evidence}"
        chosen = plain["setting"]
    else:
        out["text"] = f"speculate: {evidence}"
        chosen = best["setting"]
    spec = _level(summary, level, best["setting"]).get("speculation") or {}
    k = max(1, round(spec.get("mean_draft_length") or 1))
    target, draft = _repos(summary)
    if engine == "llama-server":
        out["command"] = shlex.join(_user_command(_setting(summary, chosen)["command"]))
    elif engine == "vllm":
        cfg = None
        if speculate and mode == "draft":
            cfg = {"model": draft, "num_speculative_tokens": k}
        elif speculate:
            cfg = {"method": "ngram", "num_speculative_tokens": k}
            cfg |= {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
        out["speculative_config"] = cfg
        out["command"] = f"vllm serve {target}" + (
            f" --speculative-config {shlex.quote(json.dumps(cfg))}" if cfg else ""
        )
    else:
        flags: list[str] = []
        if speculate and mode == "draft":
            flags = ["--speculative-algorithm", "STANDALONE"]
            flags += ["--speculative-draft-model-path", draft, "--speculative-num-steps", str(k)]
            flags += ["--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]
        elif speculate:
            flags = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(k)]
        out["flags"] = flags
        out["command"] = shlex.join(
            ["python", "-m", "sglang.launch_server", "--model-path", target, *flags]
        )
    if engine != "llama-server":
        out["note"] = (
            f"not run here: translated from {best['setting']} (mean draft "
            f"length {spec.get('mean_draft_length') or 0:.1f}); measure it on your {engine}"
        )
    return out
