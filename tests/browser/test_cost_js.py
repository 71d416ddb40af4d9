"""static/js/shared/cost.js in Chromium against static/data/cost_golden.json: the same cases
formulas/cost.py reproduces (tests/unit/test_cost.py), fetched by the page from the shipped file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "static/data/cost_golden.json").read_text())


@pytest.fixture
def js(page, static_url):
    """Runs an async JS function body with the `cost` and lab `metrics` modules (as `lab`) and the golden file `G` in scope."""
    page.goto(static_url + "/static/data/cost_golden.json")

    def run(body: str):
        return page.evaluate(
            f"""async () => {{
          const cost = await import('/static/js/shared/cost.js');
          const lab = await import('/static/js/lab/metrics.js');
          const G = await (await fetch('/static/data/cost_golden.json')).json();
          {body}
        }}"""
        )

    return run


def test_every_golden_case_in_js(js):
    got = js("""
      const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
      return G.cases.map((c) => cost[camel(c.figure)](G.shapes[c.shape], ...c.args));
    """)
    assert len(got) == len(GOLDEN["cases"]) > 100
    bad = [(c["id"], g, c["value"]) for c, g in zip(GOLDEN["cases"], got) if g != c["value"]]
    assert not bad, bad[:5]


def test_decode_tokens_per_s_in_js(js):
    got = js("return G.decode_tokens_per_s.map((c) => cost.decodeTokensPerS(c.token_times_s));")
    assert got == [c["value"] for c in GOLDEN["decode_tokens_per_s"]]


def test_attainable_flops_in_js(js):
    got = js("return G.attainable_flops_s.map((c) => cost.attainableFlopsS(...c.args));")
    assert got == [c["value"] for c in GOLDEN["attainable_flops_s"]]


@pytest.mark.parametrize(
    "call, message",
    [
        ("cost.prefillFlops(s, 0)", "tokens must be a whole number of at least 1, got 0"),
        ("cost.decodeFlops(s, -1)", "context must be a number of at least 0, got -1"),
        ("cost.decodeStepBytes(s, 2.5, 3)", "batch must be a whole number of at least 1, got 2.5"),
    ],
)
def test_bad_counts_name_the_field_and_the_limit(js, call, message):
    got = js(f"const s = G.shapes['tiny-int4']; try {{ {call}; return null; }} catch (e) {{ return e.message; }}")
    assert got == message


def test_the_labs_decode_bandwidth_reads_what_the_route_reads(js):
    """The lab's "decode GB/s (est.)" counted the whole float32 embedding as read (about 1.9x
    too high on int4/int8). One second a step at context 0 gives the bytes one step reads."""
    read, held, one_step = js("""
      const shape = G.shapes['smollm2-135m-int4'];
      return [lab.decodeBytesPerS({ cost_shape: shape }, 0, 1000), cost.weightBytesHeld(shape),
              cost.weightBytesRead(shape, 1)];
    """)
    assert read == one_step == 94_981_632  # the golden worked case: int4 layers, int8 head pass, one embedding row
    assert held / read > 1.9  # what the old estimate divided by the step time


def test_the_labs_estimates_are_the_cost_models_over_the_time(js):
    got = js("""
      const facts = { cost_shape: G.shapes['tiny-int8'] }, s = facts.cost_shape;
      return [lab.prefillFlopsPerS(facts, 3, 500), cost.prefillFlops(s, 3) * 2,
              lab.decodeFlopsPerS(facts, 5, 100), cost.decodeFlops(s, 5) * 10,
              lab.decodeBytesPerS(facts, 5, 100), cost.decodeStepBytes(s, 1, 5) * 10,
              lab.prefillFlopsPerS({ params: 1000 }, 3, 500), lab.decodeBytesPerS({ cost_shape: null }, 5, 100)];
    """)
    assert got[0:2] == [got[1]] * 2 and got[2] == got[3] and got[4] == got[5]
    assert got[6] is None and got[7] is None  # no shape from the server (a remote engine): no estimate


def test_the_labs_decode_tokens_per_s_is_the_one_definition(js):
    """Tokens at 50, 70 and 100 ms, the request done at 110 ms: (3 - 1) / 0.050 s = 40 tokens/s, not
    1000 / TPOT = 1000 / 30 (TPOT also counts the 10 ms after the last token)."""
    got = js("""
      const ev = (type, t, extra = {}) => ({ type, t_ms: t, ...extra });
      const tok = (t, index) => ev('token', t, { index, text: 'x', step_ms: 20, cache_tokens: 10 + index });
      return lab.summarize([ev('prefill_start', 5), ev('prefill_end', 50, { ms: 45 }), tok(50, 0), tok(70, 1), tok(100, 2),
                            ev('finished', 110, { tokens: 3, text: 'xxx', reason: 'eos', metrics: {} })]);
    """)
    assert got["decodeTokensPerS"] == 40 and got["tpotMs"] == 30
