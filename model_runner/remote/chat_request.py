"""What kvscope asks the remote server: the streaming OpenAI chat request for a generate's
parameters (every sampling field the built-in engine implements, under the names vLLM takes, and a
constraint as `response_format` or vLLM's `structured_outputs`), the fields no remote server can take
per request (refused by name; anything else the server itself refuses comes back as its 400, naming
the field), and the `accepted` event with the prompt's counts where kvscope has the model's tokenizer
(computed), null where it has not."""

from __future__ import annotations

import json
from typing import Any

from model_runner.protocol import events as ev
from model_runner.protocol.errors import UserError
from model_runner.protocol.request import GenerateParams
from model_runner.remote.facts import NOT_VISIBLE
from model_runner.shared.endings import accepted_event as shared_accepted
from model_runner.shared.sequence import Sequence
from model_runner.text.prompt import PromptView


def refuse_unsupported(params: GenerateParams, has_tokenizer: bool) -> None:
    """UserError naming the field a remote server cannot honour for this request."""
    if not params.kv_cache:
        raise UserError("`kv_cache` cannot be turned off on a remote server: it always caches", field="kv_cache")
    if params.inspect_attention:
        raise UserError(
            "`inspect.attention` needs the model's own forward: a remote server's attention weights are not visible",
            field="inspect.attention",
        )
    if not params.chat_template:
        raise UserError(
            "a raw prompt (no chat template) cannot go through the remote server's chat API", field="prompt"
        )
    if params.prefill_chunk:
        raise UserError(
            "`prefill_chunk` is the remote server's setting (e.g. vLLM's --max-num-batched-tokens), "
            "not a per-request field",
            field="prefill_chunk",
        )
    if params.overflow != "reject" and not has_tokenizer:
        raise UserError(
            f"`overflow` {params.overflow!r} needs the prompt's token count: start kvscope with "
            "--engine-config FOLDER holding the model's tokenizer",
            field="overflow",
        )


def accepted_event(seq: Sequence, view: PromptView | None, context_window: int | None) -> ev.Accepted:
    """`accepted` for a remote request (view: the local tokenizer's plan of the prompt, or None)."""
    p = seq.params
    budget = (
        {**view.budget, "provenance": "computed with the local tokenizer"}
        if view
        else {"action": "none", "prompt_tokens": None, "max_new_tokens": p.max_new_tokens, "provenance": NOT_VISIBLE}
    )
    counts = (view.prompt_tokens, view.content_tokens, view.template_tokens) if view else (None, None, None)
    return shared_accepted(
        seq, counts=counts, budget=budget, context_window=context_window, kv_cache=True, prefill_chunk=0
    )


def chat_body(params: GenerateParams, view: PromptView | None, model: str, top_logprobs: int) -> dict[str, Any]:
    """The OpenAI chat request for these parameters (view: the messages after any truncation)."""
    messages = view.messages if view else params.messages
    s = params.sampling
    body = {
        "model": model,
        "messages": [{"role": "user" if m.role == "retrieved" else m.role, "content": m.content} for m in messages],
        "temperature": s.temperature,
        "top_p": s.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    length = params.max_new_tokens if view is None else view.budget["max_new_tokens"]
    if length is not None:  # not asked and not computed: the remote server's own default (the end of its context)
        body["max_tokens"] = length
    if top_logprobs > 0:
        body.update(logprobs=True, top_logprobs=top_logprobs)
    if s.seed is not None:
        body["seed"] = s.seed
    if s.top_k is not None:
        body["top_k"] = s.top_k  # vLLM and llama.cpp take it; a server that does not answers 400
    if params.stop:
        body["stop"] = list(params.stop)
    return {**body, **sampling_fields(params), **constraint_fields(params.constraint)}


def sampling_fields(params: GenerateParams) -> dict[str, Any]:
    """The sampling fields past OpenAI's own, sent only where they change the answer (so a server that
    lacks one is asked for it only when it matters): vLLM's names, which llama.cpp's server shares."""
    s = params.sampling
    fields = {
        "min_p": s.min_p or None,
        "frequency_penalty": s.frequency_penalty or None,
        "presence_penalty": s.presence_penalty or None,
        "repetition_penalty": s.repetition_penalty if s.repetition_penalty != 1.0 else None,
        "logit_bias": {str(token): bias for token, bias in s.logit_bias} or None,
        "min_tokens": params.min_new_tokens or None,
        "ignore_eos": params.ignore_eos or None,
    }
    return {name: value for name, value in fields.items() if value is not None}


def constraint_fields(constraint: Any) -> dict[str, Any]:
    """A constraint as the remote takes it: JSON as OpenAI's `response_format` (vLLM and llama.cpp
    read it), a regex, choice or grammar as vLLM's `structured_outputs`."""
    if constraint is None:
        return {}
    if constraint.kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if constraint.kind == "json_schema":
        schema = json.loads(constraint.spec)
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}
    value = json.loads(constraint.spec) if constraint.kind == "choice" else constraint.spec
    return {"structured_outputs": {constraint.kind: value}}
