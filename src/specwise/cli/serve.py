"""`specwise serve`: its flags, checked before any model loads (a port in use fails at
once), then the engine, the app and uvicorn until SIGTERM or Ctrl-C, and what was learnt saved
at the end.

No route, scheduling or API of its own: those are `server/`'s.
"""

from __future__ import annotations

import argparse
import signal
import sys

from specwise.cli.common import UsageError, _build_engine, _save_memory
from specwise.cli.options import _check_budgets, _k, _model_args
from specwise.server.scheduler import PREFILL_CHUNK, WHOLE_PROMPT

__all__ = ["add_parser", "cmd_serve"]


def cmd_serve(a: argparse.Namespace) -> int:
    if a.max_batch < 1:
        raise UsageError(f"--max-batch {a.max_batch} is invalid; use an integer >= 1")
    if a.max_queue < 0:
        raise UsageError(f"--max-queue {a.max_queue} is invalid; use an integer >= 0")
    if a.prefill_chunk < 0:
        raise UsageError(
            f"--prefill-chunk {a.prefill_chunk} is invalid; use tokens >= 1, or 0 for whole prompts"
        )
    for flag in ("whole_prompt", "max_prompt", "max_new_tokens", "streams_per_key"):
        if getattr(a, flag) < 0:
            name = "--" + flag.replace("_", "-")
            raise UsageError(f"{name} {getattr(a, flag)} is invalid; use an integer >= 0")
    if not a.max_body_mb > 0:
        raise UsageError(f"--max-body-mb {a.max_body_mb:g} is invalid; use MiB > 0")
    _check_budgets(("--adapt-budget", a.adapt_budget), ("--adapt-idle-budget", a.adapt_idle_budget))
    if a.adapt_buffer < 1:
        raise UsageError(f"--adapt-buffer {a.adapt_buffer} is invalid; use positions >= 1")
    if a.adapt_cache and a.adapt == "off":
        raise UsageError("--adapt-cache keeps what --adapt learns; give --adapt key or global")
    if a.drain_timeout < 0:
        raise UsageError(f"--drain-timeout {a.drain_timeout:g} is invalid; use seconds >= 0")
    for flag, port in (("--port", a.port), ("--ollama-port", a.ollama_port)):
        if port is not None and not 0 < port < 65536:
            raise UsageError(f"{flag} {port} is invalid; use 1..65535")
    if a.ollama_port == a.port:
        raise UsageError(
            f"--ollama-port {a.ollama_port} is --port's; give another port (Ollama's routes are "
            f"on --port as well)"
        )
    # the second port is taken now, before the models load, so that one in use fails at once
    sockets = None if a.ollama_port is None else [_listen(a.host, a.ollama_port, "--ollama-port")]
    try:
        return _serve(a, sockets)
    finally:
        for sock in sockets or []:
            sock.close()


def _serve(a: argparse.Namespace, sockets: list | None) -> int:
    """`serve` once its flags are checked: the engine, the app, and uvicorn on --port (and on
    the sockets given: --ollama-port's) until SIGTERM or Ctrl-C."""
    import ipaddress
    import os

    import uvicorn

    from specwise.server.app import create_app

    api_keys = a.api_key or [k for k in [os.environ.get("SPECWISE_API_KEY")] if k]
    try:
        loopback = a.host == "localhost" or ipaddress.ip_address(a.host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not api_keys:
        print(
            f"specwise: warning: serving on {a.host} without an API key; anyone who can reach "
            f"this address can use the model (set --api-key or SPECWISE_API_KEY)",
            file=sys.stderr,
        )
    from specwise.trace import JsonlSink

    sink = JsonlSink(a.trace) if a.trace else None
    from specwise.backends.llama_lib import on_own_thread

    # + 2 sequences for the engine's checks; built on a thread that ends, so that the main
    # thread holds no OpenMP pool beside the scheduler's (`on_own_thread`)
    engine = on_own_thread(
        lambda: _build_engine(a, trace=sink, max_sequences=a.max_batch + 2, layer=True)
    )
    name = a.pair or engine.target.info.model
    if a.target and a.target.startswith("ollama:") and not a.pair:  # named as Ollama names it
        from specwise.stores import parse_name

        name = parse_name(a.target).display
    app = create_app(
        engine,
        name,
        max_batch=a.max_batch,
        max_queue=a.max_queue,
        api_keys=api_keys,
        cors_origins=a.cors or None,
        prefill_chunk=a.prefill_chunk or None,
        whole_prompt=a.whole_prompt,
        max_body_bytes=int(a.max_body_mb * (1 << 20)),
        max_prompt=a.max_prompt,
        max_new_tokens=a.max_new_tokens,
        streams_per_key=a.streams_per_key,
        adapter=engine.learner,
    )
    ollama_url = f"http://{a.host}:{a.ollama_port or a.port}"
    print(
        f"specwise: serving {name} on http://{a.host}:{a.port}/v1 "
        f"(backend {engine.target.info.backend}, k={engine.k}, "
        f"drafters: {', '.join(d.name for d in engine.drafters) or 'none'}); "
        f"Ollama's API: {ollama_url}/api; trace inspector: http://{a.host}:{a.port}/ui",
        file=sys.stderr,
    )
    # uvicorn drains on SIGTERM, then raises the signal again as it returns: leave through
    # `finally` (what was learnt is saved) with status 0 rather than die of it
    previous = signal.signal(signal.SIGTERM, _exit_quietly)
    how = {"log_level": "warning", "timeout_graceful_shutdown": a.drain_timeout}
    try:
        if sockets is None:
            uvicorn.run(app, host=a.host, port=a.port, **how)
        else:  # one app on both ports: OpenAI's and Ollama's routes on each, as Ollama does
            sockets.insert(0, _listen(a.host, a.port, "--port"))
            uvicorn.Server(uvicorn.Config(app, host=a.host, port=a.port, **how)).run(sockets)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _save_memory(a, engine)
        if sink is not None:
            sink.close()
    return 0


def _listen(host: str, port: int, flag: str):
    """A socket bound to host:port for uvicorn to listen on, or UsageError naming the flag."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = "; Ollama itself may be listening there: stop it, or give another port"
        raise UsageError(
            f"{flag} {port}: cannot listen on {host}:{port} ({exc.strerror or exc})"
            f"{hint if flag == '--ollama-port' else ''}"
        ) from None
    return sock


def _exit_quietly(signum, frame) -> None:
    raise SystemExit(0)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`serve` and its flags."""
    s = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server with continuous batching, Ollama's API beside",
    )
    _model_args(s)
    s.add_argument("--k", type=_k, default="auto", help="default k for requests (auto)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--ollama-port",
        type=int,
        help="also serve on this port (Ollama's is 11434), so that Ollama's clients connect "
        "unchanged; Ollama's API (/api/chat, /api/generate, /api/tags, ...) is on --port too",
    )
    s.add_argument("--max-batch", type=int, default=4, help="sequences decoded together")
    s.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429")
    s.add_argument(
        "--prefill-chunk",
        type=int,
        default=PREFILL_CHUNK,
        help=f"tokens of a long prompt fed between two rounds, so it does not stall the "
        f"running streams (default {PREFILL_CHUNK}; 0: whole prompts; exact mode: whole)",
    )
    s.add_argument(
        "--max-prompt", type=int, default=0, help="prompt tokens a request may send (0: context)"
    )
    s.add_argument(
        "--max-new-tokens",
        type=int,
        default=0,
        help="max_tokens a request may ask for (0: up to the context); a request asking more "
        "gets a 400, one naming none gets at most this",
    )
    s.add_argument(
        "--streams-per-key",
        type=int,
        default=0,
        help="requests of one API key queued or running at once (0: no limit); 429 past it",
    )
    s.add_argument("--max-body-mb", type=float, default=4.0, help="largest request body in MiB (4)")
    s.add_argument(
        "--whole-prompt",
        type=int,
        default=WHOLE_PROMPT,
        help=f"prompts of at most this many tokens go in whole, before and after each round, "
        f"so a short request's first token takes one forward (default {WHOLE_PROMPT})",
    )
    s.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM or Ctrl-C: stop taking requests, let those in flight finish for up to "
        "this many seconds, then cancel the rest (30)",
    )
    s.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="require 'Authorization: Bearer KEY' with this key (or SPECWISE_API_KEY); "
        "repeatable: each key is a tenant whose text the suffix drafter keeps apart",
    )
    s.add_argument("--cors", action="append", default=[], help="allowed CORS origin (repeatable)")
    s.add_argument("--trace", help="append every round of every request as JSON lines here")
    s.add_argument(
        "--adapt",
        choices=["off", "key", "global"],
        default="off",
        help="keep training the drafter on hidden states named in --drafter (heads or eagle) "
        "on the traffic served (online speculative decoding), in a background thread: key: "
        "one adapted copy per API key, global: one for all requests (default off)",
    )
    s.add_argument(
        "--adapt-budget",
        type=float,
        default=0.1,
        help="share of one core the adaptation may use while requests are in (0.1; 0: none, "
        "it learns only while the server is idle)",
    )
    s.add_argument(
        "--adapt-idle-budget",
        type=float,
        default=1.0,
        help="share of one core the adaptation may use while no request is in (1.0)",
    )
    s.add_argument(
        "--adapt-buffer",
        type=int,
        default=8192,
        help="served positions each adapted copy keeps to learn from, the newest (8192)",
    )
    s.add_argument(
        "--adapt-cache",
        help="keep the adapted drafter in this file across runs (read at start, written at exit)",
    )
    s.set_defaults(func=cmd_serve)
