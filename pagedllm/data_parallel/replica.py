"""One data-parallel replica: a whole LLMEngine in its own process, driven over a pipe.

Commands from the front: ("add", request_id, prompt, params, arrival, cache_salt) answered
by ("added", request_id, error or None); ("abort", ids); ("stop",). After every step that
produced outputs it sends ("out", outputs, stats); a step that raises fails the requests in
flight with ("failed", ids, error). The replica connects to the front's listener and says
("hello", index, pid) first; it exits when that connection closes (the front is gone).
"""

from __future__ import annotations

import logging
import os
from multiprocessing.connection import Client

from pagedllm.config import EngineConfig

logger = logging.getLogger(__name__)

_IDLE_POLL_S = 0.5


def replica_main(index: int, config: EngineConfig, address, authkey: bytes) -> None:
    logging.basicConfig(level=logging.WARNING,
                        format=f"%(asctime)s dp-replica{index} %(levelname)s %(name)s: "
                        "%(message)s")
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.startup import warm_up

    conn = Client(address, authkey=authkey)
    conn.send(("hello", index, os.getpid()))

    try:
        engine = LLMEngine(config)
        warm_up(engine)
    except BaseException as exc:  # noqa: BLE001 - the front reports it
        conn.send(("error", repr(exc)))
        os._exit(1)
    conn.send(("ready", os.getpid()))
    live: set[str] = set()
    try:
        while True:
            busy = engine.has_unfinished_requests()
            if conn.poll(0 if busy else _IDLE_POLL_S):
                while conn.poll(0):
                    if not _command(engine, conn, conn.recv(), live):
                        return
            elif not busy:
                continue
            if not engine.has_unfinished_requests():
                continue
            try:
                outputs = engine.step(stream=True)
            except Exception as exc:  # noqa: BLE001 - fail what is in flight, go on
                logger.exception("replica %d: step failed", index)
                engine.abort_request(list(live))
                conn.send(("failed", list(live), exc))
                live.clear()
                continue
            for out in outputs:
                if out.finished:
                    live.discard(out.request_id)
            if outputs:
                conn.send(("out", outputs, engine.stats))
    except (EOFError, OSError):  # the front is gone: nobody to serve
        return
    finally:
        engine.shutdown()


def _command(engine, conn, cmd: tuple, live: set[str]) -> bool:
    kind = cmd[0]
    if kind == "add":
        _, rid, prompt, params, arrival, salt = cmd
        try:
            engine.add_request(prompt, params, request_id=rid, arrival_time=arrival,
                               cache_salt=salt)
        except Exception as exc:  # noqa: BLE001 - ValueError for bad input, sent back
            conn.send(("added", rid, exc))
            return True
        live.add(rid)
        conn.send(("added", rid, None))
    elif kind == "abort":
        ids = [rid for rid in cmd[1] if rid in live]
        engine.abort_request(ids)
        live.difference_update(ids)
    elif kind == "stop":
        return False
    return True
