"""Request fields beyond plain sampling: unimplemented ones (400 naming them), unknown extras
(ignored with a warning, as vLLM), logit_bias keys, and the ways a client asks for
constrained output: OpenAI's `response_format`, vLLM's `structured_outputs`, and vLLM's older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`.
"""

from __future__ import annotations

import logging

from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.protocol import SamplingFields
from pagedllm.structured_output.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def check_request_fields(req: SamplingFields) -> None:
    """400 for a set field that is declared but not implemented; log unknown extras."""
    for name, neutral in req.UNSUPPORTED.items():
        value = getattr(req, name)
        if value is not None and value != neutral:
            raise APIError(400, f"{name} is not supported by this server", param=name)
    extra = sorted(req.model_extra or ())
    if extra:  # bounded: field names are the client's text too
        names = ", ".join(extra)
        shown = names if len(names) <= 200 else f"{names[:200]}... ({len(extra)} fields)"
        logger.warning("ignoring unknown request fields: %s", shown)


def logit_bias_of(req: SamplingFields) -> dict[int, float] | None:
    """OpenAI sends token ids as JSON object keys (strings)."""
    if not req.logit_bias:
        return None
    out = {}
    for key, bias in req.logit_bias.items():
        try:
            out[int(key)] = bias
        except ValueError:
            raise APIError(400, f"logit_bias keys must be token ids, got {key!r}",
                           param="logit_bias") from None
    return out


def structured_outputs_of(req: SamplingFields) -> StructuredOutputsParams | None:
    """The request's output constraint, or None; 400 if it asks in more than one way."""
    found: list[tuple[str, dict]] = []
    rf = req.response_format
    if rf is not None and rf.type != "text":
        if rf.type == "structural_tag":
            raise APIError(400, "response_format type structural_tag is not supported",
                           param="response_format")
        if rf.type == "json_object":
            found.append(("response_format", {"json_object": True}))
        else:
            if rf.json_schema is None or rf.json_schema.json_schema is None:
                raise APIError(400, "response_format json_schema needs json_schema.schema",
                               param="response_format")
            found.append(("response_format", {"json": rf.json_schema.json_schema}))
    if req.structured_outputs is not None:
        found.append(("structured_outputs", dict(req.structured_outputs)))
    guided = {kind: getattr(req, name) for name, kind in _GUIDED.items()
              if getattr(req, name) is not None}
    if guided:
        found.append((next(n for n in _GUIDED if getattr(req, n) is not None), guided))
    if not found:
        if req.guided_whitespace_pattern is not None:
            raise APIError(400, "guided_whitespace_pattern needs guided_json",
                           param="guided_whitespace_pattern")
        return None
    if len(found) > 1:
        raise APIError(400, "set only one of response_format, structured_outputs and guided_*; "
                       f"got {', '.join(n for n, _ in found)}", param=found[1][0])
    param, spec = found[0]
    if req.guided_whitespace_pattern is not None:
        spec.setdefault("whitespace_pattern", req.guided_whitespace_pattern)
    try:
        return StructuredOutputsParams(**spec)
    except TypeError as exc:  # an unknown key inside structured_outputs
        raise APIError(400, f"{param}: {exc}".replace("StructuredOutputsParams.__init__() ", ""),
                       param=param) from None
    except ValueError as exc:
        raise APIError(400, str(exc), param=param) from None
