"""The recorders name the processor a recording ran on (scripts/record_serving_trace.py): its model name
from /proc/cpuinfo at the top of the file and in each in-process experiment's machine, never a guess."""

from __future__ import annotations

from scripts import record_serving_trace as rec
from serving_experiments.contract import DECODER_WORDS

CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t: avx512f\n"


def test_the_processor_model_is_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    assert rec.cpu_model(info) == "Intel(R) Xeon(R) Processor"


def test_a_machine_without_cpuinfo_names_no_processor(tmp_path):
    assert rec.cpu_model(tmp_path / "absent") == ""
    (tmp_path / "bare").write_text("processor\t: 0\n")
    assert rec.cpu_model(tmp_path / "bare") == ""


def test_each_experiment_machine_gets_the_processor_when_known():
    body = {"name": "why_batch", "machine": {"cpu": "x86_64", "threads": 2, "load_1m": 0.9}}
    named = rec.with_processor(body, "Intel(R) Xeon(R) Processor")
    assert named["machine"] == {**body["machine"], "processor": "Intel(R) Xeon(R) Processor"}
    assert "processor" not in body["machine"]  # the server's answer itself is left as it came
    assert rec.with_processor(body, "") is body


def test_a_recording_names_the_decoder_that_ran_its_steps():
    facts = {"name": "SmolLM2", "dtype_route": "int4"}
    assert rec.recording_context({**facts, "decoder": {"name": "native"}}, 0.5)["decoder"] == "the native step"
    assert (
        rec.recording_context({**facts, "decoder": {"name": "transformers"}}, 0.5)["decoder"] == "transformers' forward"
    )
    assert rec.recording_context(facts, 0.5)["decoder"] == "decoder not reported by the engine"


def test_every_shipped_recording_was_made_on_the_decoder_that_serves_and_left_as_recorded():
    """The shipped recordings ran on the default decoder (the native step, what `kvscope serve` runs on this
    model) and carry no edit made after recording."""
    import json
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "static/data"
    for name in ("serving-trace.json", "invariance-trace.json", "trace-example.json"):
        on = json.loads((data / name).read_text(encoding="utf-8"))["recorded_on"]
        assert on["decoder"] == DECODER_WORDS["native"], name
        assert "edited_after_recording" not in on, name
