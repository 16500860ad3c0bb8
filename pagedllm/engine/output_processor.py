"""After each forward pass: append sampled tokens, fan out n > 1 samples, detokenize, check
stop conditions, free finished requests, and build `RequestOutput`s per request group.

Stop conditions, in order, for each new token (vLLM v1 semantics): once `min_tokens` are
generated, EOS (unless ignore_eos) and `stop_token_ids` (their text is not added to the
output unless include_stop_str_in_output); then a stop string in the text; then
`max_tokens` or `max_model_len` reached (finish reason "length"). A constrained request whose
grammar is complete (only EOS could follow) stops there, as if it had sampled EOS.

A fault while handling one request (a detokenizer or stop-check error, a non-finite logits
row) finishes only that request: its sequences are aborted, their blocks freed, and its
output carries `error`; the other requests of the step are unaffected.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.scheduler import Scheduler
from pagedllm.engine.detokenizer import IncrementalDetokenizer
from pagedllm.outputs import (
    CompletionOutput,
    Logprob,
    RequestMetrics,
    RequestOutput,
    RequestOutputKind,
)
from pagedllm.worker.model_runner import SampledTokens

logger = logging.getLogger(__name__)


@dataclass
class RequestGroup:
    """The n sequences of one user request, and what has been reported of them."""

    request_id: str
    seqs: list[Request]
    emitted_tokens: dict[int, int] = field(default_factory=dict)  # index -> tokens reported
    error: BaseException | None = None  # the engine failed this request

    @property
    def finished(self) -> bool:
        """An n > 1 request fans out on its first token, so before that only an abort ends it."""
        return all(s.is_finished for s in self.seqs)


class OutputProcessor:
    def __init__(self, tokenizer, scheduler: Scheduler, block_manager: BlockManager,
                 max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.groups: dict[str, RequestGroup] = {}
        self._token_text: dict[int, str] = {}  # Logprob.decoded_token cache (bounded by vocab)
        self.faults = None  # FaultInjector in tests (engine/fault_injection.py), else None

    def add(self, request: Request) -> None:
        request.detokenizer = self._detokenizer(request)
        self.groups[request.group_id] = RequestGroup(request.group_id, [request])

    def _detokenizer(self, request: Request) -> IncrementalDetokenizer:
        p = request.sampling_params
        return IncrementalDetokenizer(
            self.tokenizer, request.prompt_token_ids, skip_special_tokens=p.skip_special_tokens,
            spaces_between_special_tokens=p.spaces_between_special_tokens, stop=p.stop,
            include_stop_str_in_output=p.include_stop_str_in_output, min_tokens=p.min_tokens)

    # ---------------------------------------------------------------- tokens
    def process(self, sampled: list[SampledTokens]) -> set[str]:
        """Apply this step's tokens; return the group ids that changed."""
        now = time.monotonic()
        touched: set[str] = set()
        for st in sampled:
            req = st.request
            touched.add(req.group_id)
            try:
                self._apply(st, now)
            except Exception as exc:  # noqa: BLE001 - contain it to this request
                self._fail(req.group_id, exc)
        return touched

    def _apply(self, st: SampledTokens, now: float) -> None:
        req = st.request
        if st.error is not None:
            raise ValueError(st.error)
        if self.faults is not None:
            self.faults.on_output(req.group_id)
        if st.num_drafts:  # speculative decoding: accepted drafts + one, in order
            targets = [req] * len(st.token_ids)
        else:
            targets = [req] if len(st.token_ids) == 1 else self._fan_out(req)
        for i, (seq, tok) in enumerate(zip(targets, st.token_ids, strict=True)):
            seq.append_token(tok)
            if st.logprobs is not None:
                self._add_logprobs(seq, tok, st.logprobs[i])
            if seq.times.first_token is None:
                seq.times.first_token = now
            seq.times.last_token = now
            self._check_stop(seq, tok)
            if st.num_drafts and seq.is_finished:
                del st.token_ids[i + 1:]  # a stop inside the accepted run: drop the rest
                break

    def _fail(self, group_id: str, exc: BaseException) -> None:
        """Finish every sequence of the group as aborted (freeing its blocks), keep the error."""
        logger.error("request %s failed in the engine: %r", group_id, exc, exc_info=exc)
        group = self.groups[group_id]
        group.error = exc
        for seq in group.seqs:
            if not seq.is_finished:
                self.scheduler.finish_request(seq, RequestStatus.FINISHED_ABORTED)

    def _add_logprobs(self, seq: Request, tok: int, entry: dict[int, Logprob]) -> None:
        for tid, lp in entry.items():
            lp.decoded_token = self._decoded(tid)
        seq.logprobs.append(entry)
        seq.cumulative_logprob += entry[tok].logprob

    def _decoded(self, token_id: int) -> str:
        """The token's own text, as vLLM's Logprob.decoded_token (special tokens included)."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text

    def _fan_out(self, parent: Request) -> list[Request]:
        """Fork a just-prefilled n > 1 request into n sequences sharing its blocks."""
        group = self.groups[parent.group_id]
        parent.forked = True
        children = [parent]
        for i in range(1, parent.sampling_params.n):
            child = parent.fork(f"{parent.group_id}-{i}", i)
            child.detokenizer = self._detokenizer(child)
            self.block_manager.fork(parent, child)
            self.scheduler.add_running(child)
            group.seqs.append(child)
            children.append(child)
        parent.generators = parent.generators[:1]
        return children

    def _check_stop(self, seq: Request, tok: int) -> None:
        """vLLM v1 order: stop tokens (EOS unless ignore_eos, stop_token_ids; both only after
        min_tokens) end the sequence and their text is left out unless
        include_stop_str_in_output; then stop strings; then max_tokens / max_model_len."""
        p = seq.sampling_params
        is_eos = not p.ignore_eos and tok == seq.eos_token_id
        token_stop = seq.num_output_tokens >= p.min_tokens and (
            is_eos or tok in p.stop_token_ids)
        stop_str = None
        if not token_stop or p.include_stop_str_in_output:
            stop_str = seq.detokenizer.update([tok])
        status = None
        if token_stop:
            status, seq.stop_reason = RequestStatus.FINISHED_STOPPED, None if is_eos else tok
        elif stop_str is not None:
            status, seq.stop_reason = RequestStatus.FINISHED_STOPPED, stop_str
        elif seq.grammar is not None and seq.grammar.is_terminated:
            status, seq.stop_reason = RequestStatus.FINISHED_STOPPED, None
        elif seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
            status = RequestStatus.FINISHED_LENGTH
        if status is not None:
            self.scheduler.finish_request(seq, status)

    # --------------------------------------------------------------- outputs
    def make_output(self, group_id: str, *,
                    kind: RequestOutputKind = RequestOutputKind.CUMULATIVE) -> RequestOutput:
        """The group's output now (see RequestOutputKind). Lists handed out are never the
        engine's own: the engine keeps appending to those, possibly in another thread.
        A failed group (also one failing here) yields a finished output with `error`."""
        group = self.groups[group_id]
        if group.error is None:
            try:
                return self._make_output(group, kind)
            except Exception as exc:  # noqa: BLE001 - contain it to this request
                self._fail(group_id, exc)
        del self.groups[group_id]
        first = group.seqs[0]
        return RequestOutput(request_id=group_id, prompt=first.prompt,
                             prompt_token_ids=first.prompt_token_ids, outputs=[],
                             finished=True, error=group.error)

    def _make_output(self, group: RequestGroup, kind: RequestOutputKind) -> RequestOutput:
        group_id = group.request_id
        first = group.seqs[0]
        finished = group.finished
        outputs = []
        for seq in sorted(group.seqs, key=lambda s: s.index):
            done = seq.is_finished
            text = seq.detokenizer.output_text
            delta = seq.detokenizer.get_delta(done) if kind is RequestOutputKind.DELTA else ""
            n_prev = group.emitted_tokens.get(seq.index, 0)
            group.emitted_tokens[seq.index] = seq.num_output_tokens
            full = finished or kind is not RequestOutputKind.DELTA
            lps = seq.logprobs
            out = CompletionOutput(
                index=seq.index, text=text,
                token_ids=list(seq.output_token_ids) if full else [],
                logprobs=None if lps is None else list(lps) if full else [],
                cumulative_logprob=seq.cumulative_logprob,
                finish_reason=seq.status.value if done else None, stop_reason=seq.stop_reason,
                delta_text=delta, delta_token_ids=seq.output_token_ids[n_prev:],
                delta_logprobs=lps[n_prev:] if lps is not None else None)
            outputs.append(out)
        t = first.times
        metrics = RequestMetrics(
            arrival_time=t.arrival, first_scheduled_time=t.first_scheduled,
            first_token_time=t.first_token, last_token_time=t.last_token,
            finished_time=t.finished, num_preemptions=sum(s.num_preemptions for s in group.seqs))
        if finished:
            del self.groups[group_id]
        return RequestOutput(request_id=group_id, prompt=first.prompt,
                             prompt_token_ids=first.prompt_token_ids, outputs=outputs,
                             finished=finished, metrics=metrics,
                             num_cached_tokens=first.num_cached_tokens or 0)
