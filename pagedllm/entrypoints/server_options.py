"""The server's protective limits (`ServerOptions`) and their `serve` flags.

Each limit exists because one client could otherwise hurt the others: prompts per request
(a 20,000-prompt request held the engine thread for a minute), request-supplied chat templates
(a template is a program), connection timeouts (a client trickling its headers held a
connection open forever), a connection cap, the drain time of a graceful shutdown, and the
Host names accepted (DNS rebinding against a server without an API key).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

DEFAULT_MAX_PROMPTS_PER_REQUEST = 1024
DEFAULT_MAX_STORED_RESPONSES = 1000  # response_store.py


@dataclass
class ServerOptions:
    max_prompts_per_request: int = DEFAULT_MAX_PROMPTS_PER_REQUEST
    trust_request_chat_template: bool = False
    request_chat_template_timeout: float = 2.0  # seconds a request's template may render
    shutdown_timeout: float = 30.0  # seconds in-flight requests may finish after SIGTERM
    timeout_keep_alive: float = 5.0  # idle seconds between requests on one connection
    timeout_request_header: float = 10.0  # seconds from connect (or the last request) to
    #                                       the end of the request headers
    timeout_request_body: float = 30.0  # seconds from the headers to the end of the body
    limit_concurrency: int | None = 1024  # connections + requests; past it: 503
    allowed_hosts: list[str] | None = None  # Host header names (None: any)
    max_stored_responses: int = DEFAULT_MAX_STORED_RESPONSES  # /v1/responses store=true
    enable_tokenizer_info_endpoint: bool = False  # GET /tokenizer_info (tokenizer_info.py)

    def __post_init__(self) -> None:
        if self.max_stored_responses < 1:
            raise ValueError(f"max_stored_responses must be >= 1, got "
                             f"{self.max_stored_responses}")
        if self.max_prompts_per_request < 1:
            raise ValueError("max_prompts_per_request must be >= 1, got "
                             f"{self.max_prompts_per_request}")
        for name in ("request_chat_template_timeout", "timeout_keep_alive",
                     "timeout_request_header", "timeout_request_body"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {self.shutdown_timeout}")
        if self.limit_concurrency is not None and self.limit_concurrency < 1:
            raise ValueError(f"limit_concurrency must be >= 1 or None, got "
                             f"{self.limit_concurrency}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerOptions:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def add_server_option_args(g: argparse._ArgumentGroup) -> None:
    """The `serve` flags of ServerOptions (into the "server" group)."""
    d = ServerOptions()  # "%(default)s": argparse fills it in (and adds no second default)
    g.add_argument("--max-prompts-per-request", type=int, default=d.max_prompts_per_request,
                   help="most prompts one /v1/completions request may carry (400 past it; "
                   "default %(default)s)")
    g.add_argument("--trust-request-chat-template", action="store_true",
                   help="accept a chat_template in chat requests (refused with 400 "
                   "otherwise); it renders in a child process with a time and memory limit")
    g.add_argument("--request-chat-template-timeout", type=float,
                   default=d.request_chat_template_timeout,
                   help="seconds a request-supplied chat template may render "
                   "(default %(default)s)")
    g.add_argument("--shutdown-timeout", type=float, default=d.shutdown_timeout,
                   help="on SIGTERM/SIGINT: refuse new requests (503), let in-flight ones "
                   "finish for this many seconds, then abort the rest; 0 aborts at once; a "
                   "second signal exits at once (default %(default)s)")
    g.add_argument("--timeout-keep-alive", type=float, default=d.timeout_keep_alive,
                   help="close a connection idle this many seconds between requests "
                   "(default %(default)s)")
    g.add_argument("--timeout-request-header", type=float, default=d.timeout_request_header,
                   help="close a connection whose request headers are not complete this many "
                   "seconds after it opened or its last response (default %(default)s)")
    g.add_argument("--timeout-request-body", type=float, default=d.timeout_request_body,
                   help="answer 408 and close when a request body is not complete this many "
                   "seconds after its headers (default %(default)s)")
    g.add_argument("--limit-concurrency", type=int, default=d.limit_concurrency,
                   help="most open connections plus requests in progress; past it new "
                   "requests get 503 (default %(default)s)")
    g.add_argument("--max-stored-responses", type=int, default=d.max_stored_responses,
                   help="most /v1/responses results kept in memory for previous_response_id "
                   "and GET /v1/responses/{id}; past it the least recently used is dropped "
                   "(default %(default)s)")
    g.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                   help="serve GET /tokenizer_info (vLLM's: the tokenizer's configuration, "
                   "special tokens and chat template, e.g. for lm-eval's remote tokenizer); "
                   "off by default, then it is 404")
    g.add_argument("--allowed-hosts", nargs="+", default=None, metavar="HOST",
                   help="accept only requests whose Host header names one of these (port "
                   "ignored; 400 otherwise), against DNS rebinding (default: any host)")
