"""The GGUF backends (mainline llama.cpp and ik_llama.cpp: the same LM contract) on a real model
(SmolLM2-135M Q4_1); the tests that name LlamaCppLM are about mainline's own build and slots."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import needs_batches
from specwise import Engine, SamplingParams
from specwise.backends.llama_cpp import LlamaCppLM
from specwise.backends.requant import derive
from specwise.bench.runner import greedy_divergence, top2_gap
from specwise.bench.ties import NEAR_TIE_FACTOR
from specwise.drafters import ModelDrafter, NgramDrafter
from specwise.drafters.suffix import SuffixDrafter
from specwise.oracle import plain_decode

TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fib"


def test_multi_token_forward_does_not_crash(smollm2_path):
    """A build with broken AMX kernels dies (SIGILL) on the first multi-token forward; run one in
    a child process so such a build fails here with a clear message instead of at a user's."""
    code = (
        "from specwise.backends.llama_cpp import LlamaCppLM\n"
        f"lm = LlamaCppLM({str(smollm2_path)!r}, context_length=256)\n"
        "rows = lm.forward([(0, list(range(100, 116)))])[0]\n"
        "assert rows.shape[0] == 16\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, (
        f"a 16-token llama.cpp forward failed (exit {res.returncode}); if this is a signal "
        f"(negative), rebuild llama-cpp-python without AMX kernels (see the Makefile): "
        f"{res.stderr[-500:]}"
    )


def test_tokenizer_round_trip_and_chat_template(gguf):
    tok = gguf.tokenizer
    ids = tok.encode(TEXT, add_special=False)
    assert tok.decode(ids) == TEXT
    if tok.chat_template:  # Gemma 3 270M (base) has none
        chat = tok.render_chat([{"role": "user", "content": "hi"}])
        assert tok.decode(chat).rstrip().endswith(("assistant", "model"))
    else:
        with pytest.raises(ValueError, match="no chat template"):
            tok.render_chat([{"role": "user", "content": "hi"}])
    assert tok.eos_token_ids and max(tok.eos_token_ids) < gguf.vocab_size
    assert gguf.info.backend == gguf.backend and gguf.threads >= 1


def test_batched_equals_one_by_one_and_truncate_rolls_back(gguf, gguf_noise):
    ids = gguf.tokenizer.encode(TEXT)
    full = gguf.forward([(0, ids)])[0]  # [n, V]
    assert full.shape == (len(ids), gguf.vocab_size) and full.dtype == np.float32
    gguf.truncate(0, 5)
    again = gguf.forward([(0, ids[5:])])[0]
    np.testing.assert_allclose(again, full[5:], atol=1e-3)
    gguf.release(0)
    one = np.stack([gguf.forward([(0, [t])])[0][0] for t in ids])
    for a, b in zip(one, full, strict=True):  # the same token, or a near-tie of the kernels'
        assert a.argmax() == b.argmax() or top2_gap(b) <= NEAR_TIE_FACTOR * gguf_noise["top2_gap"]
    corr = [float(np.corrcoef(a, b)[0, 1]) for a, b in zip(one, full, strict=True)]
    assert min(corr) > 0.99, corr  # rounding, not another computation
    gguf.release(0)


def test_rows_returns_the_first_logits_and_feeds_the_rest(gguf):
    needs_batches(gguf)
    ids = gguf.tokenizer.encode(TEXT)[:12]
    full = gguf.forward([(0, ids[:6]), (1, ids[6:])])
    gguf.truncate(0, 0)
    gguf.truncate(1, 0)
    part = gguf.forward([(0, ids[:6]), (1, ids[6:])], rows=[2, 6])
    assert [x.shape[0] for x in part] == [2, 6]
    assert _close(part[0], full[0][:2]) and _close(part[1], full[1])  # fewer rows computed
    assert gguf.length(0) == 6  # the rows without logits were fed all the same
    after = gguf.forward([(0, ids[6:7])])[0]
    gguf.release(1)
    gguf.forward([(1, ids[:6])], last_only=True)  # the same calls, every row's logits
    whole = gguf.forward([(1, ids[6:7])])[0]
    assert _close(after, whole)
    gguf.release(1)
    for bad in ([0, 1], [1], [1, 2]):
        with pytest.raises(ValueError, match=r"logits rows|row counts"):
            gguf.forward([(0, [1]), (1, [2])], rows=bad)
    with pytest.raises(ValueError, match="not both"):
        gguf.forward([(0, [1])], last_only=True, rows=[1])
    assert gguf.length(0) == 7 and gguf.length(1) == 0  # refused calls fed nothing
    gguf.release(0)


def test_sequences_are_isolated(gguf):
    needs_batches(gguf)
    ids = gguf.tokenizer.encode(TEXT)
    alone = gguf.forward([(7, ids)], last_only=True)[0]
    gguf.release(7)
    other = list(reversed(ids))
    both = gguf.forward([(8, other), (7, ids)], last_only=True)
    assert gguf.in_use() == 2
    assert _close(both[1], alone)  # one row of logits computed, then two
    assert both[0].shape == (1, gguf.vocab_size)
    # grow sequence 8 further; 7 must not see it
    gguf.forward([(8, ids)])
    gguf.truncate(7, len(ids) - 1)
    again = gguf.forward([(7, ids[-1:])])[0]
    assert _close(again, alone)
    gguf.release(7)
    assert gguf.in_use() == 1
    gguf.release(8)
    assert gguf.in_use() == 0


def test_a_rollback_below_another_sequence_changes_nothing_for_it(gguf):
    """Sequence 0's rollback frees the last cell of a 32-cell block below sequence 1's cells:
    sequence 1's next call must still see all of its cells (ik_llama's attention does not
    without `_close_gaps`: its logits came out NaN)."""
    needs_batches(gguf)
    rng = np.random.default_rng(1)
    a, b = ([int(x) for x in rng.integers(100, 3000, n)] for n in (64, 10))
    gguf.forward([(0, a)], last_only=True)
    gguf.forward([(1, b)], last_only=True)
    gguf.truncate(0, 63)
    got = gguf.forward([(1, [5, 6])])[0]
    gguf.release(1)
    want = gguf.forward([(2, [*b, 5, 6])])[0][-2:]
    assert _close(got, want)
    gguf.release(0)
    gguf.release(2)


def _close(a, b) -> bool:
    """Rows of logits that are the same computation, up to the rounding of another call shape
    (the kernels a library picks change with the number of rows: on ik_llama a logit may move
    by ~0.5 between one row and two, so a tolerance on each logit would test the kernels)."""
    return min(float(np.corrcoef(x, y)[0, 1]) for x, y in zip(a, b, strict=True)) > 0.99


def test_a_tree_in_one_call_gives_each_path_its_own_logits(gguf):
    """A tree (root; two children; a grandchild under the first) fed beside another sequence:
    each token's logits are those of its path fed as a chain; `keep` leaves the kept path in
    the cache, `truncate` drops a tree whole. Mainline llama.cpp refuses trees."""
    ids = gguf.tokenizer.encode(TEXT)
    prompt, (r, a, b, c) = ids[:20], ids[20:24]
    parents = [-1, 0, 0, 1]
    if not gguf.trees:
        gguf.forward([(0, prompt)], last_only=True)
        with pytest.raises(ValueError, match="no token trees"):
            gguf.forward([(0, [r, a, b, c])], trees=[parents])
        assert gguf.length(0) == 20
        gguf.release(0)
        return
    gguf.forward([(0, prompt)], last_only=True)
    chain_ac = gguf.forward([(0, [r, a, c, 7])])[0]
    gguf.truncate(0, 20)
    chain_b = gguf.forward([(0, [r, b])])[0]
    gguf.truncate(0, 20)
    batch, trees = [(0, [r, a, b, c])], [parents]
    if gguf.max_sequences > 1:
        gguf.forward([(1, ids[::-1][:10])], last_only=True)
        batch, trees = [(1, [5]), *batch], [None, parents]
    tree = gguf.forward(batch, trees=trees)[-1]
    assert tree.shape == (4, gguf.vocab_size)
    assert _close(tree[[0, 1, 3]], chain_ac[:3]) and _close(tree[2:3], chain_b[1:2])
    with pytest.raises(ValueError, match="holds a tree"):
        gguf.forward([(0, [1])])
    with pytest.raises(ValueError, match="no path"):
        gguf.keep(0, [0, 2, 3])
    gguf.keep(0, [0, 1, 3])  # r a c: the next token sees exactly them
    assert gguf.length(0) == 23
    assert _close(gguf.forward([(0, [7])])[0], chain_ac[3:])
    gguf.truncate(0, 20)
    gguf.forward([(0, [r, a, b, c])], trees=[parents])
    gguf.truncate(0, 20)  # the tree goes, and the chain after the prompt is as before
    assert _close(gguf.forward([(0, [r, b])])[0], chain_b)
    with pytest.raises(ValueError, match="parent"):
        gguf.forward([(0, [1, 2])], trees=[[-1, 1]])
    assert gguf.length(0) == 22
    gguf.release(0)
    gguf.release(1)


def _after_trees(lm, n0: int, trees, probe: int) -> tuple[np.ndarray, np.ndarray]:
    """Feed n0 tokens, then each (parents, path) tree with `keep(path)`, then `probe` tokens;
    return the probe's logits and those of the same tokens fed as one chain after a truncate."""
    rng = np.random.default_rng(0)
    ids = [int(x) for x in rng.integers(100, 3000, n0)]
    lm.forward([(0, ids)], last_only=True)
    for parents, path in trees:
        tokens = [int(x) for x in rng.integers(100, 3000, len(parents))]
        lm.forward([(0, tokens)], trees=[parents])
        lm.keep(0, path)
        ids += [tokens[j] for j in path]
    got = lm.forward([(0, [7] * probe)])[0]
    lm.truncate(0, n0)
    want = lm.forward([(0, ids[n0:] + [7] * probe)])[0][-probe:]
    lm.release(0)
    return got, want


def test_a_kept_branch_leaves_the_cache_as_a_chain_would(gguf, gguf_cls, gguf_path):
    """Keeping a tree's second branch frees cells between the kept ones; ik_llama's attention
    goes wrong over such gaps in a cache of a few hundred cells unless they are closed
    (`IkLlamaLM._close_gaps`). Both shapes that showed it."""
    if not gguf.trees:
        pytest.skip(f"{gguf.backend} takes no trees")
    second = ([-1, 0, 0, 1, 2, 3, 4], [0, 2, 4, 6])  # two chains of three: keep the second
    got, want = _after_trees(gguf, 218, [second], 7)
    assert _close(got, want)
    alone = gguf_cls(gguf_path, context_length=512, max_sequences=1)  # flash attention, if any
    if not alone.trees:  # ik_llama with flash attention takes none (the test after this one)
        return
    third = ([-1, 0, 0, 0, 3, 4, 1], [0, 3])  # keep the third child, then a tree kept at its root
    got, want = _after_trees(alone, 319, [third, ([-1, 0, 0, 0, 1, 1, 2], [0])], 1)
    assert _close(got, want)


@pytest.mark.parametrize("slots", [1, 4])
def test_a_tree_across_a_block_of_128_cells_gives_each_path_its_own_logits(
    gguf_cls, gguf_path, slots
):
    """A tree whose cells straddle a multiple of 128 (a root and three children, the root at
    cells 126 and 127): each row must be its path's, as a chain of the same tokens gives it.
    ik_llama's flash attention computed such rows from the wrong cells (logits 9-17 apart on
    the 1.5B target), so a context with flash attention (one sequence) takes no trees."""
    lm = gguf_cls(gguf_path, context_length=512, max_sequences=slots)
    if not lm.trees:
        pytest.skip(f"{lm.backend} takes no trees with {slots} sequence(s) here")
    rng = np.random.default_rng(3)
    ids = [int(x) for x in rng.integers(100, 3000, 140)]
    parents, leaves = [-1, 0, 0, 0], [int(x) for x in rng.integers(100, 3000, 3)]
    for root in (126, 127):
        lm.forward([(0, ids[:root])], last_only=True)
        got = lm.forward([(0, [ids[root], *leaves])], trees=[parents])[0]
        lm.release(0)
        for i, leaf in enumerate(leaves, start=1):
            lm.forward([(0, ids[:root])], last_only=True)
            want = lm.forward([(0, [ids[root], leaf])])[0]
            lm.release(0)
            assert _close(got[[0, i]], want), (root, i)
    lm.close()


def test_a_release_moves_the_highest_sequence_down_with_its_cache(smollm2_path):
    lm = LlamaCppLM(smollm2_path, context_length=128, max_sequences=3)
    ids = lm.tokenizer.encode(TEXT)
    a, b, c = ids[:10], list(reversed(ids))[:12], ids[3:20]
    b_last = [lm.forward([(q, t)], last_only=True)[0] for q, t in ((0, a), (1, b), (2, c))][1]
    before = lm.forward([(2, ids[20:24])])[0]
    lm.truncate(2, len(c))
    lm.release(1)  # sequence 2 moves from slot 2 to slot 1
    assert lm.passes([(0, 1), (2, 1)]) == [(2, 1)]
    # a new sequence fills slot 2 before sequence 2 runs again: the copy must come first
    np.testing.assert_allclose(lm.forward([(3, b)], last_only=True)[0], b_last, atol=1e-3)
    after = lm.forward([(2, ids[20:24])])[0]
    np.testing.assert_allclose(after, before, atol=1e-3)
    assert (after.argmax(-1) == before.argmax(-1)).all()
    lm.close()


def test_long_prompt_is_split_over_calls(gguf_cls, gguf_path):
    lm = gguf_cls(gguf_path, context_length=256, n_batch=32)
    ids = (lm.tokenizer.encode(TEXT) * 5)[:100]
    chunked = lm.forward([(0, ids)])[0]
    assert chunked.shape[0] == 100
    lm.release(0)
    whole = gguf_cls(gguf_path, context_length=256).forward([(0, ids)])[0]
    assert (chunked.argmax(-1) == whole.argmax(-1)).mean() >= 0.95


def test_context_and_slot_errors(gguf_cls, gguf_path):
    lm = gguf_cls(gguf_path, context_length=64, max_sequences=1)
    with pytest.raises(ValueError, match="context holds 64"):
        lm.forward([(0, [1] * 65)])
    lm.forward([(0, [1, 2])])
    with pytest.raises(RuntimeError, match="sequence slots"):
        lm.forward([(1, [1, 2])])
    lm.release(0)
    assert lm.forward([(1, [1, 2])])[0].shape[0] == 2  # the slot was freed


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "self", "requantized"])
@pytest.mark.parametrize("k", [2, 4])
def test_greedy_speculative_equals_plain(gguf, gguf_cls, gguf_path, gguf_noise, drafter, k):
    prompt = gguf.tokenizer.encode("The numbers from 1 to 30: 1, 2, 3, 4,")
    params = SamplingParams(max_tokens=48)
    want = plain_decode(gguf, prompt, params)
    assert len(want) >= 30  # a real answer, not an early end that every drafter would match
    if drafter == "ngram":
        d = NgramDrafter()
    elif drafter == "suffix":  # trees where the backend takes them: ", " goes on several ways
        d = SuffixDrafter(scope="request")
    elif drafter == "self":  # the same weights in a second instance: it keeps its own caches
        d = ModelDrafter(gguf_cls(gguf_path, context_length=512, max_sequences=1))
    else:  # the model requantized to Q4_0 (`backends.requant`): other drafts, the same output
        d = ModelDrafter(gguf_cls(derive(gguf_path, "q4_0"), context_length=512, max_sequences=1))
    got = Engine(gguf, d, k=k).generate(prompt, params)
    assert gguf.trees == any(r.depth is not None for r in got.rounds) or drafter != "suffix"
    # llama.cpp may round a k+1-token forward differently from single-token ones: the outputs
    # are identical, or part where plain's top-2 gap is within the kernels' measured noise
    # (as the bench judges a divergence; Gemma 3's numbers on a native ik_llama build do).
    near_tie = NEAR_TIE_FACTOR * gguf_noise["top2_gap"]
    parted = greedy_divergence(gguf, prompt, want, got.tokens, near_tie)
    assert parted["match"] or parted["near_tie"], parted


def test_bad_files_get_one_clear_error(gguf_cls, tmp_path, gguf_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gguf_cls(missing)
    notgguf = tmp_path / "x.gguf"
    notgguf.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_cls(notgguf)
    truncated = tmp_path / "t.gguf"
    truncated.write_bytes(gguf_path.read_bytes()[:20_000_000])
    with pytest.raises(ValueError, match="could not load"):
        gguf_cls(truncated)


def test_agrees_with_the_torch_backend_on_the_same_file(smollm2, smollm2_path):
    """transformers dequantizes the same GGUF to float32; llama.cpp runs it quantized. Their
    tokenizers must agree exactly and their next-token choices almost everywhere."""
    from specwise.backends.torch_hf import TorchLM

    ref = TorchLM(smollm2_path)
    ids = smollm2.tokenizer.encode(TEXT, add_special=False)
    assert ref.tokenizer.encode(TEXT, add_special=False) == ids
    a = smollm2.forward([(0, ids)])[0]
    b = ref.forward([(0, ids)])[0]
    smollm2.release(0)
    assert a.shape == b.shape
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.9
    corr = [np.corrcoef(x, y)[0, 1] for x, y in zip(a, b, strict=True)]
    assert min(corr) > 0.98, corr


def test_on_own_thread_runs_on_a_thread_that_ends_and_hands_back_its_result_or_error():
    """`on_own_thread` (where `specwise serve` loads and measures its models, so that the main
    thread keeps no OpenMP pool beside the scheduler's): fn runs off the caller's thread, on a
    thread that has ended by the time it returns, and its value or exception comes back."""
    import threading

    from specwise.backends.llama_lib import on_own_thread

    seen = []
    assert on_own_thread(lambda: seen.append(threading.current_thread()) or 7) == 7
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()

    def fail():
        raise ValueError("--target 'x' is unknown")

    with pytest.raises(ValueError, match="--target 'x' is unknown"):
        on_own_thread(fail)
