"""A server started as a child process: ready once its /health answers 200, stopped with
SIGTERM (SIGKILL after a grace period), its output kept in a log file. It knows nothing of
which engine it runs."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

__all__ = ["ServerProcess", "free_port"]

READY_TIMEOUT_S = 900.0  # loading weights and, for specwise, a first calibration
STOP_GRACE_S = 30.0


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`with ServerProcess(name, cmd, port, log) as url:` runs `cmd` until the block ends;
    `url` is its base URL. A server that exits or does not answer within `ready_timeout_s`
    raises RuntimeError naming the log and quoting its end."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        port: int,
        log: Path,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self.name, self.cmd, self.port, self.log = name, cmd, port, log
        self.ready_timeout_s = ready_timeout_s
        self.url = f"http://127.0.0.1:{port}"
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> str:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as out:
            out.write(" ".join(self.cmd) + "\n")
            out.flush()
            self._proc = subprocess.Popen(
                self.cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.url

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        end = time.monotonic() + self.ready_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < end:
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with status {self._proc.returncode} before it "
                        f"was ready; its log ({self.log}) ends: {self._tail()}"
                    )
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise RuntimeError(
            f"{self.name} did not answer /health within {self.ready_timeout_s:g} s; "
            f"its log ({self.log}) ends: {self._tail()}"
        )

    def _tail(self, chars: int = 600) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:].strip()
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
