"""The same request bodies sent to vLLM and to kvscope's own /v1 (each serving the bundled model): per
body and route, what each answered (HTTP status, the error's `param`, the answer's shape: finish
reason, usage, logprobs, the keys of the answer and its choice, and for greedy bodies whether the text
is the same). The bodies: the ordinary ones the `openai` SDK sends (built in here), plus every captured
client body in tests/data/client_bodies/ where that folder exists. Prints one JSON object, or with
--markdown the rows of docs/protocol.md's "kvscope and vLLM, field by field" table.

    .venv/bin/python scripts/vllm_serve.py --port 8001 &
    .venv/bin/kvscope serve --port 8002 --dtype float32 --served-model-name smol &
    .venv/bin/python scripts/vllm_bodies.py --vllm http://127.0.0.1:8001 --kvscope http://127.0.0.1:8002
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
CAPTURED = ROOT / "tests" / "data" / "client_bodies"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "Explain in one sentence what a KV cache stores."}]
GREEDY = {"temperature": 0, "max_tokens": 4}

# (name, route, body without `model`): one field at a time beside a greedy base, as clients send them.
BODIES: list[tuple[str, str, dict]] = [
    # Without max_tokens vLLM generates up to the context's end (max_model_len - prompt), kvscope 128:
    # temperature 0 and a short stop keep that body quick while showing both defaults' finish reasons.
    ("chat: no max_tokens (SDK defaults but greedy)", CHAT, {"messages": USER, "temperature": 0, "stop": ["."]}),
    ("chat: greedy, max_tokens", CHAT, {"messages": USER, **GREEDY}),
    ("chat: max_completion_tokens", CHAT, {"messages": USER, "temperature": 0, "max_completion_tokens": 4}),
    ("chat: stream", CHAT, {"messages": USER, **GREEDY, "stream": True}),
    ("chat: stream with include_usage", CHAT,
     {"messages": USER, **GREEDY, "stream": True, "stream_options": {"include_usage": True}}),
    ("chat: stream_options without stream", CHAT, {"messages": USER, **GREEDY, "stream_options": {"include_usage": True}}),
    ("chat: logprobs, top_logprobs 2", CHAT, {"messages": USER, **GREEDY, "logprobs": True, "top_logprobs": 2}),
    ("chat: top_logprobs 6", CHAT, {"messages": USER, **GREEDY, "logprobs": True, "top_logprobs": 6}),
    ("chat: top_logprobs without logprobs", CHAT, {"messages": USER, **GREEDY, "top_logprobs": 2}),
    ("chat: stop string", CHAT, {"messages": USER, **GREEDY, "stop": "cache"}),
    ("chat: stop list", CHAT, {"messages": USER, **GREEDY, "stop": ["cache", "\n"]}),
    ("chat: seed", CHAT, {"messages": USER, "max_tokens": 4, "seed": 7}),
    ("chat: n 2", CHAT, {"messages": USER, **GREEDY, "n": 2}),
    ("chat: temperature 5", CHAT, {"messages": USER, "max_tokens": 4, "temperature": 5}),
    ("chat: top_p 0", CHAT, {"messages": USER, "max_tokens": 4, "top_p": 0}),
    ("chat: top_k 1", CHAT, {"messages": USER, "max_tokens": 4, "top_k": 1}),
    ("chat: max_tokens 0", CHAT, {"messages": USER, "temperature": 0, "max_tokens": 0}),
    ("chat: max_tokens 100000", CHAT, {"messages": USER, "temperature": 0, "max_tokens": 100000}),
    ("chat: no messages", CHAT, {"max_tokens": 4}),
    ("chat: content as text parts", CHAT,
     {"messages": [{"role": "user", "content": [{"type": "text", "text": USER[0]["content"]}]}], **GREEDY}),
    ("chat: system and assistant turns", CHAT,
     {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello!"}, *USER], **GREEDY}),
    ("chat: user", CHAT, {"messages": USER, **GREEDY, "user": "student-7"}),
    ("chat: frequency_penalty", CHAT, {"messages": USER, **GREEDY, "frequency_penalty": 0.5}),
    ("chat: presence_penalty", CHAT, {"messages": USER, **GREEDY, "presence_penalty": 0.5}),
    ("chat: logit_bias", CHAT, {"messages": USER, **GREEDY, "logit_bias": {"42": -100}}),
    ("chat: response_format json_object", CHAT, {"messages": USER, **GREEDY, "response_format": {"type": "json_object"}}),
    ("chat: tools", CHAT, {"messages": USER, **GREEDY, "tools": [{"type": "function", "function": {
        "name": "now", "description": "the time", "parameters": {"type": "object", "properties": {}}}}]}),
    ("chat: an unknown field", CHAT, {"messages": USER, **GREEDY, "frobnicate": True}),
    ("chat: unknown model", CHAT, {"messages": USER, **GREEDY, "model": "gpt-4o"}),
    ("completions: prompt string", COMPLETIONS, {"prompt": "A KV cache is", **GREEDY}),
    ("completions: SDK defaults (no max_tokens)", COMPLETIONS, {"prompt": "A KV cache is", "temperature": 0}),
    ("completions: prompt list of one string", COMPLETIONS, {"prompt": ["A KV cache is"], **GREEDY}),
    ("completions: prompt as token ids", COMPLETIONS, {"prompt": [330, 42, 56, 18342, 314], **GREEDY}),
    ("completions: two prompts", COMPLETIONS, {"prompt": ["A KV cache is", "Paris is"], **GREEDY}),
    ("completions: logprobs 2", COMPLETIONS, {"prompt": "A KV cache is", **GREEDY, "logprobs": 2}),
    ("completions: echo", COMPLETIONS, {"prompt": "A KV cache is", **GREEDY, "echo": True}),
    ("completions: stream with include_usage", COMPLETIONS,
     {"prompt": "A KV cache is", **GREEDY, "stream": True, "stream_options": {"include_usage": True}}),
    ("completions: suffix", COMPLETIONS, {"prompt": "A KV cache is", **GREEDY, "suffix": "."}),
    ("completions: best_of 2", COMPLETIONS, {"prompt": "A KV cache is", **GREEDY, "best_of": 2}),
    ("completions: n 2", COMPLETIONS, {"prompt": "A KV cache is", **GREEDY, "n": 2}),
    ("completions: stop", COMPLETIONS, {"prompt": "A KV cache is", **GREEDY, "stop": [" data"]}),
]  # fmt: skip


def captured_bodies(folder: Path = CAPTURED, cap: int = 24) -> list[tuple[str, str, dict]]:
    """Every POST a captured client sent (tests/data/client_bodies/*.json: {client, version, requests:
    [{method, path, body}]}), named by the client and its place in the file. A body whose output may run
    past `cap` tokens (absent or larger `max_tokens`) is capped there, and its name says so: without a
    cap vLLM generates up to its context's end, minutes a body on these cores."""
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        data = json.loads(path.read_text())
        for i, request in enumerate(data.get("requests") or []):
            body = request.get("body")
            if request.get("method") != "POST" or not isinstance(body, dict):
                continue
            body = {k: v for k, v in body.items() if k != "model"}
            name = f"captured: {data.get('client')} {data.get('version')} #{i} {request['path']}"
            key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
            if request["path"] != "/tokenize" and not (isinstance(body.get(key), int) and body[key] <= cap):
                body[key] = cap
                name += f" ({key} capped at {cap})"
            out.append((name, request["path"], body))
    return out


def post(url: str, route: str, body: dict, timeout: float = 300) -> tuple[int, list[dict] | dict | str]:
    """(status, the JSON answer, or the stream's data chunks as a list, or the raw text)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", route, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read().decode("utf-8", "replace")
    finally:
        conn.close()
    if "text/event-stream" in (response.getheader("Content-Type") or ""):
        chunks = [line[5:].strip() for line in raw.splitlines() if line.startswith("data:")]
        return response.status, [json.loads(c) if c != "[DONE]" else "[DONE]" for c in chunks]
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw[:200]


def shape(status: int, answer) -> dict:
    """What a client reads from an answer, without the text itself (kept apart)."""
    if status != 200:
        error = answer.get("error", answer) if isinstance(answer, dict) else {"message": str(answer)}
        error = error if isinstance(error, dict) else {"message": str(error)}
        return {"status": status, "param": error.get("param"), "type": error.get("type"),
                "message": str(error.get("message", ""))[:160]}  # fmt: skip
    if isinstance(answer, list):  # a stream
        chunks = [c for c in answer if isinstance(c, dict)]
        choices = [ch for c in chunks for ch in c.get("choices") or []]
        reasons = [ch.get("finish_reason") for ch in choices if ch.get("finish_reason")]
        text = "".join((ch.get("delta") or {}).get("content") or ch.get("text") or "" for ch in choices)
        return {"status": 200, "stream": True, "chunks": len(chunks), "done": answer[-1:] == ["[DONE]"],
                "finish_reason": reasons, "usage_chunk": any(c.get("usage") and not c.get("choices") for c in chunks),
                "errors": [c["error"] for c in chunks if "error" in c], "text": text}  # fmt: skip
    choices = answer.get("choices") or []
    first = choices[0] if choices else {}
    text = (first.get("message") or {}).get("content") if "message" in first else first.get("text")
    logprobs = first.get("logprobs")
    return {
        "status": 200,
        "choices": len(choices),
        "finish_reason": [c.get("finish_reason") for c in choices],
        "usage": answer.get("usage") and {k: answer["usage"].get(k) for k in ("prompt_tokens", "completion_tokens")},
        "logprobs": None if logprobs is None else sorted(logprobs) if isinstance(logprobs, dict) else type(logprobs).__name__,
        "top_logprobs_per_token": top_count(logprobs),
        "answer_keys": sorted(answer),
        "choice_keys": sorted(first),
        "text": text,
    }  # fmt: skip


def top_count(logprobs) -> int | None:
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list) and logprobs["content"]:
        return len(logprobs["content"][0].get("top_logprobs") or [])
    if isinstance(logprobs.get("top_logprobs"), list) and logprobs["top_logprobs"]:
        return len(logprobs["top_logprobs"][0] or {})
    return None


def model_of(url: str) -> str:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.request("GET", "/v1/models")
    return json.loads(conn.getresponse().read())["data"][0]["id"]


def compare(vllm: str, kvscope: str, bodies: list[tuple[str, str, dict]], out=None) -> list[dict]:
    """Each body to both servers, in turn; each row also written to `out` (JSON lines) as it comes."""
    models = {"vllm": model_of(vllm), "kvscope": model_of(kvscope)}
    rows = []
    for name, route, body in bodies:
        row = {"name": name, "route": route, "body": body}
        for who, url in (("vllm", vllm), ("kvscope", kvscope)):
            sent = body if "model" in body else {"model": models[who], **body}
            row[who] = shape(*post(url, route, sent))
        a, b = row["vllm"], row["kvscope"]
        row["same_status"] = a["status"] == b["status"]
        row["same_text"] = a.get("text") == b.get("text") if a["status"] == b["status"] == 200 else None
        rows.append(row)
        if out is not None:
            out.write(json.dumps(row) + "\n")
            out.flush()
    return rows


def brief(s: dict) -> str:
    if s["status"] != 200:
        return f"{s['status']} `{s['param']}`" if s.get("param") else f"{s['status']}"
    reasons = ",".join(dict.fromkeys(r for r in s.get("finish_reason") or [] if r)) or "-"
    extra = []
    if s.get("stream"):
        extra.append("usage chunk" if s["usage_chunk"] else "no usage chunk")
    if s.get("choices", 1) != 1:
        extra.append(f"{s['choices']} choices")
    if s.get("top_logprobs_per_token") is not None:
        extra.append(f"{s['top_logprobs_per_token']} top")
    return f"200 {reasons}" + (f" ({', '.join(extra)})" if extra else "")


def markdown(rows: list[dict]) -> str:
    lines = ["| body | vLLM | kvscope | same text |", "|---|---|---|---|"]
    for r in rows:
        same = {True: "yes", False: "no", None: "-"}[r["same_text"]]
        lines.append(f"| {r['name']} | {brief(r['vllm'])} | {brief(r['kvscope'])} | {same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", required=True, help="vLLM's URL, e.g. http://127.0.0.1:8001")
    parser.add_argument(
        "--kvscope", required=True, help="kvscope's URL (the built-in engine), e.g. http://127.0.0.1:8002"
    )
    parser.add_argument("--markdown", action="store_true", help="print the table's rows instead of JSON")
    parser.add_argument("--rows", default="artifacts/vllm-bodies.jsonl", help="each row as it comes (JSON lines)")
    parser.add_argument("--captured-only", action="store_true", help="only the captured clients' bodies")
    args = parser.parse_args(argv)
    Path(args.rows).parent.mkdir(parents=True, exist_ok=True)
    bodies = ([] if args.captured_only else BODIES) + captured_bodies()
    with open(args.rows, "w") as out:
        rows = compare(args.vllm, args.kvscope, bodies, out)
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
