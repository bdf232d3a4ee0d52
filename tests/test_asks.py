"""The asks a target answers for training data (`specwise.asks`): none shares a bench
prompt's words; code asks name other languages and never the shifted workload's way; the
target's invented asks come in every kind, and its reply is cut to the user's words."""

from __future__ import annotations

from specwise import asks


def test_a_prompt_that_shares_a_bench_prompts_words_is_never_a_training_prompt(tmp_path):
    from specwise.bench.workloads import builtin

    bench = builtin()[0].turns[0]
    words = " ".join(bench.split()[:20])
    (tmp_path / "m.py").write_text(
        "def taken(x):\n"
        f'    """{words}"""\n'
        "    y = x + 1\n    z = y * 2\n    return z\n\n\n"
        "def kept(x):\n"
        '    """Return the square of x, computed the long way round for clarity."""\n'
        "    y = x\n    z = y * x\n    return z\n"
    )
    prompts = asks.code_prompts(limit=10, root=tmp_path)
    assert prompts and all("kept" in p or "square of x" in p for p in prompts)


def test_training_prompts_name_other_languages_and_never_the_shifted_workloads(tmp_path):
    """The target answers asks in the languages of LANGUAGES too; `bench adapt`'s workload asks
    in a way and a language that training never does."""
    body = '    """Return the {} power of x, computed the long way round for clarity."""\n'
    (tmp_path / "m.py").write_text(
        "".join(
            f"def f{i}(x):\n" + body.format(i) + "    y = x\n    z = y * x\n    return z\n\n"
            for i in range(60)
        )
    )
    prompts = asks.code_prompts(limit=60, root=tmp_path)
    named = {lang for lang in asks.LANGUAGES for p in prompts if f" {lang}" in p}
    assert len(prompts) == 60 and len(named) >= 4
    assert any("```python" in p for p in prompts)  # and Python's asks as before
    shifted = asks.code_prompts(limit=60, root=tmp_path, seed=1, asks=asks.SHIFTED)
    assert len(shifted) == 60 and not set(shifted) & set(prompts)
    assert not any(lang in asks.SHIFTED[0] for lang in asks.LANGUAGES)
    assert not set(asks.SHIFTED) & set(asks.ASKS)


def test_inventions_take_the_kinds_in_turn_with_every_field_filled():
    turn = sum(2 if ways else 1 for _, ways in asks.INVENT.values())
    made = asks.inventions(3 * turn, seed=3)
    kinds = [kind for kind, _ in made]
    assert set(kinds) == set(asks.INVENT) and kinds[:turn] == kinds[turn : 2 * turn]
    assert kinds.count("translation") == 2 * kinds.count("chat")  # one ask a reply: twice
    assert all("{" not in text for _, text in made)
    assert made == asks.inventions(3 * turn, seed=3) != asks.inventions(3 * turn, seed=4)
    topics = {t for _, text in asks.inventions(400) for t in asks.TOPICS if t in text}
    assert len(topics) > len(asks.TOPICS) // 2
    # no prompt twice while its kind has new ones (a kind without a language: one per topic)
    made = asks.inventions(1000)
    for kind, (template, _) in asks.INVENT.items():
        drawn = [text for k, text in made if k == kind]
        pool = len(asks.TOPICS) * (len(asks.LANGUAGES) + 1 if "{lang}" in template else 1)
        assert min(len(drawn), pool) - 3 <= len(set(drawn)) <= pool, kind


def test_the_asks_of_a_reply_are_its_numbered_lines_or_the_text_asked_about():
    from specwise.bench.workloads import builtin

    lines = ["How long should a sourdough starter rest before its first bake?",
             "Why does my starter smell of nail polish after a week in the fridge?",
             "Can I feed a starter with rye flour instead of the white flour I use now?"]
    reply = "Sure! Here are three questions:\n\n" + "\n".join(
        f"{n}. {q}" if n != 2 else f"{n}) **{q}**" for n, q in enumerate(lines, 1)
    ) + "\n4. Too short to ask."
    assert asks.invented_asks("chat", reply, 0, banned=set()) == lines
    email = " ".join(["The library opens an hour later on Mondays from next week."] * 3)
    got = asks.invented_asks("summarization", f"Here is the email:\n{email}", 5, banned=set())
    assert len(got) == 1 and email in got[0] and "Here is" not in got[0]
    assert got == asks.invented_asks("summarization", email, 5, banned=set())  # by index
    assert any("{human}" in w for w in asks.INVENT["translation"][1])
    got = asks.invented_asks("translation", email, 1, banned=set())
    assert any(h in got[0] for h in asks.HUMAN) and "{" not in got[0]
    assert asks.invented_asks("summarization", "Too short.", 5, banned=set()) == []
    bench = " ".join(builtin()[0].turns[0].split()[:20])
    assert asks.invented_asks("chat", f"1. Please help. {bench}", 0) == []  # a bench prompt's
    assert asks.invented_asks("chat", f"1. {lines[0]}", 0) == lines[:1]


def test_a_functions_source_is_cut_as_the_standard_library_cuts_it():
    import ast

    source = (
        "def one(x): return 'é' * x\r\n"
        "class K:\r\n    def m(self, ü='ß'):\r\n        '''Dök.'''\r\n        return ü\r\n"
        "def two(a,\r    b):\r    return (a,\n            b)  # 日本\n"
        "x = [one(1), K().m()]"
    )
    lines = asks._LINES.findall(source)
    nodes = [n for n in ast.walk(ast.parse(source)) if hasattr(n, "end_col_offset")]
    assert len(nodes) > 20
    for node in nodes:
        assert asks.source_segment(lines, node) == ast.get_source_segment(source, node)
