"""The remote engine against a fake OpenAI-compatible server in this process: tokens come from the
remote stream with kvscope's clock, and every way the remote can fail (refused, stalled, died mid-answer,
malformed SSE, an HTTP error) ends the request with exactly one terminal event and a message naming it."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kvscope_testkit import ask, events_of, free_port, terminals, wait_until

from model_runner.protocol.errors import UserError
from model_runner.remote.engine import RemoteConfig, RemoteEngine
from model_runner.remote.facts import parse_metrics
from model_runner.remote.http import parse_url

WORDS = ["Caches", " keep", " keys", " and", " values", "."]
METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 40.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
"""


def chunk(content=None, finish=None, logprob=None, usage=None):
    choice = {"index": 0, "delta": {} if content is None else {"content": content}, "finish_reason": finish}
    if logprob is not None:
        tops = [{"token": content, "logprob": logprob}, {"token": " other", "logprob": -2.5}]
        choice["logprobs"] = {"content": [{"token": content, "logprob": logprob, "top_logprobs": tops}]}
    body = {"id": "x", "object": "chat.completion.chunk", "choices": [] if usage else [choice]}
    if usage:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n".encode()


class FakeRemote(BaseHTTPRequestHandler):
    """Streams WORDS as SSE; `server.mode` makes it misbehave."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "fake-remote", "max_model_len": 2048}]})
        elif self.path == "/metrics":
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._json(404, {"error": {"message": "no such path"}})

    def do_POST(self):
        server = self.server
        server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        mode = server.mode
        if mode == "http_error":
            self._json(400, {"error": {"message": "`max_tokens` is too large", "param": "max_tokens"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            self._stream(mode)
        except OSError:
            server.closed_by_client.set()  # the client closed the stream: the server sees it here

    def _stream(self, mode):
        server = self.server
        self.wfile.write(chunk(""))
        for i, word in enumerate(WORDS):
            if mode == "die" and i == 2:
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if mode == "malformed" and i == 2:
                self.wfile.write(b"this is not an event stream\n\n")
                self.wfile.flush()
                time.sleep(1)
                return
            if mode == "stall" and i == 2:
                server.release.wait(10)
                return
            self.wfile.write(chunk(word, logprob=-0.1 * (i + 1)))
            self.wfile.flush()
            time.sleep(server.delay)
        self.wfile.write(chunk(finish="stop"))
        self.wfile.write(chunk(usage={"prompt_tokens": 9, "completion_tokens": len(WORDS), "total_tokens": 15}))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _json(self, status, body):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def remote():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRemote)
    server.daemon_threads = True
    server.mode, server.delay, server.bodies = "ok", 0.0, []
    server.closed_by_client, server.release = threading.Event(), threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def engine_for(url: str, **config) -> RemoteEngine:
    engine = RemoteEngine(RemoteConfig(url=f"openai:{url}", metrics_every_s=0.2, **config)).start()
    return engine


@pytest.fixture
def engine(remote):
    engine = engine_for(f"http://127.0.0.1:{remote.server_address[1]}", stall_s=1.0)
    engine.wait_ready(10)
    yield engine
    engine.shutdown()


def one_terminal(events):
    ends = terminals(events)
    assert len(ends) == 1 and events[-1] is ends[0], [e["type"] for e in events]
    return ends[0]


def test_tokens_come_from_the_remote_stream_with_kvscope_timing(engine, remote):
    events = events_of(engine.submit(ask("hi", max_new_tokens=20), "r1"), timeout=10)
    end = one_terminal(events)
    tokens = [e for e in events if e["type"] == "token"]
    assert events[0]["type"] == "accepted"
    assert [t["text"] for t in tokens] == WORDS
    assert [t["index"] for t in tokens] == list(range(len(WORDS)))
    assert end["type"] == "finished" and end["reason"] == "eos" and end["text"] == "".join(WORDS)
    assert end["tokens"] == len(WORDS)
    # candidates from top_logprobs; probabilities from the logprobs the server sent
    assert tokens[0]["candidates"][0]["text"] == WORDS[0] and tokens[0]["prob"] == pytest.approx(0.904837, rel=1e-4)
    # measured at kvscope: TTFT and E2E from its own clock; queue vs prefill is not visible
    metrics = end["metrics"]
    assert metrics["ttft_ms"] == pytest.approx(tokens[0]["t_ms"], abs=0.01)
    assert metrics["e2e_ms"] >= metrics["ttft_ms"] and metrics["queue_ms"] is None and metrics["prefill_ms"] is None
    assert all(t["cache_bytes_measured"] is None and t["kv_blocks"] is None for t in tokens)
    # what went upstream: a streaming request with logprobs and the request's own fields
    sent = remote.bodies[-1]
    assert sent["stream"] and sent["logprobs"] and sent["max_tokens"] == 20 and sent["model"] == "fake-remote"


def test_an_answer_without_a_length_leaves_the_length_to_the_remote_server(engine, remote):
    # /v1's missing max_tokens is None in the engine; with no tokenizer to count the room left, none is sent.
    events = events_of(engine.submit(dataclasses.replace(ask("hi"), max_new_tokens=None), "r1"), timeout=10)
    assert one_terminal(events)["type"] == "finished" and events[0]["max_new_tokens"] is None
    assert "max_tokens" not in remote.bodies[-1]


def test_facts_come_from_the_server_and_kv_bytes_are_not_invented(engine):
    facts = engine.facts.to_dict()
    assert facts["name"] == "fake-remote" and facts["context_window"] == 2048
    assert facts["kv_bytes_per_token"] is None and facts["layers"] is None


def test_engine_config_gives_computed_kv_bytes_per_token(remote, tmp_path):
    cfg = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "bfloat16"}))
    engine = engine_for(f"http://127.0.0.1:{remote.server_address[1]}", engine_config=str(tmp_path))
    try:
        engine.wait_ready(10)
        assert engine.facts.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
        assert engine.facts.provenance["kv_bytes_per_token"].startswith("computed")
    finally:
        engine.shutdown()


def test_server_metrics_are_polled_and_labelled(engine):
    wait_until(lambda: engine.snapshot()["server"].get("visible"), "the server's /metrics read")
    snap = engine.snapshot()
    assert snap["running"] == 3 and snap["waiting"] == 2
    assert snap["server"]["kv_cache_usage_perc"] == 0.25 and snap["server"]["prefix_cache_hits"] == 40
    assert snap["server"]["provenance"] == "measured by the server (its /metrics)"


def test_parse_metrics_keeps_absent_names_absent():
    assert parse_metrics("# nothing\nother_metric 3\n") == {}
    assert parse_metrics(METRICS)["prefix_cache_queries"] == 100


def test_refused_connection_ends_with_one_error_naming_the_server():
    port = free_port()  # nothing listens there
    engine = RemoteEngine(RemoteConfig(url=f"openai:http://127.0.0.1:{port}", metrics_every_s=0))
    engine._status, engine._facts = "ready", None  # as if it had answered before going away
    from model_runner.remote.facts import facts_from

    engine._facts = facts_from("m", engine.root, {}, {})
    end = one_terminal(events_of(engine.submit(ask("hi"), "r1"), timeout=10))
    assert end["type"] == "error" and end["code"] == "remote_unavailable"
    assert f"the remote server at http://127.0.0.1:{port} refused the connection" in end["message"]


def test_unreachable_server_keeps_the_engine_loading_with_the_reason():
    engine = engine_for(f"http://127.0.0.1:{free_port()}")
    try:
        wait_until(lambda: "refused" in (engine.status()["reason"] or ""), "the reason")
        with pytest.raises(UserError) as info:
            engine.submit(ask("hi"))
        assert info.value.code == "model_loading" and "refused the connection" in info.value.message
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    "mode, code, words",
    [
        ("die", "remote_died", "mid-answer"),
        ("malformed", "remote_malformed", "malformed event stream"),
        ("stall", "remote_timeout", "sent nothing for 1 s"),
        ("http_error", "invalid_request", "answered HTTP 400: `max_tokens` is too large"),
    ],
)
def test_each_remote_failure_ends_with_one_clear_error(engine, remote, mode, code, words):
    remote.mode = mode
    started = time.monotonic()
    events = events_of(engine.submit(ask("hi"), "r1"), timeout=10)
    end = one_terminal(events)
    assert end["type"] == "error" and end["code"] == code, end
    assert words in end["message"] and engine.root in end["message"]
    assert time.monotonic() - started < 5  # nothing hangs
    assert engine.active == 0


def test_cancel_ends_at_once_and_closes_the_upstream_stream(engine, remote):
    remote.delay = 0.3
    handle = engine.submit(ask("hi"), "r1")
    wait_until(lambda: engine.active and remote.bodies, "the request upstream")
    time.sleep(0.4)
    handle.cancel("client")
    end = one_terminal(events_of(handle, timeout=5))
    assert end["type"] == "cancelled" and end["cause"] == "client"
    assert remote.closed_by_client.wait(5), "the fake server never saw the stream close"


def test_a_request_over_its_time_limit_finishes_with_timeout(engine, remote):
    remote.delay = 0.4
    end = one_terminal(events_of(engine.submit(ask("hi", timeout_s=0.6), "r1"), timeout=10))
    assert end["type"] == "finished" and end["reason"] == "timeout" and 0 < end["tokens"] < len(WORDS)


def test_fields_the_remote_cannot_honour_are_refused_by_name(engine):
    refused = (
        ({"kv_cache": False}, "kv_cache"),
        ({"prefill_chunk": 8}, "prefill_chunk"),
        ({"inspect": {"attention": True}}, "inspect.attention"),
    )
    for fields, name in refused:
        with pytest.raises(UserError) as info:
            engine.submit(ask("hi", **fields))
        assert info.value.field == name
    raw = dataclasses.replace(ask("hi"), chat_template=False)  # /v1/completions' raw text
    with pytest.raises(UserError) as info:
        engine.submit(raw)
    assert info.value.field == "prompt"
    with pytest.raises(UserError) as info:
        engine.set_policy({"max_num_seqs": 1})
    assert info.value.code == "not_supported"
    with pytest.raises(UserError) as info:
        engine.describe_prompt(ask("hi"))
    assert info.value.code == "not_visible"


def test_wrong_engine_model_fails_with_the_served_names(remote):
    engine = engine_for(f"http://127.0.0.1:{remote.server_address[1]}", model="other")
    try:
        wait_until(lambda: engine.status()["status"] == "failed", "the engine to give up")
        assert "serves fake-remote, not 'other'" in engine.status()["reason"]
    finally:
        engine.shutdown()


def test_end_listeners_hear_each_end_once(engine, remote):
    heard = []
    engine.add_end_listener(lambda seq, event: heard.append((seq.id, event["type"], event["metrics"]["ttft_ms"])))
    events_of(engine.submit(ask("hi"), "r1"), timeout=10)
    remote.delay = 0.3
    handle = engine.submit(ask("hi"), "r2")
    handle.cancel("client")
    end = one_terminal(events_of(handle, timeout=5))
    assert end["type"] == "cancelled" and end["state"] == "waiting"  # cancelled before its first token
    assert [h[:2] for h in heard] == [("r1", "finished"), ("r2", "cancelled")] and heard[0][2] > 0


def test_top_logprobs_zero_asks_for_none(remote):
    engine = engine_for(f"http://127.0.0.1:{remote.server_address[1]}", top_logprobs=0)
    try:
        engine.wait_ready(10)
        one_terminal(events_of(engine.submit(ask("hi"), "r1"), timeout=10))
        assert "logprobs" not in remote.bodies[-1] and "top_logprobs" not in remote.bodies[-1]
    finally:
        engine.shutdown()


def test_the_class_view_s_cancel_all_and_feed_text_work_on_a_remote_engine(engine, remote):
    # A class on a remote engine: "show prompts" passes feed_text (the remote feed has no text to add),
    # and the teacher's cancel-all ends every request with one terminal event and closes its stream.
    remote.delay = 0.3
    handles = [engine.submit(ask("hi"), f"r{i}", label=f"laptop {i}", feed_text=True) for i in range(2)]
    wait_until(lambda: len(remote.bodies) == 2, "both requests upstream")
    assert engine.cancel_all("teacher") == 2
    for handle in handles:
        end = one_terminal(events_of(handle, timeout=5))
        assert end["type"] == "cancelled" and end["cause"] == "teacher"
    assert engine.active == 0 and remote.closed_by_client.wait(5)


def test_a_teachers_cancel_all_reaches_the_class_feed_with_its_cause_on_a_remote_engine(engine, remote):
    # The class view says "cancelled by the teacher" from the feed's engine_end `cause`: both engines
    # build that message in one place (model_runner/shared/endings.py), so the remote one carries it too.
    remote.delay = 0.3
    feed = engine.feed.subscribe(capacity=1000)
    try:
        handles = [engine.submit(ask("hi"), f"r{i}", label=f"laptop {i}") for i in range(2)]
        wait_until(lambda: len(remote.bodies) == 2, "both requests upstream")
        engine.cancel_all("teacher")
        for handle in handles:
            one_terminal(events_of(handle, timeout=5))
        ends = []
        while len(ends) < 2:
            event = feed.next_event(timeout=5)
            assert event is not None, "the feed went quiet before both ends"
            ends += [event] if event["type"] == "engine_end" else []
        assert [(e["outcome"], e["cause"], e["blocks_freed"]) for e in ends] == [("cancelled", "teacher", None)] * 2
    finally:
        feed.close()


def test_an_engine_url_with_a_password_is_refused_so_it_never_reaches_the_page():
    with pytest.raises(UserError, match="must not carry a user or password") as refused:
        parse_url("openai:http://user:secret@gpu-box:8000")
    assert refused.value.field == "engine" and "secret" not in refused.value.message


def test_every_sampling_field_the_built_in_engine_implements_is_forwarded(engine, remote):
    sampling = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 3, "frequency_penalty": 0.5}
    sampling |= {"presence_penalty": -0.5, "repetition_penalty": 1.2, "logit_bias": {"42": -100}}
    one_terminal(events_of(engine.submit(ask("hi", sampling=sampling, min_new_tokens=2, ignore_eos=True)), timeout=10))
    sent = remote.bodies[-1]
    assert {k: sent[k] for k in ("temperature", "top_p", "top_k", "min_p", "seed")} == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 3
    }  # fmt: skip
    assert (sent["frequency_penalty"], sent["presence_penalty"], sent["repetition_penalty"]) == (0.5, -0.5, 1.2)
    assert sent["logit_bias"] == {"42": -100} and sent["min_tokens"] == 2 and sent["ignore_eos"] is True


def test_fields_at_their_neutral_values_are_not_sent(engine, remote):
    one_terminal(events_of(engine.submit(ask("hi")), timeout=10))
    sent = remote.bodies[-1]
    neutral = ("min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "min_tokens")
    assert not set(sent) & {*neutral, "ignore_eos", "response_format", "structured_outputs"}


@pytest.mark.parametrize(
    "kind, spec, sent",
    [
        ("json_object", "", {"response_format": {"type": "json_object"}}),
        (
            "json_schema",
            '{"type": "object"}',
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "schema": {"type": "object"}},
                }
            },
        ),
        ("regex", "[ab]+", {"structured_outputs": {"regex": "[ab]+"}}),
        ("choice", '["yes", "no"]', {"structured_outputs": {"choice": ["yes", "no"]}}),
        ("grammar", 'root ::= "x"', {"structured_outputs": {"grammar": 'root ::= "x"'}}),
    ],
)
def test_a_constraint_is_forwarded_as_vllm_takes_it(engine, remote, kind, spec, sent):
    from model_runner.protocol.constraint import Constraint

    params = dataclasses.replace(ask("hi"), constraint=Constraint(kind, spec, "f"))
    one_terminal(events_of(engine.submit(params), timeout=10))
    assert {k: remote.bodies[-1][k] for k in sent} == sent


def test_a_json_schema_is_forwarded_as_sent_in_its_key_order_and_its_keywords(engine, remote):
    from app import create_app

    client = create_app({"TESTING": True, "ENGINE": engine}).test_client()
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    # uniqueItems: the built-in engine refuses it (xgrammar would not enforce it); the server decides here.
    schema["properties"]["tags"] = {"type": "array", "uniqueItems": True}
    schema["required"] = ["name", "age"]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": fmt, "stream": True}
    # As text: the test client's json= would sort the keys itself (Flask's JSON provider does).
    client.post("/v1/chat/completions", data=json.dumps(body), content_type="application/json").get_data()
    sent = remote.bodies[-1]["response_format"]["json_schema"]["schema"]
    assert json.dumps(sent) == json.dumps(schema)  # the same text, keys in the same order


def test_through_the_api_a_remote_answers_what_it_takes_and_its_400_names_the_field(engine, remote):
    from app import create_app

    client = create_app({"TESTING": True, "ENGINE": engine}).test_client()
    fields = {"min_p": 0.1, "repetition_penalty": 1.1, "structured_outputs": {"regex": "[a-z ]+"}, "stream": True}
    # Streamed: without --engine-config the prompt's token count is not visible, so no usage is asked.
    answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **fields})
    deltas = [json.loads(line[6:]) for line in answer.get_data(as_text=True).splitlines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in deltas if c["choices"])
    assert answer.status_code == 200 and text == "".join(WORDS)
    assert remote.bodies[-1]["structured_outputs"] == {"regex": "[a-z ]+"} and remote.bodies[-1]["min_p"] == 0.1
    remote.mode = "http_error"  # the server refuses a field: its 400 comes back naming it
    refused = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "min_p": 0.1})
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "max_tokens"
