"""The engine's settings and the server's limits, in one place: the engine reads EngineConfig, the
Flask app's DEFAULTS and the `kvscope serve` flags take their defaults from the same constants."""

from __future__ import annotations

from dataclasses import dataclass, field

from model_runner.shared.policy import Policy

MAX_QUEUE = 64  # requests waiting at once; the next one is answered `overloaded` at once
TIMEOUT_S = 120.0  # server-side limit per request, from submit
EVENT_BUFFER = 1024  # events a client may fall behind before it is dropped as slow
BLOCK_SIZE = 16  # tokens per paged KV block (vLLM's default)
POLICY = Policy()  # continuous batching, 16 requests, 512 tokens a step, chunking and prefix caching off
CUDA_GRAPHS = "auto"  # decode steps replayed as CUDA graphs where the device is CUDA
DECODERS = ("auto", "native", "transformers")  # local/model/decoders.py
COMPILE = ("auto", "on", "off")  # local/model/compiled.py: the native step's decode stretches compiled ahead of time
COMPILE_HELP = (
    "the native step's int4 decode stretches compiled ahead of time by AOTInductor, in the background while the "
    "eager step serves, then kept in the cache: auto (on a CPU where they measured faster), on, off"
)
DECODER_HELP = (
    "which code runs a step: auto (native for Llama-family models: Llama, SmolLM2, Qwen2, Qwen3; transformers for "
    "the rest), native (kvscope's plain-torch decoder step over the paged pool) or transformers (the model's own "
    "forward through transformers' paged attention)"
)


@dataclass(frozen=True)
class EngineConfig:
    model: str = "default"  # "default" (bundled SmolLM2-135M-Instruct), "fake" (tests), a hub id or a path
    device: str = "auto"
    dtype: str = "auto"
    max_queue: int = MAX_QUEUE
    timeout_s: float = TIMEOUT_S
    event_buffer: int = EVENT_BUFFER
    block_size: int = BLOCK_SIZE
    kv_cache_mb: float | None = None  # the paged pool's size; None = room for one full context window
    # The starting policy (batch-invariant mode among its fields); changed at run time by Engine.set_policy.
    policy: Policy = field(default_factory=lambda: POLICY)
    feed_text: bool = False  # allow prompt and answer text in the engine feed (observers)
    # Decode steps as CUDA graphs: "auto" (on CUDA), "off" (eager), "padded" (the graphs' padded step, no
    # graph: how the CPU tests it). See local/step/graphs.py.
    cuda_graphs: str = CUDA_GRAPHS
    # Which decoder runs a step (local/model/decoders.py): auto (native for the Llama family), native or transformers.
    decoder: str = "auto"
    # The native step's decode stretches compiled ahead of time (local/model/compiled.py): off for an engine made in
    # a process (tests, the bench, scripts), auto for `kvscope serve` (the app's DEFAULTS).
    compile: str = "off"
