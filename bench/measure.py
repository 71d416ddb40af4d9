"""The measuring floor every benchmark stands on: the machine it ran on (recorded with every report), the
thing under test opened (an in-process engine, or a running `kvscope serve` over its WebSocket), the
deterministic prompts of a given token length, and the progress bar on stderr."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from model_runner.loading.cpu import cpu_name, isa_flags
from model_runner.protocol.errors import UserError
from model_runner.protocol.request import parse_generate

from .clients import InProcessClient, WebSocketClient

# ---- the machine ---------------------------------------------------------------------------------


def machine_info(facts) -> dict[str, Any]:
    """What every report records about where it ran: platform, the CPU's model name and vector flags, torch's
    kernel capability, threads, library versions, the device, and the load average at the start (the run adds
    the one at its end)."""
    import transformers

    kernels = kernel_facts()
    threads = kernels.pop("threads")
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        **kernels,
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "python": platform.python_version(),
        "transformers": transformers.__version__,
        "device": facts.device,
        "device_name": facts.device_name,
        "load_average_start": load_average(),
    }


def kernel_facts() -> dict[str, Any]:
    """What a kernel's timing depends on, for a script's JSON: the CPU, its vector flags, torch's kernel
    capability, torch's version and intra-op threads (a figure is this CPU's at these threads)."""
    import torch

    return {
        "cpu": cpu_name(),
        "cpu_flags": isa_flags(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the system has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---- the thing under test ------------------------------------------------------------------------


@dataclass
class Target:
    """The engine as the bench reaches it, and the model object the baselines run on."""

    mode: str
    client: Any
    loaded: Any  # LoadedModel: model, tokenizer adapter, facts
    describe: Callable[[Any], dict]  # GenerateParams -> describe_prompt's dict
    close: Callable[[], None]
    notes: list[str] = field(default_factory=list)


def open_target(args: argparse.Namespace, max_clients: int) -> Target:
    if args.via_websocket:
        return _websocket_target(args)
    from model_runner.local.engine import Engine, EngineConfig

    engine = Engine(
        EngineConfig(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            max_queue=max(64, max_clients),
            timeout_s=600.0,
            kv_cache_mb=getattr(args, "kv_cache_mb", None),
            decoder=getattr(args, "decoder", "auto"),
        )
    ).start()
    try:
        engine.wait_ready(900)
    except RuntimeError as exc:
        engine.shutdown()
        raise UserError(f"the model did not load: {exc}", code="model_failed", field="model") from None
    return Target("in-process", InProcessClient(engine), engine.loaded, engine.describe_prompt, engine.shutdown)


def _websocket_target(args: argparse.Namespace) -> Target:
    """The server runs the engine; this process loads the same model for prompts and baselines."""
    import urllib.request
    from urllib.parse import urlsplit

    from model_runner.loading.loader import load
    from model_runner.text.prompt import plan

    parts = urlsplit(args.via_websocket)
    if parts.scheme not in ("ws", "wss") or not parts.netloc:
        raise UserError(
            f"--via-websocket must be a ws:// or wss:// URL, got {args.via_websocket!r}", field="via_websocket"
        )
    http = f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}/api/model"
    try:
        with urllib.request.urlopen(http, timeout=10) as response:
            server = json.load(response)
    except OSError as exc:
        raise UserError(
            f"--via-websocket: cannot reach {http} ({exc}); is `kvscope serve` running?", field="via_websocket"
        ) from None
    if server.get("status") != "ready":
        raise UserError(
            f"--via-websocket: the server's model is {server.get('status')}; try again when it is ready",
            code="model_loading",
            field="via_websocket",
        )
    loaded = load(args.model, args.device, args.dtype)
    target = Target(
        "websocket",
        WebSocketClient(args.via_websocket),
        loaded,
        lambda params: plan(loaded.tokenizer, params, loaded.facts.context_window).to_dict(),
        lambda: None,
    )
    served = (server.get("facts") or {}).get("name")
    if served != loaded.facts.name:
        target.notes.append(
            f"the server runs {served!r} but the baselines ran {loaded.facts.name!r}: pass the "
            "server's model with --model"
        )
    target.notes.append(
        "over the WebSocket the baselines ran in the bench process, on its own copy of the same "
        "weights, while the server sat idle"
    )
    return target


# ---- prompts -------------------------------------------------------------------------------------

# Deterministic prompt text (kvscope's own words): an instruction that invites a long answer, then
# notes cycled as needed. A prompt of N tokens is the longest prefix of this that fits in N.
INSTRUCTION = "Write a long, detailed essay that explains the following notes, point by point."
NOTES = (
    "A language model reads the whole prompt in one pass, called prefill, and stores a key and a value "
    "for every token in every layer. Then it writes the answer one token at a time; each new token "
    "attends to everything stored so far, so the cache grows by one position per step. Prefill is limited "
    "by arithmetic, because many tokens share each weight read, while decoding is limited by memory, "
    "because every step reads all the weights to produce a single token. Queues form when more people "
    "ask than the model can serve, and the waiting shows up as time to first token. Streaming sends each "
    "piece of text as soon as it is ready, so a reader sees progress long before the answer is complete."
).split()


@dataclass(frozen=True)
class Prompt:
    target: int
    messages: list[dict[str, str]]
    ids: list[int]

    @property
    def tokens(self) -> int:
        return len(self.ids)


VARIANT_STRIDE = 11  # words the notes move on per prompt variant, so variants differ early


def prompt_text(words: int, variant: int = 0, suffix: str = "") -> str:
    """The first `words` words of the instruction followed by the notes, cycled (from word
    variant x VARIANT_STRIDE of the notes, so each variant is a different prompt), then `suffix`."""
    start = variant * VARIANT_STRIDE
    pool = INSTRUCTION.split() + [NOTES[(start + i) % len(NOTES)] for i in range(max(0, words))]
    return " ".join(pool[: max(1, words)]) + (f" {suffix}" if suffix else "")


def fit_prompt(describe: Callable[[Any], dict], target: int, variant: int = 0, suffix: str = "") -> Prompt:
    """The longest prompt (template included) of at most `target` tokens; the shortest one when even
    one word is over. Binary search over the word count: tokens only grow as words are added.
    Prompts with the same variant and different suffixes share their beginning (a common document
    with different questions after it)."""

    def tokens(words: int) -> tuple[int, list[int]] | None:
        messages = [{"role": "user", "content": prompt_text(words, variant, suffix)}]
        try:
            view = describe(parse_generate({"messages": messages, "max_new_tokens": 1}))
        except UserError:  # longer than the content limit or the context window
            return None
        return view["counts"]["total"], [t["id"] for t in view["tokens"]]

    low, high = 1, 2
    while (count := tokens(high)) is not None and count[0] <= target:
        low, high = high, high * 2
    while high - low > 1:  # invariant: low fits (or is the minimum), high does not
        mid = (low + high) // 2
        count = tokens(mid)
        low, high = (mid, high) if count is not None and count[0] <= target else (low, mid)
    fitted = tokens(low)
    if fitted is None:
        raise UserError("not even a one-word prompt fits this model's context window", field="prompt_lens")
    return Prompt(target, [{"role": "user", "content": prompt_text(low, variant, suffix)}], fitted[1])


# ---- progress ------------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal), with an
    ETA from the work done so far; work is weighted by tokens to process."""

    def __init__(self, total: float, enabled: bool = True, stream=None):
        self.total, self.done, self.enabled = max(total, 1e-9), 0.0, enabled
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def step(self, label: str, weight: float) -> None:
        if self.enabled:
            elapsed = time.monotonic() - self.started
            eta = f"{elapsed * (self.total - self.done) / self.done:4.0f}s left" if self.done else "   ? left"
            filled = int(24 * self.done / self.total)
            line = f"[{'#' * filled}{'.' * (24 - filled)}] {100 * self.done / self.total:3.0f}% {eta}  {label}"
            self.stream.write(f"\r{line:<110}" if self.tty else line + "\n")
            self.stream.flush()
        self.done += weight

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()


def work(prompt: int, output: int) -> float:
    """Relative cost of one generation, for the ETA: on 2 CPU cores a prefill token cost about a
    fifteenth of a decode step."""
    return prompt / 15 + output
