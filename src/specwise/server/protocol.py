"""The OpenAI wire format: validating request bodies and building responses and stream chunks.

Every bad request becomes an `ApiError` with an HTTP status and an OpenAI-style body that names
the offending field (`param`). A field that would change what the client gets and that this
server does not implement (tools, a JSON response format, penalties, logit bias; completions'
echo, best_of, suffix) is refused by name rather than ignored; fields that change nothing
(`user`, zero penalties, ...) are accepted, and so are fields the API does not define (at the
top or in a message), which are ignored, as vLLM does (OpenAI's own server refuses them). A
chat message's content is a string or a list of text parts (joined by newlines); a `developer`
message is a system message. Log-probabilities (`logprobs`; chat: `top_logprobs`) are the
model's own at each emitted token (`sampling.token_logprobs`), in the chat or the legacy
completions shape. `speculative` {k, drafter, acceptance} is specwise's own: `acceptance` names
a lossy rule (`lossy`), and every response's `speculative.acceptance` says which rule decided
it ("exact" unless one was asked for). This module holds no model, no queue and no HTTP server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specwise.lossy import EXACT, check_rule
from specwise.sampling import MAX_LOGPROBS, SamplingParams, TokenLogprob

__all__ = ["ApiError", "ParsedRequest", "error_body", "parse"]

MAX_TOKENS_DEFAULT = 256


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = (
            status,
            message,
            param,
            kind,
            code,
        )
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class ParsedRequest:
    chat: bool
    model: str
    prompt: str | None  # completions
    messages: list[dict[str, str]] | None  # chat
    params: SamplingParams
    stream: bool
    include_usage: bool
    continuous_usage: bool  # usage in every chunk (as vLLM's `continuous_usage_stats`)
    k: int | str | None
    drafter: str | None
    acceptance: str = "exact"  # `lossy`: a lossy rule's name, flagged in the response


def _bad(field: str, message: str) -> ApiError:
    return ApiError(400, message, param=field)


def _number(body: dict, field: str, default, kind=float, lo=None, hi=None):
    v = body.get(field, default)
    if v is None:
        return default
    ok = isinstance(v, int | float) and not isinstance(v, bool)
    if kind is int:  # an int, or a float with no fraction; never float(int): it can overflow
        ok = ok and (isinstance(v, int) or v.is_integer())
    if not ok:
        raise _bad(
            field,
            f"'{field}' must be {'an integer' if kind is int else 'a number'}, "
            f"got {type(v).__name__} {v!r}",
        )
    if (lo is not None and v < lo) or (hi is not None and v > hi):  # before float(v), likewise
        raise _bad(field, f"'{field}' = {v!r} is out of range [{lo}, {hi}]")
    return kind(v)


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts ({"type": "text", "text": ...})."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise _bad(f"{where}.content", f"{where}.content must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        field = f"{where}.content[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise _bad(field, f"{field} is of type {kind!r}; this server takes text parts only")
        if not isinstance(part.get("text"), str):
            raise _bad(f"{field}.text", f"{field}.text must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def _refuse_unimplemented(body: dict, chat: bool) -> None:
    """400 for a field that would change the answer and that this server does not implement."""
    if body.get("tools") or body.get("functions"):
        field = "tools" if body.get("tools") else "functions"
        raise _bad(field, f"'{field}' (function calling) is not supported by this server")
    choice = body.get("tool_choice")
    if choice not in (None, "none", "auto"):
        raise _bad("tool_choice", "'tool_choice' cannot name a tool: this server has no tools")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise _bad(
            "response_format",
            "'response_format' other than {'type': 'text'} (JSON mode, a JSON schema) is not "
            "supported by this server",
        )
    for field in ("presence_penalty", "frequency_penalty"):
        if _number(body, field, 0.0, float, -2.0, 2.0) != 0.0:
            raise _bad(field, f"'{field}' other than 0 is not supported by this server")
    if body.get("logit_bias"):
        raise _bad("logit_bias", "'logit_bias' is not supported by this server")
    if not chat:
        if body.get("echo"):
            raise _bad("echo", "'echo' (the prompt in the answer) is not supported by this server")
        if _number(body, "best_of", 1, int, 1, None) != 1:
            raise _bad("best_of", "'best_of' other than 1 is not supported by this server")
        if body.get("suffix"):
            raise _bad("suffix", "'suffix' (insertion) is not supported by this server")


def _logprobs(body: dict, chat: bool) -> int | None:
    """The alternatives each token reports with its log-probability, None for none. Chat:
    `logprobs` true, `top_logprobs` alternatives (0 without); completions: `logprobs` = n."""
    if not chat:
        return _number(body, "logprobs", None, int, 0, MAX_LOGPROBS)
    wanted = body.get("logprobs", False)
    if wanted is not None and not isinstance(wanted, bool):
        raise _bad("logprobs", "'logprobs' must be true or false")
    top = _number(body, "top_logprobs", None, int, 0, MAX_LOGPROBS)
    if top is not None and not wanted:
        raise _bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    return (top or 0) if wanted else None


def parse(body: Any, chat: bool, model_names: list[str]) -> ParsedRequest:
    """Validate a /v1/completions (chat=False) or /v1/chat/completions body."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is None:
        model = model_names[0]
    elif not isinstance(model, str):
        raise _bad("model", f"'model' must be a string, got {type(model).__name__}")
    elif model not in model_names:
        raise ApiError(
            404,
            f"the model {model!r} does not exist; available: {', '.join(model_names)}",
            "model",
            code="model_not_found",
        )
    prompt = messages = None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("messages", "'messages' must be a non-empty list of {role, content} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(
                    f"messages[{i}]", f"messages[{i}] must be an object with a 'role' string"
                )
            if m["role"] not in ROLES:
                raise _bad(
                    f"messages[{i}].role",
                    f"messages[{i}].role {m['role']!r} is not one of {', '.join(ROLES)}",
                )
        messages = [
            {"role": ROLES[m["role"]], "content": _content(m.get("content"), f"messages[{i}]")}
            for i, m in enumerate(messages)
        ]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise _bad("prompt", "'prompt' must be a string (or a list of one string)")
        if not prompt:
            raise _bad("prompt", "'prompt' is empty")
    _refuse_unimplemented(body, chat)
    n = _number(body, "n", 1, int)
    if n != 1:
        raise _bad("n", f"'n' = {n} is not supported; only n = 1")
    max_tokens = _number(body, "max_tokens", None, int, 1, 1 << 20)
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens = _number(body, "max_completion_tokens", None, int, 1, 1 << 20)
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        stop = tuple(stop)
    else:
        raise _bad("stop", "'stop' must be a string or a list of up to 4 strings")
    if any(not s for s in stop):
        raise _bad("stop", "'stop' strings must not be empty")
    seed = body.get("seed")
    if seed is not None:
        seed = _number(body, "seed", None, int, 0, 2**63 - 1)
    logprobs = _logprobs(body, chat)
    try:
        params = SamplingParams(
            temperature=_number(body, "temperature", 1.0, float, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, float, 0.0, 1.0),
            top_k=_number(body, "top_k", 0, int, 0, None),
            min_p=_number(body, "min_p", 0.0, float, 0.0, 1.0),
            seed=seed,
            max_tokens=max_tokens or MAX_TOKENS_DEFAULT,
            stop=stop,
            logprobs=logprobs,
        )
    except ValueError as exc:  # e.g. top_p = 0
        field = str(exc).split(" =")[0].removeprefix("SamplingParams.")
        raise _bad(field, str(exc)) from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", "'stream' must be true or false")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise _bad("stream_options", "'stream_options' must be an object")
    spec = body.get("speculative") or {}
    if not isinstance(spec, dict):
        raise _bad("speculative", "'speculative' must be an object {k, drafter}")
    k = spec.get("k")
    if k is not None and k != "auto" and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
        raise _bad("speculative.k", f"'speculative.k' = {k!r} must be an integer >= 0 or 'auto'")
    drafter = spec.get("drafter")
    if drafter is not None and not isinstance(drafter, str):
        raise _bad("speculative.drafter", "'speculative.drafter' must be a string or null")
    acceptance = spec.get("acceptance", EXACT)
    if not isinstance(acceptance, str):
        raise _bad("speculative.acceptance", "'speculative.acceptance' must be a string")
    try:
        check_rule(acceptance)
    except ValueError as exc:
        raise _bad("speculative.acceptance", str(exc)) from None
    return ParsedRequest(
        chat,
        model,
        prompt,
        messages,
        params,
        stream,
        bool(opts.get("include_usage", False)),
        bool(opts.get("continuous_usage_stats", False)),
        k,
        drafter,
        acceptance,
    )


# -- responses ---------------------------------------------------------------------------------
def label(req: ParsedRequest, width: int = 80) -> str:
    """A request's prompt in one short line (its last message's, for a chat), for lists."""
    text = req.messages[-1]["content"] if req.chat else req.prompt
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def speculative_stats(summary) -> dict[str, Any]:
    return {
        "proposed": summary.proposed,
        "accepted": summary.accepted,
        "rounds": summary.rounds,
        "acceptance": summary.acceptance,  # "exact", or the lossy rule used (`lossy`)
        "acceptance_rate": summary.acceptance_rate,
        "mean_accepted_length": summary.mean_accepted_length,
        "draft_ms": round(summary.draft_ms, 3),
        "verify_ms": round(summary.verify_ms, 3),
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def logprobs(
    req: ParsedRequest, items: Sequence[TokenLogprob], piece: Callable[[int], str], offset: int = 0
) -> dict[str, Any] | None:
    """`choices[].logprobs` for these tokens (None where the request asked for none): chat's
    {"content": [{token, logprob, bytes, top_logprobs}]}, or completions' {tokens,
    token_logprobs, top_logprobs, text_offset} (offsets into the completion from `offset`).
    piece: a token id's text."""
    if req.params.logprobs is None:
        return None
    if req.chat:

        def entry(t: int, lp: float) -> dict[str, Any]:
            text = piece(t)
            return {"token": text, "logprob": lp, "bytes": list(text.encode())}

        content = [
            {**entry(x.token, x.logprob), "top_logprobs": [entry(t, lp) for t, lp in x.top]}
            for x in items
        ]
        return {"content": content}
    tokens = [piece(x.token) for x in items]
    offsets = [offset + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    return {
        "tokens": tokens,
        "token_logprobs": [x.logprob for x in items],
        "top_logprobs": [{piece(t): lp for t, lp in x.top} for x in items],
        "text_offset": offsets,
    }


def response(
    req: ParsedRequest,
    rid: str,
    text: str,
    finish: str,
    prompt_tokens: int,
    summary,
    token_logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    base = {
        "id": rid,
        "created": int(time.time()),
        "model": req.model,
        "usage": usage(prompt_tokens, summary.emitted),
        "speculative": speculative_stats(summary),
    }
    if req.chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": token_logprobs,
        }
        return {**base, "object": "chat.completion", "choices": [choice]}
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": token_logprobs}
    return {**base, "object": "text_completion", "choices": [choice]}


def chunk(
    req: ParsedRequest,
    rid: str,
    created: int,
    text: str | None,
    finish: str | None,
    first: bool = False,
    token_logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    base = {"id": rid, "created": created, "model": req.model}
    if req.chat:
        delta: dict[str, str] = {}
        if first:
            delta["role"] = "assistant"
        if text:
            delta["content"] = text
        return {
            **base,
            "object": "chat.completion.chunk",
            "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": token_logprobs}
            ],
        }
    return {
        **base,
        "object": "text_completion",
        "choices": [
            {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": token_logprobs}
        ],
    }


def usage_chunk(req: ParsedRequest, rid: str, created: int, prompt_tokens: int, summary) -> dict:
    obj = "chat.completion.chunk" if req.chat else "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": req.model,
        "choices": [],
        "usage": usage(prompt_tokens, summary.emitted),
        "speculative": speculative_stats(summary),
    }
