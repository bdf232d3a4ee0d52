"""Hidden states (`LM.hidden`): on every backend the state each row's logits came from, kept as
the cache rolls back, off unless asked for."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from specwise.backends.torch_hf import TorchLM
from toy import tiny_llama

ROWS = 16384  # output rows compared: enough to pin the state down, a fraction of a large vocabulary


@functools.cache
def _output_rows(path: Path) -> np.ndarray:
    """The GGUF file's first ROWS output rows [ROWS, d], dequantized (tied models: the token
    embedding's); read once a file."""
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    t = tensors.get("output.weight") or tensors["token_embd.weight"]
    rows = gguf.quants.dequantize(t.data[:ROWS], t.tensor_type)
    return rows.reshape(-1, int(t.shape[0]))


def _agree(hidden: np.ndarray, logits: np.ndarray, out: np.ndarray) -> float:
    return float(np.corrcoef(hidden @ out.T, logits[: len(out)])[0, 1])


def test_gguf_hidden_states_are_the_output_layers_input(gguf_cls, gguf_path):
    """Each row's hidden state, through the model's own output layer, gives that row's logits
    (correlation: the library multiplies quantized activations); `hidden` follows the cache."""
    lm = gguf_cls(gguf_path, context_length=256, max_sequences=2, hidden=True)
    out = _output_rows(gguf_path)
    assert lm.hidden_size == out.shape[1]
    prompt = [10 + (7 * i) % 200 for i in range(40)]
    last = lm.forward([(0, prompt)], last_only=True)[0][-1]
    assert _agree(lm.hidden(0), last, out) > 0.99
    rows = lm.forward([(0, prompt[:5])])[0]  # positions 40..44
    states = []
    for n in range(45, 40, -1):  # each row's state, as rollback reaches it
        lm.truncate(0, n)
        states.append(lm.hidden(0))
    for h, row in zip(states[::-1], rows, strict=True):
        assert _agree(h, row, out) > 0.99
    lm.truncate(0, 39)  # a position the latest forward did not compute
    assert lm.hidden(0) is None
    if lm.max_sequences > 1:  # rows of two sequences in one call stay apart
        got = lm.forward([(0, [5]), (1, prompt[:3])])
        assert _agree(lm.hidden(0), got[0][-1], out) > 0.99
        assert _agree(lm.hidden(1), got[1][-1], out) > 0.99
    lm.release(0)
    assert lm.hidden(0) is None


def test_gguf_keeps_every_state_since_the_prompts_last_position(gguf_cls, gguf_path):
    """`hiddens`: the states of every position a forward computed, through a rollback."""
    lm = gguf_cls(gguf_path, context_length=256, max_sequences=1, hidden=True)
    out = _output_rows(gguf_path)
    prompt = [10 + (7 * i) % 200 for i in range(40)]
    last = lm.forward([(0, prompt)], last_only=True)[0][-1]
    first = lm.forward([(0, [5, 6, 7])])[0]  # positions 40..42
    lm.truncate(0, 42)  # 40 and 41 stay
    then = lm.forward([(0, [8, 9])])[0]  # 42, 43
    got = lm.hiddens(0, 39)
    assert got.shape == (5, lm.hidden_size)
    for h, row in zip(got, [last, first[0], first[1], then[0], then[1]], strict=True):
        assert _agree(h, row, out) > 0.99
    np.testing.assert_array_equal(got[-1], lm.hidden(0))
    assert len(lm.hiddens(0, 0)) == 5  # the prefill computed its last row only: from 39 on


def test_gguf_hidden_states_are_off_unless_asked(gguf_cls, gguf_path):
    lm = gguf_cls(gguf_path, context_length=128, max_sequences=1)
    lm.forward([(0, [1, 2, 3])])
    assert lm.hidden_size == 0 and lm.hidden(0) is None


def test_a_kept_tree_path_keeps_its_rows_hidden_states(gemma_path):
    from specwise.backends import ik_llama

    if not ik_llama.available():
        pytest.skip(ik_llama.UNAVAILABLE)
    lm = ik_llama.IkLlamaLM(gemma_path, context_length=256, max_sequences=1, hidden=True)
    prompt = [10 + (7 * i) % 200 for i in range(30)]
    lm.forward([(0, prompt)], last_only=True)
    tree = [5, 6, 7, 8]  # 5 -> 6 -> 7 and 5 -> 8
    lm.forward([(0, tree)], trees=[[-1, 0, 1, 0]])
    assert lm.hidden(0) is None  # until a path is kept
    lm.keep(0, [0, 3])
    kept = lm.hidden(0)
    path = lm.hiddens(0, 29)  # the prompt's last, then the kept path's 5 and 8
    assert path.shape[0] == 3
    np.testing.assert_array_equal(path[-1], kept)
    lm.truncate(0, 30)
    lm.forward([(0, [5, 8])])
    assert np.corrcoef(kept, lm.hidden(0))[0, 1] > 0.999


def test_torch_hidden_states_are_the_final_norms_output():
    model = tiny_llama(vocab=16, seed=0)
    lm = TorchLM(model, hidden=True)
    logits = lm.forward([(0, [1, 2, 3, 4])])[0]
    lm.truncate(0, 3)
    h = lm.hidden(0)  # position 2's state
    w = model.lm_head.weight.detach().numpy()
    np.testing.assert_allclose(h @ w.T, logits[2], atol=1e-4)
    assert TorchLM(model).hidden_size == 0


def test_a_ctrl_c_during_a_forward_with_layer_states_is_raised_after_it_not_lost():
    """Ctrl-C lands in the Python that runs: during a forward with layer states, mostly the
    tap's callback, where ctypes would print and drop it. The forward holds it to its end."""
    import signal

    from specwise.backends.ik_llama import interrupts_after

    went_on = False
    # Python's own handler, whatever the process had before (a fresh clone's run once found
    # another there, and the held Ctrl-C went to it)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), interrupts_after():
            # to this thread, its handler run before the call returns (os.kill's may land in
            # another thread, the handler running only after the block)
            signal.raise_signal(signal.SIGINT)
            went_on = True  # nothing raised inside
        assert went_on and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with interrupts_after():  # none held: nothing raised
            pass
    finally:
        signal.signal(signal.SIGINT, outer)


def test_mainline_logits_are_the_same_with_hidden_states_as_without(smollm2_path):
    """A mainline context that computes embeddings outputs every token, so a prefill's last
    row must be looked up by its index: it was read from the buffer's start (the first
    token's logits), and the heads drafter's greedy text parted from plain's at once."""
    from specwise.backends.llama_cpp import LlamaCppLM

    plain = LlamaCppLM(smollm2_path, context_length=256, max_sequences=2)
    hidden = LlamaCppLM(smollm2_path, context_length=256, max_sequences=2, hidden=True)
    prompt = [10 + (7 * i) % 200 for i in range(40)]
    for lm in (plain, hidden):
        lm.forward([(1, prompt[:7])])
    calls = [
        ([(0, prompt)], {"last_only": True}),
        ([(0, [5, 6, 7]), (1, [8])], {}),
        ([(0, [9, 10, 11])], {"rows": [2]}),
    ]
    for batch, kw in calls:
        want, got = plain.forward(batch, **kw), hidden.forward(batch, **kw)
        for w, g in zip(want, got, strict=True):
            np.testing.assert_array_equal(g, w)
