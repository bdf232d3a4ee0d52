"""`TorchLM`: the LM protocol over any Hugging Face transformers causal LM.

Builds from an in-memory model, a local Hugging Face folder, or a GGUF file (transformers
dequantizes GGUF to float32). Each sequence has its own `DynamicCache`; `truncate` crops it.
`forward` runs the sequences of a batch one after another (no padding), which is exact and
simple; the batched fast path is the llama.cpp backend. In exact mode (`exact=True`) a call
that asks for every row feeds its tokens one at a time, so a row is computed as in plain
decoding whatever the call's length (torch's matrix kernels round a row of a multi-row
product differently from a one-row product). This module does no sampling and no
downloading: a hub id is not accepted, only local files.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specwise.backends.base import (
    BackendInfo,
    HiddenLog,
    check_append,
    check_layers,
    check_rows,
    check_truncate,
    eos_ids,
    file_fingerprint,
    one_pass_each,
    refuse_trees,
)

__all__ = ["HFTokenizer", "TorchLM"]


class HFTokenizer:
    """The Tokenizer protocol over a transformers tokenizer."""

    def __init__(self, tok: Any, extra_eos: frozenset[int] = frozenset()) -> None:
        self._tok = tok
        self.eos_token_ids = eos_ids(tok.eos_token_id) | extra_eos
        self.n_tokens = len(tok)
        self._id_to_text: list[str] | None = None

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        return list(self._tok(text, add_special_tokens=add_special)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def render_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        if not getattr(self._tok, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template; drop --chat")
        text = self._tok.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False
        )
        return self.encode(text, add_special=False)

    def token_text(self, token_id: int) -> str:
        if self._id_to_text is None:
            table = [""] * self.n_tokens
            for text, i in self._tok.get_vocab().items():
                if 0 <= i < self.n_tokens:
                    table[i] = text
            self._id_to_text = table
        return self._id_to_text[token_id]


def _load(path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not path.exists():
        raise FileNotFoundError(
            f"model path {str(path)!r} does not exist; give a local Hugging Face folder "
            f"or a .gguf file"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(
                f"model file {str(path)!r} is not a .gguf file; give a .gguf file or a "
                f"Hugging Face folder"
            )
        kw = {"gguf_file": path.name}
        folder = str(path.parent)
    else:
        if not (path / "config.json").exists():
            raise ValueError(
                f"folder {str(path)!r} has no config.json; it is not a Hugging Face model folder"
            )
        kw = {}
        folder = str(path)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw)
    try:
        tok = AutoTokenizer.from_pretrained(folder, **kw)
    except (OSError, ValueError):
        tok = None
    return model, tok


class TorchLM:
    """TorchLM(model_or_path, tokenizer=None, exact=False, hidden=False): a transformers causal
    LM with per-sequence caches; hidden=True keeps the final hidden states (`LM.hidden`),
    hidden=(i, j, ...) the outputs of those layers at every token fed (`LM.hidden_layers`)."""

    def __init__(
        self,
        model_or_path: Any,
        tokenizer: Any = None,
        *,
        context_length: int | None = None,
        exact: bool = False,
        hidden: bool | Sequence[int] = False,
    ) -> None:
        self.exact = exact
        self.trees = False
        if isinstance(model_or_path, str | os.PathLike):
            path = Path(model_or_path)
            model, loaded_tok = _load(path)
            tokenizer = tokenizer if tokenizer is not None else loaded_tok
            source = str(path)
            fingerprint = file_fingerprint(path)
        else:
            model, source = model_or_path, "in-memory"
            fingerprint = f"in-memory-{id(model):x}"
        self.model = model.eval()
        cfg = model.config
        out = model.get_output_embeddings()
        self.vocab_size = int(out.weight.shape[0]) if out is not None else int(cfg.vocab_size)
        max_pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        self.context_length = int(context_length or max_pos or 2048)
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        model_eos = eos_ids(cfg.eos_token_id, gen_eos)
        if tokenizer is not None and not isinstance(tokenizer, HFTokenizer):
            tokenizer = HFTokenizer(tokenizer, model_eos)
        self.tokenizer: HFTokenizer | None = tokenizer
        self.eos_token_ids = model_eos | (tokenizer.eos_token_ids if tokenizer else frozenset())
        self.info = BackendInfo("torch", source, torch.get_num_threads(), fingerprint, exact=exact)
        self._caches: dict[int, Any] = {}
        self._lengths: dict[int, int] = {}
        self.hidden_layers = check_layers(hidden, int(cfg.num_hidden_layers))
        self.hidden_size = int(cfg.hidden_size) * max(1, len(self.hidden_layers)) if hidden else 0
        self._hidden: dict[int, HiddenLog] = {}  # seq -> the hidden states kept
        # transformers >= 5.24 calls the cache argument `cache`; older versions `past_key_values`
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    # -- LM protocol -------------------------------------------------------------------------
    def forward(
        self,
        batch: Sequence[tuple[int, Sequence[int]]],
        last_only: bool = False,
        rows: Sequence[int] | None = None,
        trees: Sequence[Sequence[int] | None] | None = None,
    ) -> list[np.ndarray]:
        check_rows(batch, rows, last_only)
        refuse_trees("the torch backend", trees)
        out: list[np.ndarray] = []
        before = {seq: self._lengths.get(seq, 0) for seq, _ in batch}
        try:
            self._forward_each(batch, last_only, out)
            if rows is not None:  # computed anyway: the model is called a sequence at a time
                out = [x[:n] for x, n in zip(out, rows, strict=True)]
        except BaseException:  # all or nothing: undo the sequences already fed
            for seq, n in before.items():
                if self._lengths.get(seq, 0) > n:
                    self.truncate(seq, n)
            raise
        return out

    def _forward_each(self, batch, last_only: bool, out: list[np.ndarray]) -> None:
        from transformers import DynamicCache

        with torch.inference_mode():
            for seq, tokens in batch:
                n = len(tokens)
                have = self._lengths.get(seq, 0)
                check_append(seq, have, n, self.context_length)
                cache = self._caches.get(seq)
                if cache is None:
                    cache = self._caches[seq] = DynamicCache(config=self.model.config)
                pieces = [[t] for t in tokens] if self.exact and not last_only else [tokens]
                rows, states, finals = [], [], []
                for piece in pieces:
                    res = self.model(
                        input_ids=torch.tensor([list(piece)], dtype=torch.long),
                        use_cache=True,
                        logits_to_keep=1 if last_only else 0,
                        output_hidden_states=bool(self.hidden_size),
                        **{self._cache_kw: cache},  # the cache is updated in place
                    )
                    self._lengths[seq] = self._lengths.get(seq, 0) + len(piece)
                    rows.append(res.logits[0].float().numpy())  # [len(piece) or 1, V]
                    if self.hidden_size:  # the last entry is the output norm's: [len(piece), d]
                        finals.append(res.hidden_states[-1][0].float().numpy())
                        # entry i + 1 is layer i's output
                        layers = [res.hidden_states[i + 1][0] for i in self.hidden_layers]
                        states.append(torch.cat(layers, -1).float().numpy() if layers else None)
                if self.hidden_size:  # the rows asked for: the last one only, with last_only
                    log = self._hidden.setdefault(seq, HiddenLog(self.hidden_size))
                    self._final = np.concatenate(finals)
                    kept = np.concatenate(states) if self.hidden_layers else self._final
                    if last_only and not self.hidden_layers:
                        log.put(have + len(kept) - 1, kept[-1:])
                    else:
                        log.put(have, kept)
                logits = rows[0] if len(rows) == 1 else np.concatenate(rows)
                out.append(np.ascontiguousarray(logits, dtype=np.float32))

    def read(self, seq: int, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """`LM.read` (the logits are computed, then dropped)."""
        if not self.hidden_layers:
            raise ValueError("read needs a torch target built with hidden layers")
        start = self._lengths.get(seq, 0)
        self.forward([(seq, tokens)])
        return self._hidden[seq].since(start, self._lengths[seq]), self._final

    def passes(self, calls: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """One pass per sequence (`forward` feeds them one after another), one per token in
        exact mode."""
        if self.exact:
            return one_pass_each(calls, 1)
        return [(1, n) for _, n in calls if n > 0]

    def keep(self, seq: int, path: Sequence[int]) -> None:
        raise ValueError(f"sequence {seq} holds no tree: the torch backend takes none")

    def length(self, seq: int) -> int:
        return self._lengths.get(seq, 0)

    def truncate(self, seq: int, n: int) -> None:
        have = self._lengths.get(seq, 0)
        check_truncate(seq, have, n)
        if n == have:
            return
        if n == 0:
            self.release(seq)
            return
        self._caches[seq].crop(-(have - n))
        self._lengths[seq] = n
        if seq in self._hidden:
            self._hidden[seq].cut(n)

    def hidden(self, seq: int) -> np.ndarray | None:
        log = self._hidden.get(seq)
        return None if log is None else log.at(self._lengths.get(seq, 0) - 1)

    def hiddens(self, seq: int, start: int) -> np.ndarray | None:
        log = self._hidden.get(seq)
        return None if log is None else log.since(start, self._lengths.get(seq, 0))

    def release(self, seq: int) -> None:
        self._caches.pop(seq, None)
        self._lengths.pop(seq, None)
        self._hidden.pop(seq, None)

    def in_use(self) -> int:
        return len(self._caches)
