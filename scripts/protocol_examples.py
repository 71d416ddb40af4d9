"""Generates the JSON examples of docs/protocol.md from one real run of the default model, so the
token ids, texts, counts and timings shown there are ones the engine and the tokenizer produced:

    .venv/bin/python scripts/protocol_examples.py            # print the examples
    .venv/bin/python scripts/protocol_examples.py --write    # and rewrite them in docs/protocol.md

It runs the `generate` example of the page (system "Be brief.", user "What is a KV cache?") and the
`POST /api/prompt` example through kvscope's own engine, after one warm-up request, and replaces
each example block whose first object's `type` (or, for the HTTP answers, its shape) matches.
Numbers are shown as the engine reported them (times rounded to 0.1 ms, probabilities to 0.01);
lists are cut where the docs say so. tests/model/test_protocol_examples.py checks the result.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROTOCOL = ROOT / "docs" / "protocol.md"
REQUEST_ID = "r1"
# The `generate` example of docs/protocol.md (its `type` and `request_id` are the frame's).
GENERATE = {
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a KV cache?"}],
    "max_new_tokens": 64,
    "sampling": {"temperature": 0, "top_k": None, "top_p": 1.0, "seed": None},
    "stop": ["\n\n"],
    "delivery": "stream",
    "kv_cache": True,
    "prefill_chunk": 0,
    "overflow": "reject",
    "timeout_s": 60,
}
# The `POST /api/prompt` example: no system message, so SmolLM2's template inserts its own.
PROMPT = {"messages": [{"role": "user", "content": "What is a KV cache?"}], "max_new_tokens": 64}
CANDIDATES_SHOWN = 2  # the docs show the first candidates of five
ITL_SHOWN = 2  # and the first gaps of the itl_ms list
TOKEN_INDEX = 1  # the `token` example is the second generated token


def rounded(value, places: int = 1):
    """Times to 0.1 ms and probabilities to 0.01, recursively; integers and text as they are."""
    if isinstance(value, float):
        return round(value, places)
    if isinstance(value, dict):
        return {k: rounded(v, 2 if k == "prob" else places) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, places) for v in value]
    return value


def run(engine) -> dict[str, object]:
    """The examples, by name, from one real run of each documented request."""
    from app.api import public_facts
    from model_runner.protocol.request import LIMITS, parse_generate

    params = parse_generate(GENERATE)
    events = [e.to_dict() for e in engine.submit(params, REQUEST_ID)]
    first = {}
    for event in events:
        first.setdefault(event["type"], event)
    token = next(e for e in events if e["type"] == "token" and e["index"] == TOKEN_INDEX)
    prefill_end = rounded(first["prefill_end"])
    prefill_end["first_token"]["candidates"] = prefill_end["first_token"]["candidates"][:CANDIDATES_SHOWN]
    token = rounded(token)
    token["candidates"] = token["candidates"][:CANDIDATES_SHOWN]
    finished = rounded(events[-1])
    # Rounded from the exact figures, prefill is TTFT − queue again, so the example adds up on its own.
    metrics = finished["metrics"]
    metrics["prefill_ms"] = round(metrics["ttft_ms"] - metrics["queue_ms"], 1)
    metrics["itl_ms"] = metrics["itl_ms"][:ITL_SHOWN]
    prompt = engine.describe_prompt(parse_generate(PROMPT))
    content = [t for t in prompt["tokens"] if t["message"] is not None]
    shown = prompt["tokens"][:2] + [t for t in prompt["tokens"] if t["source"] == "inserted"][:1] + content[:1]
    return {
        "accepted": rounded(first["accepted"]),
        "prefill_start": rounded(first["prefill_start"]),
        "prefill_end": prefill_end,
        "token": token,
        "finished": finished,
        "api_model": {
            "status": "ready",
            "reason": None,
            "facts": public_facts(engine.facts),
            "limits": LIMITS,
        },
        "api_prompt": {**prompt, "tokens": shown},
    }


def layout(name: str, example: dict) -> str:
    """One example as the docs print it: one JSON object, wrapped near 110 columns."""
    if name == "api_prompt":
        tokens = ",\n            ".join(json.dumps(t, ensure_ascii=False) for t in example["tokens"])
        return (
            "{"
            + f'"rendered": {json.dumps(example["rendered"], ensure_ascii=False)},\n'
            + f' "tokens": [{tokens}],\n'
            + f' "counts": {json.dumps(example["counts"])},\n'
            + f' "budget": {wrap(json.dumps(example["budget"]), 100)}'
            + "}"
        )
    return wrap(json.dumps(example, ensure_ascii=False))


def wrap(text: str, width: int = 110) -> str:
    """Break a one-line JSON text after `, ` between values (never inside a string, where a line
    break would not be JSON) so lines stay near `width`."""
    lines, line = [], ""
    for part in json_parts(text):
        if line and len(line) + len(part) > width:
            lines.append(line.rstrip())
            line = " " + part
        else:
            line += part
    lines.append(line)
    return "\n".join(lines)


def json_parts(text: str) -> list[str]:
    """`text` cut after each `, ` that stands outside a JSON string."""
    parts, start, in_string, escaped = [], 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == " " and text[i - 1 : i] == ",":
            parts.append(text[start : i + 1])
            start = i + 1
    return parts + [text[start:]]


def block_name(block: str) -> str | None:
    """Which generated example a ```json block of the docs holds, if any."""
    try:
        value = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    if value.get("request_id") == REQUEST_ID and value.get("type") in {
        "accepted",
        "prefill_start",
        "prefill_end",
        "token",
        "finished",
    }:
        return value["type"]
    if "facts" in value and "limits" in value:
        return "api_model"
    if "rendered" in value and "tokens" in value:
        return "api_prompt"
    return None


def rewrite(text: str, examples: dict[str, object]) -> tuple[str, list[str]]:
    done: list[str] = []

    def replace(match: re.Match) -> str:
        name = block_name(match.group(1))
        if name is None or name not in examples:
            return match.group(0)
        done.append(name)
        return "```json\n" + layout(name, examples[name]) + "\n```"

    return re.sub(r"```json\n(.*?)\n```", replace, text, flags=re.S), done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the examples in docs/protocol.md")
    parser.add_argument("--model", default="default")
    args = parser.parse_args(argv)

    from model_runner.local.engine import Engine, EngineConfig
    from model_runner.protocol.request import parse_generate

    engine = Engine(EngineConfig(model=args.model)).start()
    try:
        engine.wait_ready(600)
        for _ in engine.submit(parse_generate({**GENERATE, "max_new_tokens": 2}), "warm-up"):
            pass
        examples = run(engine)
    finally:
        engine.shutdown()
    for name, example in examples.items():
        print(f"--- {name}\n{layout(name, example)}")
    if args.write:
        text, done = rewrite(PROTOCOL.read_text(encoding="utf-8"), examples)
        missing = sorted(set(examples) - set(done))
        if missing:
            print(f"protocol_examples: no block found in docs/protocol.md for {', '.join(missing)}", file=sys.stderr)
            return 1
        PROTOCOL.write_text(text, encoding="utf-8")
        print(f"protocol_examples: rewrote {len(done)} examples in {PROTOCOL.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
