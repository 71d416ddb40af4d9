"""`kvscope bench --anchor llamacpp`: llama.cpp on the same GGUF, the same token ids and the same
greedy decoding as the engine, so its lone decode speed and prefill sit beside ours in one run;
through node-llama-cpp 3.21.1's prebuilt CPU binaries (or llama-cpp-python where installed), and a
plain sentence saying why when neither is there. `--anchor vllm` adds vLLM's CPU build (float32 on the
same weights, through its OpenAI-compatible server) to the same run: lone decode, prefill, N clients.
What each anchor adds to the `--dtypes` report: its medians, its answers against the reference route's,
each route's ratio over it, and its printed line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Callable, TextIO

from .report import agreement, fmt_num, judged, spread

NODE_PACKAGE, NODE_VERSION = "node-llama-cpp", "3.21.1"
SCRIPT = Path(__file__).with_name("anchor_node.mjs")
CONTEXT_SIZE = 2048
TIMEOUT_S = 900
ANCHOR_GOAL = ("min", 0.8)  # lone decode tokens/s over llama.cpp's on the same GGUF
NATIVE_ANCHOR_GOAL = ("min", 1.2)  # the native step's lone decode over llama.cpp's


@dataclass(frozen=True)
class Anchor:
    kind: str  # "node-llama-cpp" or "llama-cpp-python"
    where: str  # the folder holding node_modules/, or the Python module's version
    note: str = ""


def node_folder() -> Path:
    """Where the pinned node-llama-cpp is looked for: $KVSCOPE_LLAMACPP_NODE, else the kvscope cache."""
    from model_runner.loading.loader import cache_root

    override = os.environ.get("KVSCOPE_LLAMACPP_NODE")
    return Path(override) if override else cache_root() / "anchor" / f"{NODE_PACKAGE}-{NODE_VERSION}"


def install_hint() -> str:
    folder = node_folder()
    return (
        f"npm install --prefix {folder} --no-audit --no-fund {NODE_PACKAGE}@{NODE_VERSION} "
        "(prebuilt CPU binaries, about 700 MB), or pip install llama-cpp-python"
    )


def find_anchor() -> tuple[Anchor | None, str]:
    """(the llama.cpp found, "") or (None, why not, in one sentence with what to run)."""
    package = node_folder() / "node_modules" / NODE_PACKAGE / "package.json"
    node = shutil.which("node")
    if package.is_file() and node:
        version = json.loads(package.read_text()).get("version")
        if version == NODE_VERSION:
            return Anchor("node-llama-cpp", str(node_folder())), ""
        why = f"{package.parent} is version {version}, not the pinned {NODE_VERSION}"
    elif package.is_file():
        why = "node-llama-cpp is installed but `node` is not on PATH"
    else:
        why = f"node-llama-cpp {NODE_VERSION} is not installed in {node_folder()}"
    try:
        import llama_cpp  # type: ignore[import-not-found]

        return Anchor("llama-cpp-python", getattr(llama_cpp, "__version__", "?"), why), ""
    except ImportError:
        pass
    return None, f"llama.cpp is not available: {why}, and llama-cpp-python is not installed; run {install_hint()}"


def _run_node(anchor: Anchor, gguf: Path, prompts: list[list[int]], new_tokens: int, threads: int) -> dict:
    job = {"model": str(gguf), "threads": threads, "max_new_tokens": new_tokens, "prompts": prompts,
           "context_size": CONTEXT_SIZE, "version": NODE_VERSION}  # fmt: skip
    # An ES module resolves its imports from its own folder upwards (NODE_PATH does not apply): run a copy there.
    script = Path(anchor.where) / SCRIPT.name
    shutil.copyfile(SCRIPT, script)
    done = subprocess.run(
        ["node", str(script)], input=json.dumps(job), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"node-llama-cpp exited {done.returncode}: {last}")
    return json.loads(done.stdout)


def _run_python(gguf: Path, prompts: list[list[int]], new_tokens: int, threads: int) -> dict:
    from llama_cpp import Llama  # type: ignore[import-not-found]

    llm = Llama(model_path=str(gguf), n_ctx=CONTEXT_SIZE, n_threads=threads, verbose=False)
    answers = []
    for prompt in prompts:
        llm.reset()
        sent, stamps, tokens = time.perf_counter(), [], []
        for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            stamps.append((time.perf_counter() - sent) * 1000)
            tokens.append(token)  # an end token too, as the engine records it
            if token == llm.token_eos() or len(tokens) >= new_tokens:
                break
        answers.append({"tokens": tokens, "stamps_ms": stamps})
    return {"engine": "llama.cpp via llama-cpp-python", "threads": threads, "answers": answers}


def timings(answer: dict) -> dict:
    """Prefill = prompt sent -> first token; decode tokens/s as the engine's routes are taken (1000 / TPOT,
    bench/clients.py): the tokens after the first over the time from the first to the last, so a stall between
    tokens counts on both sides of a ratio alike."""
    stamps = answer["stamps_ms"]
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {
        "prefill_ms": stamps[0] if stamps else None,
        "decode_tokens_per_s": 1000 * len(gaps) / sum(gaps) if gaps else None,
        "median_gap_ms": median(gaps) if gaps else None,  # a typical token, stalls aside (both sides alike)
        "tokens": len(answer["tokens"]),
    }


def run_anchor(gguf: Path, lone: list[int], repeats: int, quality: list[list[int]], new_tokens: int,
               quality_tokens: int, threads: int) -> dict:  # fmt: skip
    """The lone prompt `repeats` times (decode tokens/s and prefill, medians), then the quality prompts'
    greedy answers; {"available": False, "why": ...} when no llama.cpp is found."""
    anchor, why = find_anchor()
    if anchor is None:
        return {"available": False, "why": why}

    def run(prompts, tokens):
        if anchor.kind == "node-llama-cpp":
            return _run_node(anchor, gguf, prompts, tokens, threads)
        return _run_python(gguf, prompts, tokens, threads)

    speed = run([lone] * (repeats + 1), new_tokens)  # the first answer warms the process up, untimed
    answers = run(quality, quality_tokens)["answers"] if quality else []
    measured = [timings(a) for a in speed["answers"][1:]]
    return {
        "available": True,
        "engine": speed["engine"],
        "where": anchor.where,
        "threads": speed.get("threads", threads),
        "lone_decode_tokens_per_s": [m["decode_tokens_per_s"] for m in measured],
        "typical_token_ms": [m["median_gap_ms"] for m in measured],
        "prefill_ms": [m["prefill_ms"] for m in measured],
        "quality_answers": [a["tokens"] for a in answers],
    }


# ---- vLLM's CPU build (`--anchor vllm`) -------------------------------------------------------------


def stream_completion(url: str, prompt: list[int], new_tokens: int, timeout: float = 300.0) -> dict:
    """One greedy streaming /v1/completions on token ids: the ids vLLM generated, an end-of-sequence id
    included (as the engine records its answers: a token event for the end token it chose), and the time
    (ms) from the request sent to each chunk."""
    import http.client
    from urllib.parse import urlsplit

    from .vllm_server import SERVED_NAME

    parts = urlsplit(url)
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True,
            "return_token_ids": True}  # fmt: skip
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        sent = time.perf_counter()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"vLLM answered HTTP {response.status}: {response.read(300)!r}")
        tokens, stamps = [], []
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            now = (time.perf_counter() - sent) * 1000
            for choice in json.loads(line[5:]).get("choices") or []:
                ids = choice.get("token_ids") or []
                tokens += ids
                stamps += [now] * len(ids)
    finally:
        conn.close()
    return {"tokens": tokens, "stamps_ms": stamps}


def concurrent_completions(url: str, prompts: list[list[int]], new_tokens: int) -> dict:
    """All prompts sent at once, one thread each: tokens generated and first send -> last token (s)."""
    from concurrent.futures import ThreadPoolExecutor

    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: stream_completion(url, p, new_tokens), prompts))
    wall = time.perf_counter() - start
    tokens = sum(len(a["tokens"]) for a in answers)
    return {"clients": len(prompts), "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else None}


def run_vllm_anchor(lone: list[int], batch: list[list[int]], repeats: int, quality: list[list[int]],
                    new_tokens: int, quality_tokens: int, log_path: Path) -> dict:  # fmt: skip
    """vLLM's CPU build on the bundled model's weights (float32), alone on the machine: started after the
    engine's turns (its worker must not share the cores with them), the lone prompt `repeats` times and the
    batch `repeats` times, alternating, then the quality prompts' greedy answers; stopped again.
    {"available": False, "why": ...} when vLLM is not installed or does not start."""
    from . import vllm_server

    python, why = vllm_server.find_python()
    if python is None:
        return {"available": False, "why": why}
    server = vllm_server.start(python, vllm_server.prepare_folder(), log_path)
    try:
        server.wait_ready()
        stream_completion(server.url, lone, 8)  # warm-up, untimed
        lone_runs, batched = [], []
        for _ in range(repeats):
            lone_runs.append(timings(stream_completion(server.url, lone, new_tokens)))
            batched.append(concurrent_completions(server.url, batch, new_tokens))
        answers = [stream_completion(server.url, q, quality_tokens)["tokens"] for q in quality]
        capacity = server.capacity()
        threads = re.search(r"local_rank=0, core ids=\[([\d, ]*)\]", server.log())
    except (RuntimeError, TimeoutError, OSError) as exc:
        return {"available": False, "why": f"vLLM did not run: {exc}"}
    finally:
        server.stop()
    return {
        "available": True,
        "engine": f"vLLM CPU ({vllm_server.VLLM_PIN}), float32, {vllm_server.KV_SPACE_GIB} GiB KV cache",
        "where": python,
        "threads": len(threads.group(1).split(",")) if threads else None,  # the cores vLLM bound its worker to
        "ready_s": round(server.ready_s or 0, 1),
        "capacity": capacity["line"] if capacity else None,
        "lone_decode_tokens_per_s": [m["decode_tokens_per_s"] for m in lone_runs],
        "typical_token_ms": [m["median_gap_ms"] for m in lone_runs],
        "prefill_ms": [m["prefill_ms"] for m in lone_runs],
        "batched_tokens_per_s": [b["tokens_per_s"] for b in batched],
        "quality_answers": answers,
    }


# ---- the anchors beside the routes of a `kvscope bench --dtypes` run ---------------------------------


def _token_ids(engine) -> Callable[[dict], list[int]]:
    """A generate payload -> the token ids the engine's chat template gives it: what each anchor is sent."""
    from model_runner.protocol.request import parse_generate
    from model_runner.text.prompt import plan

    tokenizer, window = engine.loaded.tokenizer, engine.loaded.facts.context_window
    return lambda payload: plan(tokenizer, parse_generate(payload), window).ids


def _summarized(result: dict, keys: tuple[str, ...], reference: list) -> dict:
    """An anchor's runs as medians with their spread, its greedy answers compared with the reference route's."""
    if result["available"]:
        for key in keys:
            result[key] = spread([v for v in result[key] if v is not None])
        result["agreement"] = agreement(result.pop("quality_answers"), reference)
    return result


def llamacpp_beside(args, lone: dict, engine, quality: list[dict], output: int, repeats: int, reference: list,
                    quality_tokens: int) -> dict | None:  # fmt: skip
    """llama.cpp on the bundled GGUF with the token ids the engine's chat template gives (None without
    --anchor); its greedy answers compared with the reference route's."""
    if not getattr(args, "anchor", None):
        return None
    if args.model != "default":
        return {"available": False, "why": "the llama.cpp anchor runs the bundled GGUF only (--model default)"}
    import torch

    from model_runner.loading.loader import find_default_gguf

    ids = _token_ids(engine)
    print("  llama.cpp anchor: the lone prompt, then the quality prompts", file=sys.stderr, flush=True)
    result = run_anchor(find_default_gguf(), ids(lone), repeats, [ids(q) for q in quality], output, quality_tokens,
                        torch.get_num_threads())  # fmt: skip
    return _summarized(result, ("lone_decode_tokens_per_s", "typical_token_ms", "prefill_ms"), reference)


def vllm_beside(args, payloads: list[dict], engine, quality: list[dict], output: int, repeats: int, reference: list,
                quality_tokens: int) -> dict | None:  # fmt: skip
    """vLLM's CPU build on the same weights and token ids (None without --anchor vllm); run after every
    engine turn, as its idle worker would take a core from them."""
    if getattr(args, "anchor", None) != "vllm":
        return None
    if args.model != "default":
        return {"available": False, "why": "the vLLM anchor serves the bundled model only (--model default)"}
    ids = _token_ids(engine)
    print("  vLLM anchor: starting vLLM (minutes), then the lone prompt, the batch, the quality prompts", file=sys.stderr,
          flush=True)  # fmt: skip
    log_path = Path(args.json or "bench-dtypes").with_suffix(".vllm.log")
    result = run_vllm_anchor(ids(payloads[0]), [ids(p) for p in payloads], repeats, [ids(q) for q in quality], output,
                             quality_tokens, log_path)  # fmt: skip
    keys = ("lone_decode_tokens_per_s", "typical_token_ms", "prefill_ms", "batched_tokens_per_s")
    return _summarized(result, keys, reference)


def llamacpp_ratios(rows: dict, anchor: dict | None) -> dict:
    """Each route's median lone decode tokens/s over llama.cpp's (separate turns of one run, so medians), and
    the same for a typical token (the median gap between tokens, stalls aside: a stall weighs on tokens/s)."""
    if not anchor or not anchor.get("available"):
        return {}
    report = {}
    for route, row in rows.items():
        native = (row.get("decoder") or {}).get("name") == "native"
        report[f"lone_{route}_over_llamacpp"] = _speed_ratio(
            row, anchor, "lone_decode_tokens_per_s", f"lone client: decode tokens/s, {route} / llama.cpp (medians)",
            NATIVE_ANCHOR_GOAL if native else ANCHOR_GOAL,
        )  # fmt: skip
        report[f"typical_{route}_over_llamacpp"] = _speed_ratio(
            row, anchor, "typical_token_ms", f"lone client: a typical token's speed, {route} / llama.cpp", None
        )
    return report


def _speed_ratio(row: dict, anchor: dict, key: str, what: str, goal) -> dict:
    """Ours over the anchor's, as a speed: tokens/s over tokens/s, or the anchor's time over ours."""
    ours, theirs = (row.get(key) or {}).get("median"), (anchor.get(key) or {}).get("median")
    value = None
    if ours and theirs:
        value = theirs / ours if key.endswith("_ms") else ours / theirs
    return judged(what, spread([value] if value else []), value, goal)


def vllm_ratios(rows: dict, vllm: dict | None) -> dict:
    """Each route's medians over vLLM's (separate turns of one run): lone decode, prefill, N clients."""
    if not vllm or not vllm.get("available"):
        return {}
    report = {}
    for route, row in rows.items():
        for name, key, what in (
            ("lone", "lone_decode_tokens_per_s", "lone client: decode tokens/s"),
            ("typical", "typical_token_ms", "lone client: a typical token's time"),
            ("prefill", "prefill_ms", "lone client: prefill time"),
            ("batched", "batched_tokens_per_s", "clients: aggregate tokens/s"),
        ):
            a, b = row[key]["median"], vllm[key]["median"]
            value = a / b if a and b else None
            report[f"{name}_{route}_over_vllm"] = judged(
                f"{what}, {route} / vLLM CPU (medians)", spread([value] if value else []), value, None
            )
    return report


def print_anchors(report: dict, clients: int, out: TextIO) -> None:
    """Each anchor asked for: what it measured beside the routes, or why it did not run."""
    for name, key, line in (("llama.cpp", "anchor", _llamacpp_line), ("vLLM", "vllm_anchor", _vllm_line)):
        result = report.get(key)
        if result is not None:
            ran = result["available"]
            print(line(result, clients) if ran else f"\n{name} anchor: not run: {result['why']}", file=out)


def _agreed(result: dict) -> str:
    a = result["agreement"]
    return f"{a['identical']}/{a['compared']} quality answers identical to the reference route's"


def _llamacpp_line(anchor: dict, clients: int) -> str:
    return (
        f"\nllama.cpp anchor ({anchor['engine']}, {anchor['threads']} threads, same GGUF and token ids): lone decode "
        f"{fmt_num(anchor['lone_decode_tokens_per_s']['median'])} tok/s, a typical token "
        f"{fmt_num((anchor.get('typical_token_ms') or {}).get('median'))} ms, prefill "
        f"{fmt_num(anchor['prefill_ms']['median'])} ms; {_agreed(anchor)}"
    )


def _vllm_line(vllm: dict, clients: int) -> str:
    return (
        f"\nvLLM anchor ({vllm['engine']}, worker on {vllm['threads'] or '?'} core(s), same weights and token ids, "
        f"alone on the machine): lone decode {fmt_num(vllm['lone_decode_tokens_per_s']['median'])} tok/s, a typical "
        f"token {fmt_num((vllm.get('typical_token_ms') or {}).get('median'))} ms, prefill "
        f"{fmt_num(vllm['prefill_ms']['median'])} ms, {clients} clients "
        f"{fmt_num(vllm['batched_tokens_per_s']['median'])} tok/s; {_agreed(vllm)}; ready after "
        f"{vllm['ready_s']:.0f} s; {vllm['capacity'] or 'no capacity line'}"
    )
