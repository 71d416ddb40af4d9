// The server's WebSocket events as this page relies on them: the type names, the fields each type
// carries with their JSON kinds, and the terminal set. It is a hand-written mirror of
// model_runner/protocol/events.py (no build step); tests/unit/test_js_protocol.py reads the JSON between the
// `protocol-json` markers and fails when it drifts from the dataclasses there (a type or field
// added, renamed or retyped), and when a script under static/js reads a snake_case name that
// neither this file nor the static data files declare. So a protocol change is made in both places.
//
// Kinds: int, num (a float), str, bool, obj (a JSON object), arr (a list); a trailing "?" means the
// field may be null or absent. Every event also carries the `common` fields.
// `model`, `budget` and `metrics` name the fields the page reads from /api/model's facts, from a
// budget (the `accepted` event, /api/prompt) and from a terminal event's `metrics`: each must exist
// on the server (model_runner/loading/loader.py ModelFacts, prompt.py, metrics.py); the server may send more.
// `feed` lists the fields of the engine feed's and the class's messages (built as dicts in
// model_runner/local/engine.py and app/classroom/routes.py), with `batch_row` and `kv` inside engine_step, and
// `policy`, `class_settings`, `class_info` and `experiments_list` the fields of /api/engine's policy,
// /api/class and GET /api/experiments; `experiment_results` the fields of an experiment's result that live
// runs carry and the shipped recordings (made before them) do not, so the data files cannot declare them.
const SPEC = /* protocol-json */ {
  "schema": 1,
  "common": {"type": "str", "schema": "int", "request_id": "str", "t_ms": "num"},
  "events": {
    "accepted": {"prompt_tokens": "int", "content_tokens": "int", "template_tokens": "int", "max_new_tokens": "int",
                 "context_window": "int", "budget": "obj", "delivery": "str", "kv_cache": "bool", "prefill_chunk": "int"},
    "queued": {"position": "int", "ahead": "int", "reason": "str"},
    "prefill_start": {"prompt_tokens": "int", "chunk_size": "int", "cached_tokens": "int"},
    "prefill_chunk": {"start": "int", "end": "int", "ms": "num", "cache_tokens": "int"},
    "prefill_end": {"tokens": "int", "ms": "num", "tokens_per_s": "num", "cache_tokens": "int",
                    "cache_bytes_measured": "int", "cache_bytes_formula": "int", "first_token": "obj",
                    "kv_blocks": "int", "kv_bytes_reserved": "int", "batch_size": "int"},
    "token": {"index": "int", "id": "int", "text": "str", "pending": "bool", "step_ms": "num", "cache_tokens": "int",
              "cache_bytes_measured": "int", "cache_bytes_formula": "int", "prob": "num", "candidates": "arr",
              "kv_blocks": "int", "kv_bytes_reserved": "int", "batch_size": "int", "mask": "obj?"},
    "attention": {"index": "int", "query_position": "int", "positions": "int", "bin_width": "int", "all": "obj",
                  "layers": "arr"},
    "preempted": {"blocks_freed": "int", "tokens": "int"},
    "resumed": {"tokens": "int"},
    "finished": {"reason": "str", "token_index": "int", "tokens": "int", "text": "str", "metrics": "obj"},
    "cancelled": {"reason": "str", "cause": "str", "state": "str", "tokens": "int", "text": "str", "metrics": "obj"},
    "error": {"code": "str", "message": "str", "field": "str?"}
  },
  "terminal": ["finished", "cancelled", "error"],
  "candidate": {"id": "int", "text": "str", "prob": "num"},
  "mask": {"allowed": "int", "first_allowed": "bool"},
  "model": ["name", "device", "device_name", "dtype", "layers", "attention_heads", "kv_heads", "head_dim",
            "bytes_per_element", "params", "context_window", "vocab_size", "weights_bytes", "kv_bytes_per_token",
            "weights_dtype", "quantization", "kv_dtype", "dtype_route", "dtype_reason", "cost_shape"],
  "budget": ["action", "prompt_tokens", "max_new_tokens", "requested_max_new_tokens", "context_window",
             "dropped_messages"],
  "metrics": ["ttft_ms", "e2e_ms", "decode_tokens_per_s", "first_text_ms"],
  "feed": {
    "engine_snapshot": ["waiting", "running", "steps", "preemptions", "prefix_hit_tokens", "policy", "kv"],
    "engine_step": ["step", "ms", "batch_tokens", "batch", "preempted", "prefix_hit_tokens", "kv", "waiting",
                    "running", "history"],
    "engine_submit": ["request", "label", "prompt_tokens", "prompt"],
    "engine_admit": ["request", "label", "prompt_tokens", "cached_tokens", "resumed", "waited_ms", "prompt"],
    "engine_preempt": ["request", "label", "blocks_freed"],
    "engine_end": ["request", "label", "outcome", "reason", "cause", "tokens", "blocks_freed", "answer"],
    "engine_policy": ["policy"],
    "class_state": ["laptops", "settings", "batch_invariant"],
    "class_stats": ["waiting", "running", "finished", "cancelled", "errors", "tokens_per_s", "ttft_ms", "tpot_ms",
                    "window_s", "feed_dropped"],
    "class_notice": ["show_prompts"],
    "class_stage": ["stage"]
  },
  "batch_row": ["request", "label", "kind", "tokens", "blocks", "shared_blocks"],
  "kv": ["total", "used", "cached", "free", "block_size", "bytes_per_block"],
  "policy": ["batching", "max_num_seqs", "max_batch_tokens", "chunked_prefill", "chunk_size", "prefix_caching", "batch_invariant"],
  "class_settings": ["paused", "show_prompts", "per_laptop_cap", "rate_per_min", "follow_stage"],
  "class_info": ["class_mode", "join_url", "teacher", "laptops", "settings", "policy", "batch_invariant"],
  "experiments_list": ["busy", "experiments", "name", "title", "available", "why_unavailable"],
  "experiment_results": ["held_by_median"]
} /* /protocol-json */;

export const SCHEMA_VERSION = SPEC.schema;
export const COMMON_FIELDS = Object.freeze(SPEC.common);
export const EVENT_FIELDS = Object.freeze(SPEC.events);
export const CANDIDATE_FIELDS = Object.freeze(SPEC.candidate);
export const MODEL_FACTS = Object.freeze(SPEC.model);

// Event type names to compare against (`e.type === EVENT.TOKEN`), so a misspelt type is an
// undefined property the protocol test catches rather than a string that silently never matches.
export const EVENT = Object.freeze({
  ACCEPTED: 'accepted',
  QUEUED: 'queued',
  PREFILL_START: 'prefill_start',
  PREFILL_CHUNK: 'prefill_chunk',
  PREFILL_END: 'prefill_end',
  TOKEN: 'token',
  ATTENTION: 'attention',
  PREEMPTED: 'preempted',
  RESUMED: 'resumed',
  FINISHED: 'finished',
  CANCELLED: 'cancelled',
  ERROR: 'error',
});

// The engine feed's and the class's message types (a `subscribe`d socket; docs/protocol.md "The engine
// feed" and "Classroom mode"), compared the same way: `e.type === FEED.CLASS_STAGE`.
export const FEED = Object.freeze({
  ENGINE_SNAPSHOT: 'engine_snapshot',
  ENGINE_STEP: 'engine_step',
  ENGINE_SUBMIT: 'engine_submit',
  ENGINE_ADMIT: 'engine_admit',
  ENGINE_PREEMPT: 'engine_preempt',
  ENGINE_END: 'engine_end',
  ENGINE_POLICY: 'engine_policy',
  CLASS_STATE: 'class_state',
  CLASS_STATS: 'class_stats',
  CLASS_NOTICE: 'class_notice',
  CLASS_STAGE: 'class_stage',
});

export const EVENT_TYPES = Object.freeze(Object.keys(SPEC.events));
export const TERMINAL_TYPES = Object.freeze([...SPEC.terminal]);
const TERMINAL = new Set(SPEC.terminal);

// Each request ends with exactly one terminal event; nothing for it follows.
export function isTerminal(type) {
  return TERMINAL.has(type);
}

// Not from the server: the `error` code ws-client.js settles with when the socket closes before a
// terminal event. Such an event has no `schema`, which every server event carries.
export const CONNECTION_LOST = 'connection_lost';

export function isConnectionLost(event) {
  return event.type === EVENT.ERROR && event.code === CONNECTION_LOST && event.schema == null;
}
