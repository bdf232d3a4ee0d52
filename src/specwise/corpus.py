"""The local corpus a drafter's training data is read from: documents that ship with this
machine's software, cut into chunks and framed as chat answers, none of them a bench prompt's.

Sources (`SOURCES`; each yields `Document`s in a fixed order, and a machine that lacks one
simply has none of it; `makeup` counts what was found):
- `python`: the standard library's and the installed packages' modules (code and docstrings;
  no test folders);
- `rust`: the Rust toolchain's books (the book, the reference, Rust by Example, the Cargo
  book, ...), their HTML as text with the code blocks fenced;
- `c`: the C headers under /usr/include;
- `javascript`: the JavaScript of the Node.js packages on the machine;
- `man`: the manual pages, in English (`man`) and in the other languages installed
  (`man-intl`: German, French, Spanish, ...), their troff as text.

`chunks` cuts documents into pieces of at most `CHUNK_TOKENS` target tokens at line ends, drops
any that shares a run of `SHINGLE` words with a shipped bench prompt (the HumanEval problems
included) and frames each as the answer of a chat turn that asks for it (`Chunk.messages`); a
document whose name hashes into `HELD_OUT` of 100 is held out (scored, never trained on), so
no document lies on both sides. `mix` interleaves the sources by weight. (The asks a target
answers by decoding are `specwise.asks`'.)

This module reads files and tokenizes; it runs no model.
"""

from __future__ import annotations

import gzip
import hashlib
import html.parser
import random
import re
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CHUNK_TOKENS",
    "HELD_OUT",
    "SHINGLE",
    "SOURCES",
    "WEIGHTS",
    "Chunk",
    "Document",
    "bench_shingles",
    "chunks",
    "held_out",
    "makeup",
    "mix",
    "shingles",
]

SHINGLE = 8  # words in a run that marks a text as a bench prompt's
CHUNK_TOKENS = 960  # most target tokens of one chunk (its chat framing adds ~40)
HELD_OUT = 5  # of every 100 documents (by name) held out
@dataclass(frozen=True)
class Document:
    source: str  # a key of SOURCES
    name: str  # where it came from (a path, relative where it can be)
    title: str  # what the framing ask names
    text: str
    language: str  # of its code ("python", "rust", ...) or "text"


@dataclass(frozen=True)
class Chunk:
    document: Document
    index: int  # the chunk's place in its document
    text: str

    @property
    def held_out(self) -> bool:
        return held_out(self.document.name)

    def messages(self) -> list[dict[str, str]]:
        """The chat turn whose answer the chunk is: [user ask] (the answer is the text)."""
        d = self.document
        pick = int(hashlib.sha256(f"{d.name}:{self.index}".encode()).hexdigest()[:8], 16)
        if d.language == "text":
            asks = (
                "Write the documentation section \"{t}\".",
                "Explain {t}.",
                "Write the manual text for {t}.",
            )
        else:
            asks = (
                "Write the {lang} source file `{t}`.",
                "Show me the {lang} code of `{t}`.",
                "Implement `{t}` in {lang}.",
            )
        lang = {"python": "Python", "c": "C", "javascript": "JavaScript"}.get(
            d.language, d.language
        )
        ask = asks[pick % len(asks)].format(t=d.title, lang=lang)
        if self.index:
            ask += " Continue from part " + str(self.index + 1) + "."
        return [{"role": "user", "content": ask}]


def held_out(name: str) -> bool:
    """Whether the document called `name` is held out (`HELD_OUT` of every 100, by hash)."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 100 < HELD_OUT


def _words(text: str) -> list[str]:
    return text.lower().split()


def shingles(text: str) -> set[tuple[str, ...]]:
    """The runs of SHINGLE words of a text (lower case)."""
    w = _words(text)
    return {tuple(w[i : i + SHINGLE]) for i in range(max(0, len(w) - SHINGLE + 1))}


def bench_shingles() -> set[tuple[str, ...]]:
    """The runs of SHINGLE words of every shipped bench prompt and HumanEval problem."""
    from specwise.prompts import humaneval_problems, shipped

    out: set[tuple[str, ...]] = set()
    for p in shipped():
        for turn in p.turns:
            out |= shingles(turn)
    for problem in humaneval_problems().values():
        out |= shingles(problem["prompt"])
    return out


# -- sources -------------------------------------------------------------------------------
def _files(root: Path, pattern: str, skip: Sequence[str] = ()) -> list[Path]:
    if not root.is_dir():
        return []
    skip = {"test", "tests", "testing", "__pycache__", *skip}
    return sorted(p for p in root.rglob(pattern) if p.is_file() and not skip & set(p.parts))


def _read(path: Path) -> str | None:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def python_documents() -> Iterator[Document]:
    """The standard library's modules, then the installed packages' (what parses)."""
    paths = sysconfig.get_paths()
    stdlib, site = Path(paths["stdlib"]), Path(paths["purelib"])
    roots = [(stdlib, ("site-packages", "idlelib", "lib2to3")), (site, ("specwise",))]
    for root, skip in roots:
        for path in _files(root, "*.py", skip):
            text = _read(path)
            if not text or len(text) < 200:
                continue
            rel = path.relative_to(root).as_posix()
            yield Document("python", rel, rel, text, "python")


class _Html(html.parser.HTMLParser):
    """The text of an mdBook page's <main>: paragraphs, headings, lists and fenced code."""

    SKIP = frozenset({"script", "style", "nav", "button", "head"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.depth = 0  # inside <main>
        self.skip = 0
        self.pre = False
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        if tag == "main":
            self.depth += 1
        if tag in self.SKIP:
            self.skip += 1
        if tag == "title":
            self._in_title = True
        if not self.depth or self.skip:
            return
        if tag == "pre":
            self.pre = True
            lang = next((c[9:] for _, c in attrs if c and c.startswith("language-")), "")
            self.out.append(f"\n```{lang}\n")
        elif tag in ("p", "div", "br", "tr"):
            self.out.append("\n")
        elif tag in ("h1", "h2", "h3", "h4"):
            self.out.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag == "li":
            self.out.append("\n- ")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        if tag == "title":
            self._in_title = False
        if tag == "main":
            self.depth = max(0, self.depth - 1)
        if self.depth and not self.skip and tag == "pre":
            self.pre = False
            self.out.append("\n```\n")
        elif self.depth and tag in ("p", "h1", "h2", "h3", "h4"):
            self.out.append("\n")

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        if self.depth and not self.skip:
            self.out.append(data if self.pre else re.sub(r"\s+", " ", data))

    def text(self) -> str:
        return re.sub(r"\n{3,}", "\n\n", "".join(self.out)).strip()


def rust_documents() -> Iterator[Document]:
    """The Rust toolchain's books (mdBook HTML under its share/doc/rust/html)."""
    import shutil
    import subprocess

    rustc = shutil.which("rustc")
    if rustc is None:
        return
    try:
        root = subprocess.run(
            [rustc, "--print", "sysroot"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return
    html_root = Path(root) / "share" / "doc" / "rust" / "html"
    books = ("book", "reference", "rust-by-example", "cargo", "nomicon", "edition-guide",
             "embedded-book", "rustc", "rustdoc", "style-guide", "unstable-book")
    for book in books:
        for path in _files(html_root / book, "*.html", ("print.html",)):
            if path.name in ("print.html", "404.html", "toc.html"):
                continue
            raw = _read(path)
            if not raw:
                continue
            parser = _Html()
            try:
                parser.feed(raw)
            except Exception:  # a page html.parser cannot read: skipped
                continue
            text = parser.text()
            if len(text) < 400:
                continue
            first = re.search(r"^#+ (.+)$", text, re.M)
            title = first.group(1).strip() if first else path.stem
            yield Document("rust", f"{book}/{path.relative_to(html_root / book)}", title,
                           text, "text")


def c_documents() -> Iterator[Document]:
    for path in _files(Path("/usr/include"), "*.h"):
        text = _read(path)
        if text and len(text) >= 400:
            rel = path.relative_to("/usr/include").as_posix()
            yield Document("c", rel, rel, text, "c")


def javascript_documents() -> Iterator[Document]:
    roots = [Path("/usr/lib/node_modules"), Path("/usr/local/lib/node_modules"),
             Path("/usr/share/nodejs")]
    for root in roots:
        for path in _files(root, "*.js", ("dist", "min")):
            if path.name.endswith(".min.js"):
                continue
            text = _read(path)
            if text and len(text) >= 400 and max(map(len, text.splitlines()), default=0) < 400:
                rel = path.relative_to(root).as_posix()
                yield Document("javascript", rel, rel, text, "javascript")


_TROFF_ESCAPES = [
    (re.compile(r"\\f[BIRPC]|\\f\(..|\\f\[[^\]]*\]"), ""),
    (re.compile(r"\\\((em|en)"), "-"),
    (re.compile(r"\\\(aq"), "'"),
    (re.compile(r"\\\((lq|rq|dq)"), '"'),
    (re.compile(r"\\\(..|\\\[[^\]]*\]"), ""),
    (re.compile(r"\\[-e]"), lambda m: "-" if m.group(0) == "\\-" else "\\"),
    (re.compile(r"\\[&|^~ 0c]"), ""),
    (re.compile(r"\\\*\(..|\\\*."), ""),
    (re.compile(r"\\s[-+]?\d"), ""),
]


def troff_text(source: str) -> tuple[str, str]:
    """(title, text) of a manual page's troff source: sections as headings, paragraphs
    joined, font and character escapes dropped, other requests dropped."""
    out: list[str] = []
    title = ""
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].split(None, 1)
            req, arg = (parts[0], parts[1] if len(parts) > 1 else "") if parts else ("", "")
            arg = arg.strip().strip('"')
            if req == "TH" and not title:
                title = arg.split()[0].strip('"').lower() if arg else ""
            elif req in ("SH", "SS"):
                out.append("\n\n## " + arg + "\n")
            elif req in ("PP", "P", "LP", "TP", "sp", "br"):
                out.append("\n")
            elif req in ("IP",):
                out.append("\n- ")
            elif req in ("B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "SM", "SB"):
                out.append(arg.replace('" "', "").replace('"', "") + " ")
            continue
        out.append(line + ("\n" if line.endswith(".") else " "))
    text = "".join(out)
    for pattern, repl in _TROFF_ESCAPES:
        text = pattern.sub(repl, text)
    text = re.sub(r"[ \t]+", " ", text)
    return title, re.sub(r"\n\s*\n\s*\n+", "\n\n", text).strip()


def _man_documents(root: Path, languages: Callable[[str], bool], source: str):
    if not root.is_dir():
        return
    for lang_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        lang = "en" if lang_dir.name.startswith("man") else lang_dir.name
        if not languages(lang):
            continue
        sections = [lang_dir] if lang == "en" else sorted(lang_dir.glob("man*"))
        for section in sections:
            for path in sorted(section.glob("*")):
                raw = _read(path) if path.is_file() else None
                if not raw or raw.startswith(".so "):
                    continue
                title, text = troff_text(raw)
                if len(text) >= 400:
                    rel = path.relative_to(root).as_posix()
                    yield Document(source, rel, title or path.name.split(".")[0], text, "text")


def man_documents() -> Iterator[Document]:
    yield from _man_documents(Path("/usr/share/man"), lambda lang: lang == "en", "man")


def man_intl_documents() -> Iterator[Document]:
    yield from _man_documents(Path("/usr/share/man"), lambda lang: lang != "en", "man-intl")


SOURCES: dict[str, Callable[[], Iterator[Document]]] = {
    "python": python_documents,
    "rust": rust_documents,
    "c": c_documents,
    "javascript": javascript_documents,
    "man": man_documents,
    "man-intl": man_intl_documents,
}
# The share of the read corpus' positions each source gets (renormalised over those found).
WEIGHTS = {"python": 0.35, "rust": 0.2, "c": 0.1, "javascript": 0.15, "man": 0.1, "man-intl": 0.1}


# -- chunks --------------------------------------------------------------------------------
def chunks(
    documents: Iterator[Document],
    count: Callable[[str], int],
    banned: set[tuple[str, ...]],
    limit: int = CHUNK_TOKENS,
) -> Iterator[Chunk]:
    """Each document cut at line ends into pieces of at most `limit` tokens (`count`: a
    text's number of target tokens; a single longer line is cut by characters), skipping
    pieces that share a run of SHINGLE words with `banned`."""
    for doc in documents:
        piece: list[str] = []
        size = index = 0
        lines = doc.text.splitlines(keepends=True)
        for line in lines:
            n = count(line)
            while n > limit:  # one long line: cut by characters
                cut = max(1, len(line) * limit // (2 * n))
                lines_part, line = line[:cut], line[cut:]
                n = count(line)
                piece.append(lines_part)
                size += limit // 2
            if size + n > limit and piece:
                text = "".join(piece)
                if not shingles(text) & banned:
                    yield Chunk(doc, index, text)
                index += 1
                piece, size = [], 0
            piece.append(line)
            size += n
        text = "".join(piece)
        if text.strip() and not shingles(text) & banned:
            yield Chunk(doc, index, text)


def mix(
    sources: dict[str, Callable[[], Iterator[Document]]] | None = None,
    weights: dict[str, float] | None = None,
    seed: int = 0,
) -> Iterator[Document]:
    """Documents of every source, interleaved so that each source's share of the documents
    drawn follows `weights` (its documents shuffled by `seed` within a window of 256, so a
    source is not read in directory order); stops when every source has run out."""
    sources = SOURCES if sources is None else sources
    weights = WEIGHTS if weights is None else weights
    rng = random.Random(seed)
    streams = {name: _shuffled(make(), rng) for name, make in sources.items()}
    drawn = dict.fromkeys(streams, 0.0)
    while streams:
        total = sum(weights.get(n, 0.0) for n in streams) or 1.0
        # the source furthest behind its share
        name = min(streams, key=lambda n: drawn[n] - weights.get(n, 0.0) / total * sum(
            drawn.values()))
        try:
            doc = next(streams[name])
        except StopIteration:
            del streams[name]
            continue
        drawn[name] += len(doc.text)
        yield doc


def _shuffled(docs: Iterator[Document], rng: random.Random, window: int = 256):
    buf: list[Document] = []
    for d in docs:
        buf.append(d)
        if len(buf) >= window:
            yield buf.pop(rng.randrange(len(buf)))
    rng.shuffle(buf)
    yield from buf


def makeup(
    counts: dict[str, int] | None = None,
) -> dict[str, dict[str, int]]:
    """What each source holds on this machine: documents and characters (slow: reads them
    all); with `counts` (source -> positions read), those too."""
    out = {}
    for name, make in SOURCES.items():
        docs = chars = 0
        for d in make():
            docs += 1
            chars += len(d.text)
        out[name] = {"documents": docs, "characters": chars}
        if counts is not None:
            out[name]["positions"] = counts.get(name, 0)
    return out
