"""What kvscope asks the remote server: the streaming OpenAI chat request for a generate's
parameters, the fields a remote server cannot honour (refused by name), and the `accepted` event
with the prompt's counts where kvscope has the model's tokenizer (computed), null where it has not."""

from __future__ import annotations

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
    return body
