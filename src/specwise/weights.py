"""The target's own weights that drafters start from: the output layer's rows for a reduced
vocabulary (`unembedding`: the heads' and the eagle layer's output start there, and the
teacher computes a read text's labels with them), its token embeddings' rows (`embedding`: the
eagle layer's token embedding starts from them) and the final norm's weights (`final_norm`:
the eagle layer's output norm starts there). Read from a GGUF file (dequantized with the gguf
package; an Ollama blob has no suffix) or from a torch model.

It reads weights; it runs no model and trains nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specwise.backends.base import LM

__all__ = ["embedding", "final_norm", "unembedding"]


def _gguf_tensor(target: LM, names: tuple[str, ...]):
    """The first of the GGUF tensors `names` in the target's file, or None (not a GGUF file,
    or none of them in it)."""
    path = Path(target.info.model)
    if not path.is_file():
        return None
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    return next((tensors[n] for n in names if n in tensors), None)


def _dequantize(tensor, rows: np.ndarray | None = None) -> np.ndarray:
    import gguf

    data = np.asarray(tensor.data)
    data = data if rows is None else data[rows]
    values = gguf.quants.dequantize(data, tensor.tensor_type).astype(np.float32)
    return values if rows is None else values.reshape(len(rows), -1)


def _rows(target: LM, ids: np.ndarray, torch_getter: str, names: tuple[str, ...]):
    """Rows `ids` of a [vocab, hidden_size] matrix of the target as float32: a torch model's
    `torch_getter()` weight, or the first of the GGUF tensors `names`; None where neither is."""
    model = getattr(target, "model", None)
    if model is not None and hasattr(model, torch_getter):
        return getattr(model, torch_getter)().weight.detach().float().numpy()[ids]
    tensor = _gguf_tensor(target, names)
    return None if tensor is None else _dequantize(tensor, np.asarray(ids))


def unembedding(target: LM, ids: np.ndarray) -> np.ndarray | None:
    """The target's output-layer rows for `ids` [len(ids), hidden_size] float32 (the token
    embeddings where the output is tied to them), or None where they cannot be read."""
    return _rows(target, ids, "get_output_embeddings", ("output.weight", "token_embd.weight"))


def embedding(target: LM, ids: np.ndarray) -> np.ndarray | None:
    """The target's token embeddings for `ids` [len(ids), hidden_size] float32, or None where
    they cannot be read."""
    return _rows(target, ids, "get_input_embeddings", ("token_embd.weight",))


def final_norm(target: LM) -> np.ndarray | None:
    """The weights of the target's final norm [hidden_size] float32 (the output layer reads
    norm(state) * these), or None where they cannot be read."""
    model = getattr(target, "model", None)
    if model is not None:
        norm = getattr(getattr(model, "model", model), "norm", None)
        weight = getattr(norm, "weight", None)
        return None if weight is None else weight.detach().float().numpy().copy()
    tensor = _gguf_tensor(target, ("output_norm.weight",))
    return None if tensor is None else _dequantize(tensor).reshape(-1)
