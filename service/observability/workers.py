"""Worker processes seen from their supervisor: every exit logged with its cause.

uvicorn's supervisor (``uvicorn.supervisors.Multiprocess``) replaces a worker that died with one line,
``Child process [pid] died``: nothing says whether it exited, crashed on a signal (SIGBUS when a
memory-mapped metrics file could not grow on a full filesystem, SIGSEGV) or was killed (SIGKILL from the
kernel's out-of-memory killer). :class:`LoggedMultiprocess` is that supervisor with one log line per
worker exit: the exit code or the signal's name, a hint for the signals with a usual cause, and whether
a replacement is started.
"""

from __future__ import annotations

import logging
import signal

from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

logger = logging.getLogger("service.workers")

SIGNAL_HINTS = {
    signal.SIGBUS: "a memory-mapped file could not be backed: is ATTN_METRICS_DIR's filesystem full?",
    signal.SIGKILL: "killed from outside: the kernel's out-of-memory killer, or an operator",
    signal.SIGSEGV: "a crash in native code",
    signal.SIGABRT: "an abort in native code",
}


def describe_exit(code: int | None) -> str:
    """``exited with code 3``, ``was killed by signal SIGBUS (7; ...)``: a process's end in words."""
    if code is None:
        return "is still running"
    if code >= 0:
        return f"exited with code {code}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"was killed by signal {-code}"
    hint = SIGNAL_HINTS.get(sig)
    return f"was killed by signal {sig.name} ({int(sig)}{'; ' + hint if hint else ''})"


class LoggedMultiprocess(Multiprocess):
    """uvicorn's multiprocess supervisor, logging each worker's exit (code or signal) when it reaps it.

    ``startup_failed`` is set when a worker failed to start (the supervisor then stops the server).
    """

    startup_failed = False

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return  # the supervisor is exiting: no replacements
        for idx, process in enumerate(self.processes):
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            hung = process.process.is_alive()
            process.kill()  # hung (or already gone): make sure
            process.join()
            if hung:
                cause = f"did not answer its health check within {self.config.timeout_worker_healthcheck:g} s: killed"
            else:
                cause = describe_exit(process.exitcode)
            if process.exitcode == STARTUP_FAILURE and not hung:
                logger.error("worker process %s %s: it failed to start; stopping the server", process.pid, cause)
                self.startup_failed = True
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            replacement = Process(self.config, self.sockets)
            replacement.start()
            logger.error("worker process %s %s; started worker process %s in its place", process.pid, cause,
                         replacement.pid)  # fmt: skip
            self.processes[idx] = replacement

    def join_all(self) -> None:
        for process in self.processes:
            process.join()
            code = process.exitcode
            clean = code in (0, -signal.SIGTERM, -signal.SIGINT)
            logger.log(logging.INFO if clean else logging.ERROR, "worker process %s %s", process.pid,
                       describe_exit(code) if not clean else "stopped")  # fmt: skip
