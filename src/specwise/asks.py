"""The asks a target answers by decoding for its drafters' training data (`teacher.answer`,
`distill`): none of them shares a run of `corpus.SHINGLE` words with a shipped bench prompt.

- **templated** (`prompts`): `code_prompts` about the standard library's functions (written,
  explained, refactored, tested, translated; in Python and the languages of `LANGUAGES`) and
  general ones over the corpus' prose (`GENERAL`: summaries, translations, explanations,
  stories) and arithmetic templates;
- **invented** (`inventions`, `invented_asks`): the target itself writes, about a subject of
  `TOPICS`, either a numbered list of users' asks (questions, requests for code, word problems,
  requests for stories and poems), each line then an ask, or a text (an email, a message, a
  function) that an ask is then about (summarize it, translate it, take its details as JSON,
  explain or edit the code):
  the kinds of `INVENT`. Its wording, subjects and texts vary as no template does.

`SHIFTED` is a way of asking that training never uses (`bench adapt`'s workload).

This module makes text; it runs no model.
"""

from __future__ import annotations

import ast
import random
import re
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from specwise.corpus import bench_shingles, man_documents, rust_documents, shingles

__all__ = [
    "ASKS",
    "GENERAL",
    "HUMAN",
    "INVENT",
    "LANGUAGES",
    "SHIFTED",
    "TOPICS",
    "code_prompts",
    "invented_asks",
    "inventions",
    "prompts",
]

# The languages other than Python that the code asks name (`{lang}`, one drawn per prompt):
# the target writes the answers, so the data holds them although the corpus is Python.
LANGUAGES = ("JavaScript", "TypeScript", "Go", "Rust", "Java", "C++")
ASKS = (
    "Write a Python function `{name}{sig}` that does the following: {doc}\n"
    "Include type hints and a docstring.",
    "Explain what this Python function does, step by step:\n```python\n{src}\n```",
    "Refactor this function for readability without changing its behaviour, and add type "
    "hints:\n```python\n{src}\n```",
    "Write pytest unit tests for this function:\n```python\n{src}\n```",
    "Summarize this documentation in two or three sentences:\n\n{doc}",
    "Write a {lang} function named `{name}` that does the following: {doc}",
    "Translate this Python function to idiomatic {lang}:\n```python\n{src}\n```",
)
# A way of asking that training never uses, in a language it never names: the workload on
# which `bench adapt` measures how a drafter adapts to traffic it was not trained for.
SHIFTED = (
    "Rewrite this Python function in Ruby, with the same behaviour and a comment that "
    "documents it:\n```python\n{src}\n```",
)
# General asks over a paragraph of the corpus' prose (`{text}`), a topic (`{topic}`: a
# heading) or a language of `HUMAN`.
HUMAN = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch")
GENERAL = (
    "Summarize the following text in a few sentences:\n\n{text}",
    "Translate the following text from English to {human}:\n\n{text}",
    "Explain {topic} to a beginner, with an example.",
    "Write a short story in which a character has to deal with {topic}.",
    "Write a poem about {topic}.",
    "What are the most common mistakes people make with {topic}, and how can they be avoided?",
    "Rewrite the following text so that it is easier to read, keeping its meaning:\n\n{text}",
)


REDRAWS = 20  # draws of an invention prompt before a repeat is taken (a kind's are all used)

# Subjects of the invented asks (`{topic}`): everyday life, work, study and hobbies.
TOPICS = (
    "a neighbourhood bakery", "renting a first flat", "a school science fair", "training for a "
    "half marathon", "a leaking kitchen tap", "a family reunion", "saving for a holiday",
    "a book club", "learning to play the guitar", "a delayed train", "a small online shop",
    "keeping chickens", "a job interview", "a power cut", "planning a wedding", "a lost cat",
    "a community garden", "moving to another country", "a broken laptop", "a football club",
    "a dentist's appointment", "recycling at the office", "a road trip", "a birthday party",
    "a weather station", "a museum visit", "a hotel booking", "a library's opening hours",
    "a coffee machine", "a hiking trail", "a music festival", "a chess tournament",
    "a car that will not start", "a yoga class", "a new smartphone", "a vegetable soup",
    "a house move", "a team meeting", "a cycling commute", "an invoice that was paid twice",
    "a stamp collection", "a rainy weekend", "a noisy neighbour", "a first day at university",
    "a parking fine", "a bee hive", "a charity run", "a sourdough starter", "a night sky",
    "a fishing trip", "an electricity bill", "a language exchange", "a volunteer shift",
    "a sports injury", "a home office", "a camping stove", "a pottery class", "a flight "
    "cancellation", "a bus timetable", "a photography walk", "a warehouse inventory",
    "a restaurant reservation", "a plumbing emergency", "an old family recipe", "a marathon "
    "of board games", "a classroom timetable", "a conference talk", "a customer complaint",
    "a bike repair shop", "a tenants' meeting", "a city marathon", "a spreadsheet of "
    "expenses", "a mountain hut", "a train ticket refund", "a public swimming pool",
    "a dog's training", "a solar panel", "a podcast", "a film night", "a houseplant",
    "a river clean-up", "a bank transfer", "a student loan", "a farmers' market",
    "a software release", "a hospital visit", "a town's history", "a winter storm",
    "a language course", "a second-hand bookshop", "a package that never arrived",
    "a school trip", "a startup's first hire", "a tax return", "an apartment's heating",
)
_LIST = " Number them 1 to 3, one a line, nothing else: do not answer them."
# The kinds of ask the target invents (`inventions`; `{topic}` of TOPICS, `{lang}` Python or of
# LANGUAGES): kind -> (the invention prompt, the ways an ask wraps its reply). A kind with no
# ways asks for a numbered list whose lines are asks; the others ask for a text (an email, a
# message, code) that an ask of theirs is about (`{text}`; `{human}` of HUMAN).
INVENT: dict[str, tuple[str, tuple[str, ...]]] = {
    "chat": ("Write three different questions that people ask an assistant about {topic}, "
             "each with a sentence about their own situation." + _LIST, ()),
    "code_generation": (
        "Write three different requests that a user might send to a programming assistant, "
        "each asking for a {lang} function or small program to do with {topic}, with the "
        "details a real user gives (inputs, outputs, edge cases)." + _LIST, ()),
    "math": ("Write three different word problems about {topic}, each taking two or three "
             "steps of arithmetic or algebra and asking for the reasoning step by step." + _LIST,
             ()),
    "creative": ("Write three different requests for a short story or a poem about {topic}, "
                 "each with two or three wishes (a character, a setting, a tone or a form)."
                 + _LIST, ()),
    "summarization": (
        "Write an email, a memo or a short news article of about 150 words about {topic}. "
        "Reply with the text only.",
        ("Summarize the following text in a few sentences:\n\n{text}",
         "{text}\n\nCan you summarize this for me in two or three sentences?",
         "Give me the key points of this as a short bulleted list:\n\n{text}",
         "Write a one-paragraph summary of this for a busy colleague.\n\n{text}")),
    "translation": (
        "Write a short, friendly message of about 80 words about {topic}. Reply with the "
        "message only.",
        ("Translate the following text from English to {human}:\n\n{text}",
         "Please translate this message into {human}, keeping its tone.\n\n{text}",
         "{text}\n\nTranslate the message above into {human}.")),
    "extraction": (
        "Write an email of about 120 words from a customer to a company about {topic}: their "
        "name, company, email address, phone number, city and what they ask for. Reply with "
        "the email only.",
        ("Extract the contact details from the email below as JSON with the keys \"name\", "
         "\"company\", \"email\", \"phone\", \"city\" and \"request\" (one sentence). Use "
         "null for anything it does not say. Reply with the JSON only.\n\nEmail:\n{text}",
         "List the sender's name, phone number and request from this message as JSON, and "
         "nothing else:\n\n{text}")),
    "code_explanation": (
        "Write a short {lang} function (8 to 20 lines) to do with {topic}. Reply with the "
        "code only, in a code block.",
        ("Explain step by step what this code does:\n\n{text}",
         "{text}\n\nWhat does this function do? Walk me through it with an example input.",
         "Explain this code to a beginner, and state its time complexity.\n\n{text}")),
    "code_editing": (
        "Write a short {lang} function (10 to 25 lines) to do with {topic}. Reply with the "
        "code only, in a code block.",
        ("Add error handling for invalid input to this code. Return the full modified "
         "code.\n\n{text}",
         "Rename the variables in this code to clearer names and change nothing else. Return "
         "the full code.\n\n{text}",
         "{text}\n\nAdd comments and a docstring to this function, without changing its "
         "behaviour.",
         "Refactor this code for readability, keeping its behaviour:\n\n{text}")),
}
# A reply's opening that is the target's, not the user's: "Sure! Here are three:" and the like.
_PREAMBLE = re.compile(
    r"^\s*(?:sure|certainly|of course|here(?:'s| is| are))\b[^\n]*:\s*\n", re.IGNORECASE
)
_ITEM = re.compile(r"^\s*\d+[.)]\s+(.+?)\s*$")


def inventions(limit: int, seed: int = 0) -> list[tuple[str, str]]:
    """`limit` (kind, prompt) pairs, each asking the target to invent for a kind of INVENT (the
    kinds in turn, those that make one ask a reply twice as often as those that make a list)
    about a subject of TOPICS, in Python or a language of LANGUAGES, drawn by `seed`. A prompt
    drawn before is drawn again (up to REDRAWS times): a greedy answer to it would repeat one."""
    rng = random.Random(seed)
    turn = [k for k, (_, ways) in INVENT.items() for _ in range(2 if ways else 1)]
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i in range(limit):
        kind = turn[i % len(turn)]
        for _ in range(REDRAWS + 1):
            lang = rng.choice(("Python",) * len(LANGUAGES) + LANGUAGES)
            prompt = INVENT[kind][0].format(topic=rng.choice(TOPICS), lang=lang)
            if prompt not in seen:
                break
        seen.add(prompt)
        out.append((kind, prompt))
    return out


def invented_asks(
    kind: str, reply: str, index: int, banned: set[tuple[str, ...]] | None = None
) -> list[str]:
    """The asks made of the target's `reply` to invention `index` of `kind`: each numbered line
    of a list kind's (of at least 6 words), or the reply (its opening "Sure, here is ..." cut;
    at least 20 words) in a way of the kind's asking drawn by `index`. None shares a run of
    SHINGLE words with a bench prompt (`banned`, default `corpus.bench_shingles()`)."""
    banned = bench_shingles() if banned is None else banned
    ways = INVENT[kind][1]
    text = _PREAMBLE.sub("", reply.strip(), count=1).strip()
    if ways:
        rng = random.Random(index)
        way, human = rng.choice(ways), rng.choice(HUMAN)
        found = [way.format(text=text, human=human)] if len(text.split()) >= 20 else []
    else:
        found = [m.group(1).strip("*\"' ") for line in text.splitlines()
                 if (m := _ITEM.match(line))]
        found = [ask for ask in found if len(ask.split()) >= 6]
    return [ask for ask in found if not shingles(ask) & banned]


# a source's lines as `ast.get_source_segment` cuts them: at \r\n, \r or \n, each kept
_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def source_segment(lines: list[str], node: ast.AST) -> str:
    """`ast.get_source_segment(source, node)` from the source's lines (`_LINES`), cut once
    per file: the standard library's splits the whole source again on every call."""
    a, b = node.lineno - 1, node.end_lineno - 1
    if a == b:
        return lines[a].encode()[node.col_offset : node.end_col_offset].decode()
    first = lines[a].encode()[node.col_offset :].decode()
    return "".join([first, *lines[a + 1 : b], lines[b].encode()[: node.end_col_offset].decode()])


def code_prompts(
    limit: int, seed: int = 0, root: Path | None = None, asks: Sequence[str] = ASKS
) -> list[str]:
    """Up to `limit` prompts about functions of the standard library at `root` (this
    interpreter's), each asked one of the ways of `asks` (format strings over the function's
    name, sig, doc and src, and a `lang` of LANGUAGES), shuffled by `seed`; none shares a run
    of SHINGLE words with a bench prompt."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if not any(part in ("test", "tests", "idlelib", "site-packages") for part in p.parts)
    )
    rng = random.Random(seed)
    rng.shuffle(files)
    banned = bench_shingles()
    out: list[str] = []
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = _LINES.findall(source)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            src = source_segment(lines, node)
            if not doc or not src or not 3 <= src.count("\n") <= 40 or len(doc) < 40:
                continue
            sig = f"({ast.unparse(node.args)})"
            ask = asks[rng.randrange(len(asks))]
            lang = LANGUAGES[rng.randrange(len(LANGUAGES))]
            doc = " ".join(doc.split())
            text = ask.format(name=node.name, sig=sig, doc=doc, src=src, lang=lang)
            if shingles(text) & banned:
                continue
            out.append(text)
            if len(out) >= limit:
                return out
    return out


def _paragraphs(limit: int, seed: int) -> list[tuple[str, str]]:
    """(heading, paragraph) pairs of English prose from the corpus (the Rust books and the
    English manual pages): paragraphs of 40 to 160 words with no code."""
    out: list[tuple[str, str]] = []
    for make in (rust_documents, man_documents):
        for doc in make():
            heading = doc.title
            for block in re.split(r"\n\s*\n", doc.text):
                block = block.strip()
                if block.startswith("#"):
                    heading = block.lstrip("# ").split("\n")[0][:80] or heading
                    continue
                words = block.split()
                if 40 <= len(words) <= 160 and "```" not in block and block[0].isalpha():
                    out.append((heading, " ".join(words)))
            if len(out) >= 4 * limit:
                break
    random.Random(seed).shuffle(out)
    return out[:limit]


def _arithmetic(rng: random.Random) -> str:
    """A word problem made from a template and random numbers."""
    things = ["apples", "notebooks", "tickets", "bolts", "plants", "boxes", "cups", "books"]
    a, b = rng.sample(things, 2)
    x, y = rng.randint(2, 40), rng.randint(2, 40)
    p, q = rng.randint(1, 20), rng.randint(1, 20)
    v, t = rng.randint(20, 120), rng.randint(2, 9)
    forms = [
        f"Someone buys {x} {a} at ${p} each and {y} {b} at ${q} each. How much do they pay in "
        f"total? Show the calculation step by step.",
        f"A cyclist rides at {v // 4} km/h for {t} hours, then at {v // 5} km/h for {t + 1} "
        f"hours. What distance does she cover, and what is her average speed? Explain.",
        f"A tank holds {x * 10} litres and loses {p} litres an hour while {q} litres an hour "
        f"flow in. After how many hours is it empty, if ever? Reason step by step.",
        f"Solve for n: {x}n + {p} = {y}n + {q * x}. Show each step and check the answer.",
        f"What is {x}% of {v * 10}, and by what percentage does {v * 10} exceed {v * 8}? "
        f"Explain each calculation.",
    ]
    return forms[rng.randrange(len(forms))]


def prompts(limit: int, seed: int = 0, code_share: float = 0.5) -> list[str]:
    """Up to `limit` asks for the target to answer: `code_share` of them `code_prompts`, the
    rest general ones (`GENERAL` over the corpus' prose, and arithmetic), interleaved; none
    shares a run of SHINGLE words with a bench prompt."""
    rng = random.Random(seed)
    n_code = int(limit * code_share)
    code = code_prompts(n_code, seed=seed)
    banned = bench_shingles()
    general: list[str] = []
    paras = _paragraphs(limit - n_code, seed)
    for i, (heading, text) in enumerate(paras):
        if i % 6 == 5:
            ask = _arithmetic(rng)
        else:
            form = GENERAL[rng.randrange(len(GENERAL))]
            ask = form.format(text=text, topic=heading.strip().rstrip(".:") or "this",
                              human=HUMAN[rng.randrange(len(HUMAN))])
        if not shingles(ask) & banned:
            general.append(ask)
    out: list[str] = []
    for i in range(max(len(code), len(general))):
        out.extend(x[i] for x in (code, general) if i < len(x))
    return out[:limit]

