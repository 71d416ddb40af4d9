"""static/js/trace.js and the walkthrough's pure modules (stages.js, layout.js), run in Debian's
Chromium against the shipped trace: parsing refuses what it should, the derived run matches the
events, and every stage's state depends on (stage, run) alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = json.loads((ROOT / "static/data/trace-example.json").read_text(encoding="utf-8"))
TOKENS = [e for e in TRACE["events"] if e["type"] == "token"]


@pytest.fixture
def js(page, static_url):
    """Runs an async JS function body with `trace`, `stages`, `layout` modules and the shipped `T` in scope."""
    page.goto(static_url + "/static/data/trace-example.json")

    def run(body: str, arg=None):
        return page.evaluate(
            f"""async (arg) => {{
          const trace = await import('/static/js/trace.js');
          const stages = await import('/static/js/walkthrough/stages.js');
          const layout = await import('/static/js/walkthrough/layout.js');
          const context = await import('/static/js/walkthrough/context.js');
          const route = await import('/static/js/shared/route.js');
          const roofline = await import('/static/js/shared/roofline.js');
          const T = await (await fetch('/static/data/trace-example.json')).json();
          {body}
        }}""",
            arg,
        )

    return run


def test_parse_accepts_the_shipped_trace_from_text_and_object(js):
    assert js("return [trace.parseTrace(JSON.stringify(T)).events.length, trace.parseTrace(T).format];") == [
        len(TRACE["events"]),
        "kvscope-trace",
    ]


@pytest.mark.parametrize(
    "change, problem",
    [
        ("t.format = 'x'", "format"),
        ("t.version = 2", "version"),
        ("delete t.model.kv_heads", "kv_heads"),
        ("t.events.pop()", "terminal"),
        ("t.events.splice(t.events.findIndex((e) => e.type === 'token' && e.index === 2), 1)", "expected 2"),
        ("t.events.find((e) => e.type === 'token').t_ms = -5", "back in time"),
        ("t.events[0].type = 'surprise'", "not a protocol event"),
        ("t.events.find((e) => e.type === 'token').text = 7", "text"),
        ("t.prompt = {tokens: 'no'}", "prompt.tokens"),
    ],
)
def test_parse_refuses_a_broken_trace_naming_the_problem(js, change, problem):
    result = js(f"""const t = structuredClone(T); {change};
      try {{ trace.parseTrace(t); return null; }} catch (e) {{ return [e.name, e.problems.join(' | ')]; }}""")
    assert result is not None and result[0] == "TraceError"
    assert problem in result[1]


def test_parse_refuses_text_that_is_not_json(js):
    assert js("try { trace.parseTrace('{oops'); } catch (e) { return e.problems[0]; }").startswith("not JSON")


def test_a_run_in_progress_passes_only_when_allowed(js):
    assert js("""const t = structuredClone(T); t.events = t.events.slice(0, 6);
      return [trace.validateTrace(t).length > 0, trace.validateTrace(t, {complete: false})];""") == [True, []]


def test_derived_run_matches_the_events(js):
    run = js("return trace.deriveRun(T);")
    end, prefill = TRACE["events"][-1], next(e for e in TRACE["events"] if e["type"] == "prefill_end")
    assert run["text"] == end["text"] and len(run["tokens"]) == len(TOKENS)
    assert run["prefill"]["ms"] == prefill["ms"] and run["prefill"]["done"]
    assert run["cache"]["tokens"] == TOKENS[-1]["cache_tokens"]
    assert run["end"]["reason"] == end["reason"] and run["end"]["complete"]
    assert run["phase"] == "end" and run["measured"]
    assert [m["role"] for m in run["messages"]] == [m["role"] for m in TRACE["request"]["messages"]]
    assert sum(m["tokens"] for m in run["messages"]) == TRACE["prompt"]["counts"]["content"]
    word = run["splitWord"]
    assert len(word["pieces"]) >= 2 and "".join(word["pieces"]).strip() == word["word"]


def test_timeline_is_queue_prefill_then_one_segment_per_decode_step(js):
    timeline = js("return trace.deriveRun(T).timeline;")
    kinds = [s["kind"] for s in timeline["segments"]]
    assert kinds == ["queue", "prefill"] + ["decode"] * (len(TOKENS) - 1)
    decode = [s for s in timeline["segments"] if s["kind"] == "decode"]
    assert sum(s["ms"] for s in decode) == pytest.approx(TOKENS[-1]["t_ms"] - TOKENS[0]["t_ms"])
    assert all(s["ms"] >= 0 for s in timeline["segments"])
    boxes = js("return layout.timelineBoxes(trace.deriveRun(T).timeline);")
    lefts = [b["left"] for b in boxes]
    assert lefts == sorted(lefts) and 0 <= lefts[0] and boxes[-1]["left"] + boxes[-1]["width"] <= 1.01


def test_each_stage_state_depends_only_on_stage_and_run(js):
    same = js("""const run = trace.deriveRun(T);
      const n = stages.STAGES.length;
      const forward = [...Array(n).keys()].map((i) => JSON.stringify(stages.figureState(i, run)));
      const backward = [...Array(n).keys()].reverse().map((i) => JSON.stringify(stages.figureState(i, run))).reverse();
      return forward.every((s, i) => s === backward[i]);""")
    assert same


def test_stages_reveal_the_run_in_order(js):
    states = js("""const run = trace.deriveRun(T);
      return stages.STAGES.map((s, i) => { const f = stages.figureState(i, run);
        return [f.name, f.prompt.shown, f.queue.state, f.prefill.state, f.generated, f.cache.columns, !!f.end]; });""")
    P = TRACE["prompt"]["counts"]["total"]
    G, last_cache = len(TOKENS), TOKENS[-1]["cache_tokens"]
    assert states == [
        ["input", False, "empty", "idle", 0, 0, False],
        ["template", True, "empty", "idle", 0, 0, False],
        ["tokens", True, "empty", "idle", 0, 0, False],
        ["queue", True, "waiting", "idle", 0, 0, False],
        ["prefill", True, "left", "done", 0, P, False],
        ["first-token", True, "left", "done", 1, P, False],
        ["decode", True, "left", "done", G, last_cache, False],
        ["cache", True, "left", "done", G, last_cache, False],
        ["delivery", True, "left", "done", G, last_cache, False],
        ["end", True, "left", "done", G, last_cache, True],
        ["map", True, "left", "done", G, last_cache, True],
    ]


def test_a_run_in_progress_shows_the_stage_of_its_latest_event(js):
    decode = TRACE["events"].index(TOKENS[2]) + 1  # up to the third token (an `attention` event precedes each)
    # a cut just after the fourth token's `attention` event: that event moves no phase on
    read = TRACE["events"].index(TOKENS[3])
    assert TRACE["events"][read - 1]["type"] == "attention"
    phases = js(
        """const cuts = {queued: 2, prefill: 3, first: 4, decode: DECODE, reading: READ};
      const out = {};
      for (const [k, n] of Object.entries(cuts)) {
        const run = trace.deriveRun({...T, events: T.events.slice(0, n)});
        const i = stages.stageForPhase(run.phase);
        out[k] = [stages.STAGES[i].name, stages.figureState(stages.stageIndex('decode'), run).generated];
      }
      return out;""".replace("DECODE", str(decode)).replace("READ", str(read))
    )
    assert phases == {
        "queued": ["queue", 0],
        "prefill": ["prefill", 0],
        "first": ["first-token", 0],
        "decode": ["decode", 3],
        "reading": ["decode", 3],
    }


def test_an_interrupted_run_says_it_is_incomplete(js):
    sentence = js("""const events = T.events.slice(0, 8);
      events.push({type: 'cancelled', schema: 1, request_id: 'x', t_ms: events[7].t_ms + 1, reason: 'cancelled',
                   cause: 'client', state: 'decode', tokens: 4, text: '', metrics: {}});
      return stages.endSentence(trace.deriveRun({...T, events}).end);""")
    assert "incomplete" in sentence and "Cancelled" in sentence
    assert "cut short" in js("return stages.endSentence({type: 'finished', reason: 'max_tokens'});")
    assert js("""return ['eos', 'stop_string', 'max_tokens', 'timeout', 'context_full'].map(
      (reason) => stages.answerComplete({type: 'finished', reason}));""") == [True, True, False, False, False]


def test_the_token_grid_fits_its_lane_for_any_budget(js):
    fits = js("""return [10, 157, 600, 2000, 9000].map((n) => { const g = layout.tokenGrid(n);
      const last = g.at(n - 1); return last.y + g.cell <= layout.LANES.prompt.top + layout.LANES.prompt.height + 0.01
        && last.x + g.cell <= layout.W; });""")
    assert fits == [True] * 5


def test_the_walkthrough_and_the_lab_show_the_servers_queue_time(js):
    terminal = TRACE["events"][-1]
    wait, segment, lab = js("""const run = trace.deriveRun(T);
        const metrics = await import('/static/js/lab/metrics.js');
        const queue = run.timeline.segments.find((s) => s.kind === 'queue');
        return [run.queue.waitMs, queue.ms, metrics.summarize(T.events).queueMs];""")
    # One queue figure everywhere: the figure's label, the timeline's segment and the lab's metric.
    assert round(wait, 3) == round(segment, 3) == round(lab, 3) == terminal["metrics"]["queue_ms"]


# ---- walkthrough/context.js: the recorded run beside the serving chapter's, degrading when fields are absent


def test_the_route_is_read_from_either_recording_format(js):
    got = js("""
      const run = (on, model) => ({ recordedOn: on, model, tokens: [], prefill: {} });
      return [
        context.runRoute(run({ route: { dtype_route: 'int4', weights_dtype: 'int4' } }, { dtype: 'float32' })),
        context.runRoute(run({}, { dtype_route: 'int8', dtype: 'float32' })),
        context.runRoute(run(null, { dtype: 'float32' })),
        route.servingRoute({ recordedOn: { model: 'M (Q4_1 GGUF), int4' } }),
        route.servingRoute({ recordedOn: { route: { dtype_route: 'int8' }, model: 'M, int4' } }),
        route.servingRoute({ recordedOn: {} }, { machine: { route: 'bfloat16' } }),
        route.servingRoute({ recordedOn: {} }),
      ];""")
    assert got == ["int4", "int8", "float32", "int4", "int8", "bfloat16", None]


def test_machine_and_load_come_from_either_field_naming(js):
    got = js("""
      const text = (on) => context.recordedOnText({ recordedOn: on, model: { dtype: 'float32' } });
      return [text({ machine: 'x86_64', cpus: 2, load_1min_before: 1.5, load_1min_after: 2, decoder: 'the native step' }),
              text({ machine: 'x86_64', load_1m: 0.25, decoder: "transformers' forward" }), text(null)];""")
    assert got == [
        "float32 weights · x86_64, 2 CPUs · on the native step · load 1.50 → 2.00",
        "float32 weights · x86_64 · on transformers' forward · load 0.25",
        "float32 weights · machine not recorded · on decoder not recorded · load not recorded",
    ]


def test_a_points_verdict_is_its_own_when_recorded_else_its_position(js):
    got = js("""
      const rl = { peak_flops_s: 100, bandwidth_bytes_s: 10, ridge_intensity: 10 };
      const v = (p) => { const r = roofline.pointVerdict(p, rl); return [r.side, r.verdict, Math.round(r.share * 100)]; };
      return [v({ intensity: 2, flops_s: 5 }), v({ intensity: 50, flops_s: 25 }),
              v({ intensity: 2, flops_s: 5, share: 0.3, verdict: 'below both roofs: overhead' })];""")
    assert got == [
        ["memory-bound", None, 25],
        ["compute-bound", None, 25],
        ["memory-bound", "below both roofs: overhead", 30],
    ]


def test_sentences_without_their_data_are_hidden(js):
    got = js("""
      const run = trace.deriveRun(T);
      const none = context.contextFacts(run, null);
      const noPricing = context.contextFacts(run, { recordedOn: {}, experiments: {} });
      return [none.hidden, noPricing.hidden, none.facts['recorded-on'][1]];""")
    assert got == [["roof-prefill", "roof-decode", "ratio"], ["roof-prefill", "roof-decode", "ratio"], "measured"]


def test_the_ratio_sentence_says_when_the_run_kept_its_attention_weights(js):
    """An inspected recording's decode steps are slower: the sentence beside the pricing run must say so."""
    why = js(
        """const S = await (await fetch('/static/data/serving-trace.json')).json();
      const plain = structuredClone(T); delete plain.request.inspect;
      const run = trace.deriveRun(T);
      return [run.inspected, context.ratioSentence(run, S).why, context.ratioSentence(trace.deriveRun(plain), S).why];"""
    )
    assert TRACE["request"]["inspect"] == {"attention": True}
    inspected, said, plain = why
    assert inspected is True
    assert "attention weights" in said and "attention weights" not in plain


def test_the_pool_check_can_fail(js):
    """The cache stage's check reads the pool's blocks and reserved bytes (measured by the engine from the
    pool), not the formula: reserved bytes short of the positions' need, or a block or more to spare, fail."""
    got = js("""
      const run = trace.deriveRun(T);
      const bpt = run.model.kv_bytes_per_token;
      const c = run.cache;
      const check = (cache) => stages.cacheCheck(cache, bpt);
      return [c.blocks > 0, c.reserved > 0, check(c).holds,
              check({ ...c, reserved: c.tokens * bpt - 1 }).holds,
              check({ ...c, blocks: c.blocks + 1, reserved: c.reserved + c.reserved / c.blocks }).holds,
              check({ tokens: 3, reserved: undefined, blocks: undefined })];""")
    assert got == [True, True, True, False, False, None]


def test_the_models_configuration_and_the_requests_settings_are_not_called_measured(js):
    got = js("""
      const run = trace.deriveRun(T);
      return ['vocab', 'layers', 'head-dim', 'max-new', 'context-window', 'messages', 'cache-bytes', 'cache-reserved',
              'prefill-ms'].map((f) => stages.factProvenance(f, run));""")
    # the reserved bytes are the pool's blocks (measured) times its bytes per block: computed, as in serving/paged-blocks.js
    assert got == ["setting"] * 6 + ["computed", "computed", "measured"]


# ---- the sentences' conditions, on synthetic recordings that each old wording got wrong --------------------

ROOF_BODY = """
  const roofServing = (decode, prefill = {}, route = 'int4', device = 'CPU (x86_64, 2 threads)') => ({ experiments: {
    why_batch: { machine: { device }, result: { roofline: { route, held_by_roof: 0.5, peak_flops_s: 1e11,
      bandwidth_bytes_s: 2.5e10, ridge_intensity: 4, points: [
        { phase: 'prefill', tokens: 36, intensity: 30, kernel_ms: 60, memory_ms: 20, step_ms: 100, share: 0.6,
          verdict: 'v', kernel: 'float32 GEMM', held_by: 'kernel', steps_measured: 3, ...prefill,
          held_by_median: prefill.held_by_median || prefill.held_by || 'kernel' },
        // evidence that carries a verdict: enough steps, the same verdict at the median step
        { phase: 'decode', batch: 1, intensity: 1, kernel_ms: 8, memory_ms: 3, step_ms: 10, share: 0.8,
          kernel_bandwidth_share: 0.1, held_by: 'kernel', verdict: 'v', steps_measured: 3, ...decode,
          held_by_median: decode.held_by_median || decode.held_by || 'kernel' }] } } } } });
"""


def test_decode_is_called_memory_bound_only_when_its_bytes_are_the_longer_floor(js):
    got = js(
        ROOF_BODY
        + """
      const f = (d) => context.roofFacts(roofServing(d)).decodeMemory;
      // the old judge's "memory": kernels longer, streaming at 62 % of the copy bandwidth, bytes 30 % of the step
      return [f({ held_by: 'memory', kernel_bandwidth_share: 0.62 }),
              f({ held_by: 'memory', memory_ms: 9, kernel_ms: 2, share: 0.9 }),
              f({ memory_ms: 4, kernel_ms: 3, share: 0.4, held_by: 'overhead' })];"""
    )
    assert got == [False, True, False]


def test_the_unpacking_sentence_needs_a_quantized_route_and_names_the_device(js):
    got = js(
        ROOF_BODY
        + """
      const on = (route, device) => context.roofFacts(roofServing({}, {}, route, device));
      const cpu = on('int4', 'CPU (x86_64, 2 threads)');
      const facts = context.contextFacts(trace.deriveRun(T), roofServing({}, {}, 'int4', 'NVIDIA H200')).facts;
      return [cpu.decodeArithmetic, cpu.decodeDevice, on('float32', 'CPU (x86_64, 2 threads)').decodeArithmetic,
              facts['decode-device'], on('int4', '').decodeArithmetic];"""
    )
    assert got == [True, "CPU", False, ["GPU", "setting"], False]


def test_a_decode_sentence_needs_its_evidence(js):
    got = js(
        ROOF_BODY
        + """
      const f = (d) => { const r = context.roofFacts(roofServing(d)); return [r.decodeArithmetic, r.decodeVerdict]; };
      return [f({}), f({ held_by_median: 'overhead' }), f({ steps_measured: 2 }), f({ kernel_ms: 11 })];"""
    )
    carried, mixed, few, above = got
    assert carried == [True, "v"]
    assert mixed[0] is False and "the evidence is mixed" in mixed[1]
    assert few[0] is False and "too few steps" in few[1]
    assert above[0] is False and "floors fail their own check" in above[1]  # a floor above its step


def test_floors_that_fail_their_check_give_no_share_of_a_step(js):
    """A floor above its step bounds nothing: the kernels' "took X of its Y" sentences give way to the one that
    says the floors failed, for prefill and decode alike; consistent floors show them."""
    got = js(
        ROOF_BODY
        + """
      const hidden = (d) => context.contextFacts(trace.deriveRun(T), roofServing(d)).hidden
        .filter((name) => /kernels|no-floors/.test(name)).sort();
      return [hidden({}), hidden({ kernel_ms: 11 })];"""
    )
    assert got == [
        ["roof-decode-no-floors", "roof-prefill-no-floors"],
        ["roof-decode-kernels", "roof-prefill-kernels"],
    ]


def test_the_prefill_share_is_its_kernels_share_of_the_step(js):
    # bytes (80 ms) longer than the kernels (60 ms): "took 60 ms of its 100 ms, 60 % of it", not 80 %
    got = js(
        ROOF_BODY
        + """
      const r = context.roofFacts(roofServing({}, { memory_ms: 80, share: 0.8 }));
      const facts = context.contextFacts(trace.deriveRun(T), roofServing({})).facts;
      return [r.prefillShare, facts['prefill-tokens'][1]];"""
    )
    assert got == ["60 %", "setting"]


def test_the_inspected_runs_step_reason_reads_right_when_its_step_was_longer(js):
    got = js("""
      const pricing = { decode_ms_per_token: 20, prefill_ms_per_token: 1, prompt_tokens: 100 };
      const say = (step) => context.ratioReason({ step, perPosition: 1, ratio: step }, pricing, 100, true);
      return [say(40), say(10)];""")
    longer, shorter = got
    assert "and its median step was longer than" in longer and "yet" not in longer
    assert "yet its median step was shorter than" in shorter
    assert "moves a step as much as that work does" not in longer + shorter


CLAIMS_BODY = "const claims = await import('/static/js/serving/claims.js');"
TEXT = "(c) => c.parts.map((p) => (typeof p === 'string' ? p : p[0])).join('')"


def test_serving_claims_say_this_run_for_a_live_run_and_the_recording_otherwise(js):
    got = js(
        CLAIMS_BODY
        + f"""
      const text = {TEXT};
      const wb = {{ points: [{{ batch: 1, step_ms: 10, aggregate_tps: 100, per_user_tps: 100 }},
                            {{ batch: 4, step_ms: 20, aggregate_tps: 200, per_user_tps: 50 }}] }};
      const paged = {{ reserved_bytes: 10, contiguous_bytes: 20, window_bytes: 5 }};
      const spec = {{ cases: [{{ identical: true }}] }};
      return [text(claims.whyBatchClaim(wb, 'live')), text(claims.whyBatchClaim(wb)),
              text(claims.pagedClaim(paged, 'live')), text(claims.pagedClaim(paged)),
              text(claims.speculativeClaim(spec, 'live'))];"""
    )
    assert got[0].startswith("In this run, from batch") and got[1].startswith("In the recording, from batch")
    assert got[2].startswith("In this run the blocks") and got[3].startswith("In this recording the blocks")
    assert got[4].startswith("In this run 1 of 1")


def test_paging_that_did_not_save_states_the_comparison_not_an_unchecked_cause(js):
    got = js(
        CLAIMS_BODY
        + f"""
      return ({TEXT})(claims.pagedClaim({{ reserved_bytes: 30, contiguous_bytes: 20, window_bytes: 5 }}));"""
    )
    assert "capped" not in got and "at least as much as exact reservations" in got


def test_a_plateau_followed_by_a_gain_is_not_where_batching_stopped_paying(js):
    got = js(
        CLAIMS_BODY
        + """
      const pts = (aggs) => aggs.map((a, i) => ({ batch: 2 ** i, aggregate_tps: a }));
      return [claims.stoppedPaying(pts([10, 10.2, 20])), claims.stoppedPaying(pts([10, 10.2, 20, 20.1, 20.3])),
              claims.stoppedPaying(pts([10, 20, 40]))];"""
    )
    assert got == [[], [8, 16], []]


def test_batch_sizes_and_the_chosen_threshold_are_settings_in_the_claims(js):
    got = js(
        CLAIMS_BODY
        + """
      const wb = { points: [{ batch: 1, step_ms: 10, step_ms_median: 10, aggregate_tps: 100, per_user_tps: 100 },
                            { batch: 4, step_ms: 40, step_ms_median: 40, aggregate_tps: 100, per_user_tps: 25 }] };
      const run = (gaps) => ({ gaps_ms: [gaps], max_gap_ms: Math.max(...gaps), long_ttft_ms: 100 });
      const ch = { runs: { off: run([10, 10, 50]), on: run([20, 30, 30]) } };
      const prov = (c, text) => c.parts.filter((p) => typeof p !== 'string' && p[0] === text).map((p) => p[1]);
      const w = claims.whyBatchClaim(wb);
      return [prov(w, '1'), prov(w, '4'), prov(claims.chunkedClaim(ch), '1.5')];"""
    )
    assert got == [["setting"], ["setting", "setting"], ["setting"]]


def test_a_kernel_streaming_step_has_its_own_words(js):
    got = js(
        CLAIMS_BODY
        + f"""
      const pts = [1, 16].map((batch) => ({{ phase: 'decode', batch, kernel_ms: 8, step_ms: 10, steps_measured: 7,
        held_by: 'kernel-streaming', held_by_median: 'kernel-streaming', verdict: 'v' }}));
      return ({TEXT})(claims.roofBatchClaim({{ roofline: {{ points: pts }} }}));"""
    )
    assert "half the copy bandwidth or more" in got and "bytes at the copy bandwidth" not in got


def test_the_prefix_claim_speaks_of_time_to_first_token_not_prefill_time(js):
    got = js(
        CLAIMS_BODY
        + f"""
      const q = (request, prefill_tokens, cached_tokens, ttft_ms) => ({{ request, prefill_tokens, cached_tokens, ttft_ms }});
      const r = {{ runs: {{ off: {{ requests: [q('a', 100, 0, 100)] }}, on: {{ requests: [q('a', 10, 90, 95)] }} }} }};
      return ({TEXT})(claims.prefixClaim(r));"""
    )
    assert "time to first token is not proportional" in got and "prefill's time" not in got


# ---- shared/route.js and shared/roofline.js: which kernel ran a prompt, from the run's own facts


def test_only_a_run_with_float32_copies_runs_its_prompt_on_the_float32_gemm(js):
    got = js("""
      const k = (...a) => route.kernelsOf(...a);
      return [k('int4', 36, true), k('int4', 36, false), k('int8', 36, false), k('int8', 36, null),
              k('int4', 10, true), k('bfloat16', 36, false), k('int4', 36, undefined),
              route.floatPrefillOf({ cost_shape: { float_prefill: true } }), route.floatPrefillOf({ float_prefill: false }),
              route.floatPrefillOf({ route: 'int4' }), route.floatPrefillOf(null), route.floatPrefillOf(T.model)];""")
    assert got == [
        {"prompt": "float32 GEMM", "decode": "int4 kernel"},
        None,
        None,
        None,
        None,
        None,
        None,  # int8 and int4 without copies run both on their own kernel
        True,
        False,
        None,
        None,
        TRACE["model"]["cost_shape"]["float_prefill"],
    ]


def test_an_int8_run_is_not_said_to_compare_two_kernels(js):
    got = js("""
      const S = await (await fetch('/static/data/serving-trace.json')).json();
      const int8 = structuredClone(T);
      int8.recorded_on.route.dtype_route = 'int8';
      int8.model.dtype_route = 'int8';
      int8.model.cost_shape = { ...int8.model.cost_shape, route: 'int8', float_prefill: false };
      return [context.ratioSentence(trace.deriveRun(T), S).oursDetail,
              context.ratioSentence(trace.deriveRun(int8), S).oursDetail];""")
    shipped, int8 = got
    assert ("the prompt ran on the float32 GEMM, each new token on the int4 kernel" in shipped) == bool(
        TRACE["model"]["cost_shape"]["float_prefill"]
    )
    assert "float32 GEMM" not in int8 and "two kernels" not in int8


def test_the_roof_kernel_is_the_one_the_recording_names(js):
    got = js("""
      return [roofline.roofKernel({ peak_kernel: "bfloat16 GEMM on this model's layers, the best of 64 rows" }),
              roofline.roofKernel({ peak_kernel: "int8 kernel on this model's layers, the best of 64 rows" }),
              roofline.roofKernel({ points: [{ phase: 'prefill', kernel: 'int8 kernel' }] }),
              roofline.roofKernel({ points: [] }), roofline.roofKernel(null)];""")
    assert got == ["bfloat16 GEMM", "int8 kernel", "int8 kernel", None, None]


def test_the_walkthrough_tags_kernel_names_as_settings(js):
    got = js("""
      const S = await (await fetch('/static/data/serving-trace.json')).json();
      const { facts } = context.contextFacts(trace.deriveRun(T), S);
      return ['roof-peak-kernel', 'prefill-kernel', 'decode-kernel'].map((k) => facts[k][1]);""")
    assert got == ["setting"] * 3


def test_the_cache_readout_tags_the_reserved_bytes_computed(js):
    got = js("""
      const run = trace.deriveRun(T);
      const state = stages.figureState(stages.stageIndex('cache'), run);
      return stages.readout(state, run).map((l) => [l.text, l.tag]);""")
    assert [tag for text, tag in got if text.endswith("reserved")] == ["computed"]
    assert [tag for text, tag in got if "positions cached in" in text] == ["measured"]


def test_a_batch_that_lowered_the_tokens_for_everyone_is_said_to_have_fallen(js):
    got = js(
        CLAIMS_BODY
        + f"""
      const pt = (batch, aggregate_tps) => ({{ batch, step_ms: batch, step_ms_median: (batch * 1000) / aggregate_tps,
        aggregate_tps, per_user_tps: aggregate_tps / batch }});
      const w = (aggs) => claims.whyBatchClaim({{ points: aggs.map((a, i) => pt(2 ** i, a)) }});
      const prov = (c, text) => c.parts.filter((p) => typeof p !== 'string' && p[0] === text).map((p) => p[1]);
      const fell = w([100, 200, 180]);
      const both = w([100, 200, 202, 190]);
      return [({TEXT})(fell), ({TEXT})(both), prov(both, '5 %')];"""
    )
    fell, both, threshold = got
    assert "fell at batch 4 (−10 % from the batch before)" in fell and "did not rise" not in fell
    assert "did not rise by more than 5 % at batch 4 and fell at batch 8 (−6 % from the batch before)" in both
    assert threshold == ["setting"]  # a threshold the authors chose, not a finding


def test_the_prefix_claim_says_how_large_the_time_cut_was_against_the_work_cut(js):
    got = js(
        CLAIMS_BODY
        + f"""
      const q = (request, prefill_tokens, cached_tokens, ttft_ms) => ({{ request, prefill_tokens, cached_tokens, ttft_ms }});
      const say = (ttftOn) => {{
        const c = claims.prefixClaim({{ runs: {{ off: {{ requests: [q('a', 100, 0, 200)] }},
          on: {{ requests: [q('a', 20, 80, ttftOn)] }} }} }});
        return [({TEXT})(c), c.proportional, Math.round(c.inStep * 100)];
      }};
      return [say(40), say(120), say(184), claims.IN_STEP, claims.PART_OF];"""
    )
    (in_step, yes, a), (half, no, b), (far, no2, c), in_step_at, part_of = got
    # work cut 80 %; time cut 80 %, 40 %, 8 %: all, half and a tenth of it
    assert (a, b, c) == (100, 50, 10) and yes and not no and not no2
    assert "roughly in step with the work skipped, a cut 100 % the size of the tokens' (at least 80 %)" in in_step
    assert "fell by less than the tokens prefilled, a cut 50 % the size of theirs" in half
    assert "roughly in step" not in half and "not proportional" not in half
    assert "not proportional" in far and "under 30 %" in far
    assert (in_step_at, part_of) == (0.8, 0.3)


RECORDINGS = [ROOT / "static/data/serving-trace.json", ROOT / "tests/data/serving-fixture.json"]


def expected_branches(experiments: dict) -> dict:
    """The words each claim must choose on a recording, worked out here from its figures by the stated rules."""
    wb = [p for p in experiments["why_batch"]["result"]["points"] if p.get("step_ms") is not None]

    def stopped_by(rate):
        paid = [i for i in range(1, len(wb)) if rate(wb[i]) > rate(wb[i - 1]) * 1.05]
        return wb[(paid[-1] if paid else 0) + 1 :]

    stopped = stopped_by(lambda p: p["aggregate_tps"])
    medians = all(p.get("step_ms_median") for p in wb)
    by_median = stopped_by(lambda p: p["batch"] * 1000 / p["step_ms_median"]) if medians else None
    # a verdict only where the fastest and the median steps agree on it (claims.js whyBatchClaim)
    agreed = medians and [p["batch"] for p in stopped] == [p["batch"] for p in by_median]
    fell = [p["batch"] for p in stopped if p["aggregate_tps"] < wb[wb.index(p) - 1]["aggregate_tps"]]
    runs = experiments["prefix_caching"]["result"]["runs"]
    off = {q.get("request"): q for q in runs["off"]["requests"]}  # by name, as claims.js pairs them
    hits = [q for q in runs["on"]["requests"] if q["cached_tokens"] > 0 and q.get("request") in off]
    work = 1 - sum(q["prefill_tokens"] for q in hits) / sum(off[q.get("request")]["prefill_tokens"] for q in hits)
    time = 1 - sum(q["ttft_ms"] for q in hits) / sum(off[q.get("request")]["ttft_ms"] for q in hits)
    points = experiments["why_batch"]["result"].get("roofline", {}).get("points", [])
    prefill = next((p for p in points if p["phase"] == "prefill"), None)
    right = sorted(
        p["batch"] for p in points if p["phase"] == "decode" and prefill and p["intensity"] > prefill["intensity"]
    )
    return {
        "stopped": [p["batch"] for p in stopped] if agreed else [],
        "mixed": not agreed,
        "fell": fell,
        "prefix": "in step" if time / work >= 0.8 else "by less" if time / work >= 0.3 else "far less",
        "right_of_prefill": right if prefill else None,
    }


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_the_claims_choose_their_words_by_their_thresholds_on_every_recording(js, path):
    experiments = json.loads(path.read_text(encoding="utf-8"))["experiments"]
    got = js(
        CLAIMS_BODY
        + f"""
      const text = {TEXT};
      const wb = claims.whyBatchClaim(arg.why_batch.result);
      const pf = claims.prefixClaim(arg.prefix_caching.result);
      const side = claims.roofPrefillClaim(arg.why_batch.result);
      return {{ stopped: wb.stoppedAt, why: text(wb), prefix: text(pf), side: side && side.rightOf,
               sideText: side && text(side) }};""",
        experiments,
    )
    want = expected_branches(experiments)
    assert got["stopped"] == want["stopped"]
    assert ("the evidence is mixed" in got["why"] or "no median step" in got["why"]) == want["mixed"]
    if not want["mixed"]:
        assert (" fell at batch " in got["why"]) == bool(want["fell"])
        assert ("did not rise by more than" in got["why"]) == bool(set(want["stopped"]) - set(want["fell"]))
    words = {"in step": "roughly in step", "by less": "fell by less than the tokens", "far less": "not proportional"}
    assert [k for k, w in words.items() if w in got["prefix"]] == [want["prefix"]]
    assert got["side"] == want["right_of_prefill"]
    if want["right_of_prefill"]:
        assert "left of the decode point" in got["sideText"]
    elif want["right_of_prefill"] == []:
        assert "right of every decode point" in got["sideText"]


def test_a_prefill_right_of_every_decode_point_is_said_to_be(js):
    got = js(
        CLAIMS_BODY
        + f"""
      const pt = (phase, batch, intensity, kernel) => ({{ phase, batch, tokens: 64, intensity, flops_s: 1e9, step_ms: 10, kernel }});
      const claim = (points) => claims.roofPrefillClaim({{ roofline: {{ points }} }});
      const right = claim([pt('prefill', undefined, 50, 'float32 GEMM'), pt('decode', 1, 2, 'int4 kernel'),
                           pt('decode', 16, 30, 'int4 kernel')]);
      const left = claim([pt('prefill', undefined, 10, 'int8 kernel'), pt('decode', 1, 2, 'int8 kernel'),
                          pt('decode', 8, 12, 'int8 kernel'), pt('decode', 16, 20, 'int8 kernel')]);
      return [({TEXT})(right), right.rightOf, ({TEXT})(left), left.rightOf];"""
    )
    right, none, left, batches = got
    assert "right of every decode point (the farthest right, batch 16, at 30.0 FLOP/B)" in right and none == []
    assert "left of the decode points at batch 8 and 16 (12.0 and 20.0 FLOP/B)." in left and batches == [8, 16]
    assert "float32" not in left  # an int8 prompt ran on the int8 kernel: no bytes-a-weight reason is given


# ---- shared/evidence.js: the twin of serving_experiments/evidence.py, on the same golden cases


def test_the_evidence_rules_match_their_python_twin_on_the_golden_cases(js):
    cases = json.loads((ROOT / "tests/data/evidence-cases.json").read_text(encoding="utf-8"))["cases"]
    got = js(
        """
      const ev = await import('/static/js/shared/evidence.js');
      return arg.map((c) => {
        const problems = ev.floorProblems(c.points).map((q) => [q.kind, q.phase, q.rows, q.after]);
        const busy = ev.loaded(...c.loaded);
        return { problems, evidence: c.points.map((p) => ev.pointEvidence(p, !problems.length, busy)),
                 slack: ev.FLOOR_SLACK, min: ev.MIN_STEPS };
      });""",
        cases,
    )
    from serving_experiments import evidence

    for case, mine in zip(cases, got, strict=True):
        assert mine["problems"] == case["problems"], case["name"]
        assert mine["evidence"] == case["evidence"], case["name"]
        assert (mine["slack"], mine["min"]) == (evidence.FLOOR_SLACK, evidence.MIN_STEPS)


def test_a_mixed_why_batch_reading_draws_no_verdict(js):
    got = js(
        CLAIMS_BODY
        + f"""
      const pt = (batch, fast, median) => ({{ batch, step_ms: batch * 1000 / fast, step_ms_median: batch * 1000 / median,
        aggregate_tps: fast, per_user_tps: fast / batch, steps_measured: 3 }});
      const c = claims.whyBatchClaim({{ points: [pt(1, 37.3, 25.6), pt(8, 155.6, 110.6), pt(16, 141.9, 130.8)] }});
      return [({TEXT})(c), c.mixed, c.stoppedAt, c.stoppedAtFastest, c.stoppedAtMedian];"""
    )
    text, mixed, stopped, fastest, median = got
    assert mixed and stopped == [] and fastest == [16] and median == []
    assert "the evidence is mixed: by the fastest of 3 steps the tokens for everyone fell at batch 16" in text
    assert "by their median every step up in batch still paid (batch 8 to 16: 110.6 to 130.8 tok/s)" in text
    assert "where a bigger batch stopped paying" not in text


def test_a_dip_followed_by_a_gain_is_not_called_paying_at_every_step(js):
    got = js(
        CLAIMS_BODY
        + f"""
      const pt = (batch, agg) => ({{ batch, step_ms: batch * 1000 / agg, step_ms_median: batch * 1000 / agg,
        aggregate_tps: agg, per_user_tps: agg / batch, steps_measured: 7 }});
      const said = (at8) => ({TEXT})(claims.whyBatchClaim({{ points: [pt(1, 30), pt(4, 120), pt(8, at8), pt(16, 130)] }}));
      return [said(110), said(122)];"""
    )
    fell, flat = got
    assert "every step up" not in fell and "every step up" not in flat
    # a fall is said as a fall (110 after 120: −8 %), not as a plateau; a stall as a stall
    assert (
        "a bigger batch had not stopped paying: the tokens for everyone fell at batch 8 (−8 % from the batch before)"
        " but rose again by batch 16" in fell
    )
    assert "did not rise" not in fell
    assert "the tokens for everyone did not rise by more than 5 % at batch 8 but rose again by batch 16" in flat
    assert " fell at " not in flat
