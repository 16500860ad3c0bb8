"""After the scheduler applied a step's tokens (`Scheduler.update_from_output`): detokenize
them incrementally, find stop strings, and build `RequestOutput`s per request group.

Only detokenization is decided here. Stop tokens, finished grammars and length limits are the
scheduler's (core/stop_checks.py); a stop string found here is handed back as a
`StopStringHit` (`Scheduler.apply_stop_strings` applies it), and a fault while handling one
request (a detokenizer error, a non-finite logits row reported by the runner) fails only that
request: its sequences are handed back to be aborted, its output carries `error`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pagedllm.core.request import Request
from pagedllm.core.scheduler_output import StepUpdate, StopStringHit
from pagedllm.core.stop_checks import is_stop_token
from pagedllm.engine.detokenizer import IncrementalDetokenizer
from pagedllm.outputs import (
    CompletionOutput,
    PromptLogprobs,
    RequestMetrics,
    RequestOutput,
    RequestOutputKind,
)
from pagedllm.pooling.finalize import finalize
from pagedllm.pooling.outputs import PoolingOutput, PoolingRequestOutput
from pagedllm.pooling.setup import PoolingSetup

logger = logging.getLogger(__name__)


@dataclass
class RequestGroup:
    """The n sequences of one user request, and what has been reported of them."""

    request_id: str
    seqs: list[Request]
    emitted_tokens: dict[int, int] = field(default_factory=dict)  # index -> tokens reported
    error: BaseException | None = None  # the engine failed this request
    prompt_reported: bool = False  # its prompt logprobs were decoded and handed out

    @property
    def finished(self) -> bool:
        """An n > 1 request fans out on its first token, so before that only an abort ends it."""
        return all(s.is_finished for s in self.seqs)


@dataclass
class ProcessedStep:
    """The output processor's verdict on one step (applied by the scheduler)."""

    touched: set[str]  # group ids whose output changed
    stop_strings: list[StopStringHit]
    to_abort: list[Request]  # every sequence of a group that failed


class OutputProcessor:
    def __init__(self, tokenizer, pooling: PoolingSetup | None = None) -> None:
        self.tokenizer = tokenizer
        self.pooling = pooling  # a pooling model's setup: finalizes pooled vectors
        self.groups: dict[str, RequestGroup] = {}
        self._token_text: dict[int, str] = {}  # Logprob.decoded_token cache (bounded by vocab)

    def add(self, request: Request) -> None:
        if request.pooling_params is None:  # a pooling request has no text to decode
            request.detokenizer = self._detokenizer(request)
        self.groups[request.group_id] = RequestGroup(request.group_id, [request])

    def __contains__(self, group_id: str) -> bool:
        return group_id in self.groups

    def __len__(self) -> int:
        """Request groups not yet reported finished."""
        return len(self.groups)

    def sequences(self, group_id: str | None = None) -> list[Request]:
        """The sequences of one group (none if unknown), or of every group."""
        if group_id is not None:
            group = self.groups.get(group_id)
            return list(group.seqs) if group is not None else []
        return [s for g in self.groups.values() for s in g.seqs]

    def is_finished(self, group_id: str) -> bool:
        return self.groups[group_id].finished

    def remove(self, group_id: str) -> list[Request] | None:
        """Forget a group (aborted by the caller); its sequences, None if unknown."""
        group = self.groups.pop(group_id, None)
        return None if group is None else group.seqs

    def _detokenizer(self, request: Request) -> IncrementalDetokenizer:
        p = request.sampling_params
        return IncrementalDetokenizer(
            self.tokenizer, request.prompt_token_ids, skip_special_tokens=p.skip_special_tokens,
            spaces_between_special_tokens=p.spaces_between_special_tokens, stop=p.stop,
            include_stop_str_in_output=p.include_stop_str_in_output, min_tokens=p.min_tokens)

    # ---------------------------------------------------------------- tokens
    def process(self, update: StepUpdate) -> ProcessedStep:
        """Detokenize the tokens the scheduler appended this step."""
        for child in update.forked:
            child.detokenizer = self._detokenizer(child)
            self.groups[child.group_id].seqs.append(child)
        step = ProcessedStep(set(update.errors) | {r.group_id for r in update.pooled}, [], [])
        for group_id, error in update.errors.items():
            step.to_abort += self._fail(group_id, ValueError(error))
        for seq, num_new in update.appended.items():
            step.touched.add(seq.group_id)
            if self.groups[seq.group_id].error is not None:  # failed earlier in this step
                continue
            try:
                hit = self._detokenize(seq, num_new)
            except Exception as exc:  # noqa: BLE001 - contain it to this request
                step.to_abort += self._fail(seq.group_id, exc)
            else:
                if hit is not None:
                    step.stop_strings.append(hit)
        return step

    def _detokenize(self, seq: Request, num_new: int) -> StopStringHit | None:
        """Feed the sequence's `num_new` newest tokens to its detokenizer, in order; the text
        of a stop token goes in only with include_stop_str_in_output."""
        first = seq.num_output_tokens - num_new
        new = seq.output_token_ids[first:]
        if seq.logprobs is not None:
            for entry in seq.logprobs[first:]:
                for tid, lp in entry.items():
                    lp.decoded_token = self._decoded(tid)
        p = seq.sampling_params
        for i, tok in enumerate(new):
            if (is_stop_token(seq, tok, first + i + 1)
                    and not p.include_stop_str_in_output):
                continue
            stop = seq.detokenizer.update([tok])
            if stop is not None:
                return StopStringHit(seq, stop, first + i + 1)
        return None

    def _fail(self, group_id: str, exc: BaseException) -> list[Request]:
        """Keep the error for the group's output; its unfinished sequences are to be aborted."""
        logger.error("request %s failed in the engine: %r", group_id, exc, exc_info=exc)
        group = self.groups[group_id]
        group.error = exc
        return [seq for seq in group.seqs if not seq.is_finished]

    def _decoded(self, token_id: int) -> str:
        """The token's own text, as vLLM's Logprob.decoded_token (special tokens included)."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text

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

    def _make_output(self, group: RequestGroup, kind: RequestOutputKind
                     ) -> RequestOutput | PoolingRequestOutput:
        group_id = group.request_id
        first = group.seqs[0]
        if first.pooling_params is not None:  # reported once, when its prompt is pooled
            del self.groups[group_id]
            return PoolingRequestOutput(group_id, PoolingOutput(finalize(self.pooling, first)),
                                        first.prompt_token_ids, True,
                                        first.num_cached_tokens or 0)
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
                             num_cached_tokens=first.num_cached_tokens or 0,
                             prompt_logprobs=self._prompt_logprobs(group, kind, finished))

    def _prompt_logprobs(self, group: RequestGroup, kind: RequestOutputKind, finished: bool
                         ) -> PromptLogprobs | None:
        """The group's prompt logprobs once its whole prompt is scored (their tokens decoded
        the first time); DELTA outputs carry them in the first output after that, as vLLM's,
        and in the final one, as they carry the cumulative token lists."""
        seq = group.seqs[0]
        if seq.prompt_logprobs is None or seq.prompt_scoring_pending:
            return None
        if group.prompt_reported and kind is RequestOutputKind.DELTA and not finished:
            return None
        if not group.prompt_reported:
            group.prompt_reported = True
            for entry in seq.prompt_logprobs[1:]:
                for tid, lp in entry.items():
                    lp.decoded_token = self._decoded(tid)
        return list(seq.prompt_logprobs)
