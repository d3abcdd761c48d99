"""`serve`, in one process or in `listen.workers` (`--workers N`).

With several, the parent binds a listening socket for each worker, all on the one port
(SO_REUSEPORT: the kernel spreads connections over them), and starts the workers (spawned:
each a fresh interpreter with the whole proxy, its own event loop, app, store and upstream
connections), each accepting from its own. Sessions are shared through the session
store, which the config requires to be Redis; metrics through `worker_metrics`.

The parent serves nothing: it passes SIGTERM and SIGINT on to every worker, each of which
drains as one process does (`runner.Server`: /readyz 503 for the delay, the grace, exit 0),
and it exits once they all have, 0 when every one did. A worker that ends on its own (a
crash, a failed start) makes the parent stop the others the same way and exit 1: an
orchestrator then restarts the whole, as it would one process. Workers sit in a process group
of their own, so that a terminal's Ctrl-C reaches them once, from the parent; a worker whose
parent is gone (killed) stops as on SIGTERM.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import threading
from collections.abc import Mapping
from types import FrameType
from typing import Any

from proxy.config import Config
from proxy.observability.logs import configure
from proxy.observability.worker_metrics import Worker
from proxy.server.app import create_app
from proxy.server.runner import Server, server_config

log = logging.getLogger("compaction_proxy")


def serve(config: Config, facts: Mapping[str, Any]) -> int:
    """Serve until signalled; the exit status."""
    configure(config.logging)
    if config.listen.workers == 1:
        run(config, facts)
        return 0
    return _supervise(config, facts)


def run(
    config: Config,
    facts: Mapping[str, Any],
    sockets: list[socket.socket] | None = None,
    worker: Worker | None = None,
) -> None:
    """One process serving the proxy: on its own, or a worker on the parent's `sockets`."""
    app = create_app(config, freeze_heap=True, worker=worker)
    server = Server(server_config(app, config), app.state.proxy.gate, config.listen, facts)
    server.run(sockets)


def _supervise(config: Config, facts: Mapping[str, Any]) -> int:
    count = config.listen.workers
    # A listening socket each, on the same port (SO_REUSEPORT): the kernel spreads the
    # connections over them evenly. On one shared socket, whichever worker wakes first
    # takes every connection waiting (81% of a benchmark's 16 kept-alive ones).
    listeners = [
        socket.create_server(
            (config.listen.host, config.listen.port),
            family=socket.AF_INET6 if ":" in config.listen.host else socket.AF_INET,
            backlog=2048,  # uvicorn's
            reuse_port=True,
        )
        for _ in range(count)
    ]
    spawn = multiprocessing.get_context("spawn")
    workers = [
        spawn.Process(
            target=_worker,
            args=(config, {**facts, "worker": i}, listeners[i], Worker(i, count, os.getpid())),
            name=f"compaction-proxy worker {i}",
        )
        for i in range(count)
    ]
    signalled = False

    def forward(sig: int, frame: FrameType | None) -> None:
        nonlocal signalled
        signalled = True
        for process in workers:
            if process.pid is not None and process.exitcode is None:
                os.kill(process.pid, sig)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    failed = False
    try:
        for process, listener in zip(workers, listeners, strict=True):
            process.start()
            # The worker's copy is its own: once it closes it (at shutdown), the port is
            # closed too, as one process's is.
            listener.close()
        log.info("workers started", extra={"workers": count, "pids": [p.pid for p in workers]})
        while running := [p for p in workers if p.exitcode is None]:
            multiprocessing.connection.wait([p.sentinel for p in running])
            ended = [p for p in running if p.exitcode is not None]
            if ended and not signalled:
                failed = True
                codes = [p.exitcode for p in ended]
                log.error("a worker ended on its own: stopping", extra={"exit_codes": codes})
                forward(signal.SIGTERM, None)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for listener in listeners:
            listener.close()
    return 1 if failed or any(p.exitcode != 0 for p in workers) else 0


def _worker(
    config: Config, facts: Mapping[str, Any], listener: socket.socket, worker: Worker
) -> None:
    """A worker's process: the proxy on the parent's socket, until signalled or orphaned."""
    os.setpgrp()
    configure(config.logging)
    parent = multiprocessing.parent_process()
    if parent is not None:
        # The parent's end is a signal to stop, as SIGTERM (a daemon thread waits for it).
        def orphaned() -> None:
            parent.join()
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=orphaned, daemon=True).start()
    run(config, facts, [listener], worker)
