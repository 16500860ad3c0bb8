"""Render request-supplied chat templates (--trust-request-chat-template) in a child process
with a time and memory limit.

A Jinja template is a program: `{% for i in range(12000) %}{% for j in range(12000) %}...`
ran for 9.6 s and `{{ ('a' * 500000000) | length }}` took 480 MB when templates rendered on
the event loop. A thread cannot be stopped, so templates render in one child process (spawned
once, holding a copy of the tokenizer): the parent waits `timeout_s` for the text, then kills
the child and starts a fresh one; the child's address space is capped (RLIMIT_AS) so a huge
string fails there with MemoryError, and a text over `max_output_bytes` is refused. Renders
are serialised: one child, one template at a time (only requests that bring their own
template wait on each other).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

from pagedllm.errors import InvalidRequestError

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 120.0  # spawning imports transformers: slow on a loaded 2-core machine


class TemplateRenderError(InvalidRequestError):
    """The template failed, ran past its time, memory or output limit."""


class TemplateSandbox:
    def __init__(self, tokenizer, timeout_s: float = 2.0, max_output_bytes: int = 4 * 2**20,
                 max_memory_bytes: int = 256 * 2**20) -> None:
        self.timeout_s, self.max_output_bytes = timeout_s, max_output_bytes
        self.max_memory_bytes = max_memory_bytes
        self._tokenizer = pickle.dumps(tokenizer)
        self._ctx = multiprocessing.get_context("spawn")
        self._proc = None
        self._conn = None
        self._lock = threading.Lock()  # held by the worker thread that talks to the child
        # Its own thread: renders waiting their turn queue here, not in the loop's default
        # executor that tokenization uses.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="pagedllm-template")

    def start(self) -> None:
        """Spawn the child now (at server start) rather than on the first request."""
        with self._lock:
            self._ensure_child()

    async def render(self, conversation: list[dict], **kwargs) -> str:
        payload = {"conversation": conversation, **kwargs}
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._render,
                                                                payload)

    def close(self) -> None:
        with self._lock:
            self._kill()

    # ------------------------------------------------------------ parent side
    def _render(self, payload: dict) -> str:
        with self._lock:
            conn = self._ensure_child()
            conn.send(payload)
            if not conn.poll(self.timeout_s):
                self._kill()
                raise TemplateRenderError(f"rendering took longer than {self.timeout_s:g} s "
                                          "(the limit for request-supplied templates)")
            try:
                ok, value = conn.recv()
            except EOFError:  # the child died (e.g. killed by the OS)
                self._kill()
                raise TemplateRenderError("the template renderer died") from None
        if not ok:
            raise TemplateRenderError(value)
        return value

    def _ensure_child(self):
        if self._proc is not None and self._proc.is_alive():
            return self._conn
        self._kill()
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_child_main, name="pagedllm-template-sandbox",
                                 args=(child, self._tokenizer, self.max_output_bytes,
                                       self.max_memory_bytes), daemon=True)
        proc.start()
        child.close()
        if not parent.poll(_START_TIMEOUT_S):
            proc.kill()
            raise TemplateRenderError("the template renderer did not start")
        parent.recv()  # "ready"
        self._proc, self._conn = proc, parent
        return parent

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None


# ------------------------------------------------------------------ child side
def _child_main(conn, tokenizer_bytes: bytes, max_output_bytes: int,
                max_memory_bytes: int) -> None:
    import resource

    tokenizer = pickle.loads(tokenizer_bytes)
    tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                  chat_template="{{ messages[0]['content'] }}")  # imports
    try:
        with open("/proc/self/statm") as f:
            vm_bytes = int(f.read().split()[0]) * resource.getpagesize()
        limit = vm_bytes + max_memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError):  # no /proc or no RLIMIT_AS: the time limit still holds
        logger.warning("template sandbox: no memory limit on this platform")
    conn.send(("ready", None))
    while True:
        try:
            payload = conn.recv()
        except EOFError:
            return
        conn.send(_render_one(tokenizer, payload, max_output_bytes))


def _render_one(tokenizer, payload: dict, max_output_bytes: int) -> tuple[bool, str]:
    conversation = payload.pop("conversation")
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False, **payload)
    except MemoryError:
        return False, "the template needed more memory than request templates may use"
    except RecursionError:
        return False, "the template recursed too deeply"
    except Exception as exc:  # noqa: BLE001 - jinja errors of any kind are the client's
        return False, f"{type(exc).__name__}: {str(exc)[:500]}"
    if not isinstance(text, str):
        return False, "the template did not render to text"
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_output_bytes:
        return False, f"the template rendered {size} bytes, the limit is {max_output_bytes}"
    return True, text
