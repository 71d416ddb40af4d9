"""model_runner/local/model/compiled.py: the native step's decode stretches compiled ahead of time by AOTInductor
give the eager step's logits and K/V bit for bit, one library for every layer and row count; they are switched in
only after a bits check, from a cache keyed by what they were compiled for, on a thread while the eager step
serves; a failure leaves the eager step with one log line; /api/model, `kvscope serve --compile` and the bench's
`:compiled` routes say and choose it. One real compile of the test model's stretches (about 20 s on 2 cores)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess

import pytest
import torch
from decoder_runs import Run, int4_llama, tiny

from model_runner.local.model import compiled, native
from model_runner.protocol.errors import UserError

# The libraries check every input's shape, stride and dtype against the export's (read once, at their first run): a
# caller that handed them a strided view would fail here rather than read wrong numbers.
os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = "1"


@pytest.fixture(scope="module")
def library():
    """The int4 test model and its stretches' libraries, built in a child as the engine builds them (about 40 s on
    2 cores), or found in the cache where an earlier run on this machine built them for the same key."""
    model = int4_llama()
    decoder = Run(model, "native").forward.decoder
    spec, why = compiled.spec_of(decoder)
    assert spec is not None, why
    return model, spec, compiled.ensure_built(spec)


def test_the_compiled_stretches_give_the_eager_steps_logits_and_kv_bit_for_bit(library):
    model, _, folder = library
    eager, fast = Run(model, "native"), Run(model, "native")
    fast.forward.decoder.stretches = compiled.load(folder)
    calls = []
    before, after = fast.forward.decoder.stretches
    fast.forward.decoder.stretches = (lambda *a: calls.append(1) or before(*a), after)
    prompts = [("a", list(range(5, 12))), ("b", list(range(20, 30))), ("c", list(range(40, 43)))]
    for run in (eager, fast):
        run.step(prompts)
    for step in range(3):  # three rows, then one: the libraries of one row and of more, one for every layer
        rows = [("a", [40 + step]), ("b", [50 + step]), ("c", [60 + step])] if step < 2 else [("b", [70])]
        assert torch.equal(fast.step(rows), eager.step(rows)), step
    for key in "abc":
        assert torch.equal(fast.kv(key), eager.kv(key))
    assert len(calls) == 3 * 2  # three decode steps, two layers each, on the library


def test_the_bits_check_passes_the_library_and_refuses_a_stretch_that_rounds_otherwise(library):
    model, _, folder = library
    decoder = Run(model, "native").forward.decoder
    before, after = compiled.load(folder)
    assert compiled.same_bits(decoder, (before, after))

    def after_rounding_otherwise(*args):
        out = after(*args)
        return out + out.abs().max() * 2**-30  # below bfloat16's step, not below float32's at every element

    assert not compiled.same_bits(decoder, (before, after_rounding_otherwise))


def test_start_switches_the_decoder_to_the_cached_library_after_its_bits_check(library, monkeypatch):
    model, spec, folder = library
    monkeypatch.setattr(compiled, "cached_folder", lambda _: folder)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a cached library is not built again"))
    decoder = Run(model, "native").forward.decoder
    eager = decoder.stretches
    status = compiled.start(decoder, "on", torch.device("cpu")).wait(120)
    assert status.to_dict()["state"] == "on" and str(folder) in status.reason
    assert decoder.stretches != eager and compiled.ensure_built(spec) == folder


class Lines(logging.Handler):
    """The engine logger's messages, caught on that logger itself (whatever other tests did to propagation)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_failed_compile_or_a_library_with_other_bits_leaves_the_eager_step_with_one_log_line(library, monkeypatch):
    model, _, folder = library
    logger, caught = logging.getLogger("kvscope.engine"), Lines()
    monkeypatch.setattr(logger, "level", logging.INFO)
    monkeypatch.setattr(logger, "handlers", [*logger.handlers])  # the old list comes back after the test
    logger.addHandler(caught)

    def broken(spec):
        raise RuntimeError("the compile failed: g++ not found\nmore lines")

    reasons = []
    for name, patch in (("ensure_built", broken), ("same_bits", lambda *a: False)):
        with monkeypatch.context() as m:
            m.setattr(compiled, "cached_folder", lambda _: folder)
            m.setattr(compiled, name, patch)
            decoder = Run(model, "native").forward.decoder
            eager = decoder.stretches
            caught.lines.clear()
            status = compiled.start(decoder, "on", torch.device("cpu")).wait(120)
            assert status.state == "failed" and decoder.stretches == eager, name
            assert caught.lines == [f"compiled stretches not used, the eager step serves: {status.reason}"]
            reasons.append(status.reason)
    assert reasons == [
        "the compile failed: g++ not found",
        f"the library in {folder} did not give the eager stretches' bits",
    ]


def test_a_build_lands_whole_once_and_a_second_builder_takes_the_first_ones(library, monkeypatch, tmp_path):
    _, spec, _ = library
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    builds = []

    def child(command, **kwargs):  # writes what the real child writes; the first one lands while the second runs
        scratch = compiled.Path(command[-1])
        for name in compiled.LIBRARIES:
            (scratch / f"{name}.pt2").write_text(str(scratch))
        builds.append(scratch)
        if len(builds) == 2:
            scratch.rename(compiled.cached_folder(spec))  # as the other process's replace would land it
            scratch.mkdir()
            (scratch / "spec.json").write_text("{}")
            for name in compiled.LIBRARIES:
                (scratch / f"{name}.pt2").write_text("late")
        assert kwargs["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(compiled.Path(compiled.__file__).parents[3])
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", child)
    folder = compiled.ensure_built(spec)
    assert folder == compiled.cached_folder(spec) and compiled.ensure_built(spec) == folder and len(builds) == 1
    shutil.rmtree(folder)
    assert compiled.ensure_built(spec) == folder and (folder / "qkv-1.pt2").read_text() != "late"
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no scratch folder left


def test_a_build_in_the_cache_runs_in_a_child_and_lands_whole(library, monkeypatch, tmp_path):
    _, spec, _ = library
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    seen = []

    def child(command, **kwargs):
        seen.append(command)
        scratch = compiled.Path(command[-1])
        assert (scratch / "spec.json").is_file()
        return subprocess.CompletedProcess(command, 1, "", "Traceback …\nCppCompileError: c++ failed")

    monkeypatch.setattr(subprocess, "run", child)
    with pytest.raises(RuntimeError, match=re.escape("the compile failed: CppCompileError: c++ failed")):
        compiled.ensure_built(spec)
    assert seen[0][1:3] == ["-m", "model_runner.local.model.compiled"]
    assert list((tmp_path / "compiled").iterdir()) == []  # nothing half built is left for a later start


def test_the_cache_key_names_what_a_library_was_compiled_for(library, monkeypatch):
    _, spec, _ = library
    key = spec.key()
    assert compiled.Spec(**{**spec.__dict__, "eps": spec.eps * 2}).key() != key
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert spec.key() != key
    monkeypatch.undo()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert spec.key() != key
    monkeypatch.undo()
    monkeypatch.setattr(compiled, "isa_flags", lambda: ["avx2", "fma"])  # the CPU the C++ was compiled for
    assert spec.key() != key
    monkeypatch.undo()
    monkeypatch.setattr(compiled, "SOURCE", compiled.SOURCE[:-1])  # the stretches' code is part of it
    assert spec.key() != key


def test_start_says_why_the_stretches_stay_eager():
    model = int4_llama()
    decoder = Run(model, "native").forward.decoder
    cpu = torch.device("cpu")
    cases = {
        "off": (decoder, "off", cpu),
        "cuda": (decoder, "on", torch.device("cuda")),
        "transformers": (Run(model, "transformers").forward.decoder, "on", cpu),
        "float32": (Run(tiny("llama"), "native").forward.decoder, "on", cpu),
    }
    reasons = {name: compiled.start(*args).to_dict() for name, args in cases.items()}
    for asked in ("False", "0", "fast"):  # KVSCOPE_COMPILE=false reaches the engine as "False": refused, not compiled
        with pytest.raises(UserError, match=f"--compile must be one of auto, on, off, got '{asked}'"):
            compiled.start(decoder, asked, cpu)
    assert reasons["off"] == {"asked": "off", "state": "off", "reason": "--compile off"}
    assert reasons["cuda"]["state"] == "off" and "cuda steps run eagerly" in reasons["cuda"]["reason"]
    assert reasons["transformers"]["reason"].startswith("transformers' forward runs the steps")
    assert reasons["float32"]["reason"].startswith("this route's steps do not run the int4 decode stretches")
    assert decoder.stretches == (native.before_attention, native.after_attention)


@pytest.mark.parametrize("vendor, state", [("AuthenticAMD", "off"), ("GenuineIntel", "compiling")])
def test_auto_compiles_only_on_a_vendor_measured_faster(vendor, state, monkeypatch):
    monkeypatch.setattr(compiled, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(compiled.threading, "Thread", lambda **kw: type("T", (), {"start": lambda self: None})())
    status = compiled.start(Run(int4_llama(), "native").forward.decoder, "auto", torch.device("cpu"))
    assert status.state == state
    if state == "off":
        assert status.reason == f"auto: not measured faster on this CPU's vendor ({vendor}); --compile on tries it"


def test_api_model_says_whether_the_stretches_run_compiled_and_serve_takes_the_flag(shared_engine):
    from app import create_app
    from app.engine_ext import REMOTE_COMPILED
    from app.engine_ext import compiled as reported
    from kvscope.cli import build_parser

    client = create_app({"TESTING": True, "ENGINE": shared_engine("fake")}).test_client()
    assert client.get("/api/model").json["compiled"] == {"asked": "off", "state": "off", "reason": "--compile off"}
    assert build_parser().parse_args(["serve", "--compile", "on"]).compile == "on"
    assert build_parser().parse_args(["serve"]).compile is None  # KVSCOPE_COMPILE, else the app's auto
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--compile", "fast"])

    class Remote:
        local = None

    assert reported(Remote()) == REMOTE_COMPILED


def test_the_bench_takes_a_compiled_route_and_sets_it_no_target_over_its_eager_twin():
    from bench import dtypes
    from model_runner.protocol.errors import UserError

    routes = dtypes.parse_routes("float32,auto:native,auto:native:compiled")
    assert [dtypes.compiled_route(r) for r in routes] == [False, False, True]
    assert dtypes.split_route("auto:native:compiled") == ("auto", "native")
    assert dtypes.goals_over("auto:native:compiled", "auto:native") == (None, None)
    assert dtypes.goals_over("auto:native:compiled", "float32") == (dtypes.LONE_GOAL, dtypes.BATCHED_GOAL)
    with pytest.raises(UserError, match=":compiled for its decode stretches"):
        dtypes.parse_routes("auto:native,auto:native:fast")


def test_the_bench_sets_a_compiled_route_beside_its_eager_twin_repeat_by_repeat():
    from bench import dtypes

    def lone(*speeds):
        return [{"decode_tokens_per_s": s, "prefill_ms": 100.0} for s in speeds]

    routes = ["float32", "auto:native", "auto:native:compiled"]
    runs = {
        "float32": {"lone": lone(20, 22), "batched": [{"tokens_per_s": 80}, {"tokens_per_s": 90}]},
        "auto:native": {"lone": lone(60, 66), "batched": [{"tokens_per_s": 120}, {"tokens_per_s": 120}]},
        "auto:native:compiled": {"lone": lone(72, 66), "batched": [{"tokens_per_s": 132}, {"tokens_per_s": 126}]},
    }
    ratios = dtypes._ratios({}, runs, routes, 8)
    twin = ratios["lone_auto:native:compiled_over_auto:native"]
    assert twin["value"] == pytest.approx((72 / 60 + 66 / 66) / 2) and twin["met"] is None
    assert ratios["batched_auto:native:compiled_over_auto:native"]["value"] == pytest.approx((1.1 + 1.05) / 2)
    assert ratios["prefill_auto:native:compiled_over_auto:native"]["met"] is None  # no target over the twin
    assert "lone_auto:native_over_auto:native:compiled" not in ratios


def test_serve_refuses_compile_for_a_remote_engine(capsys):
    from kvscope import cli

    assert cli.main(["serve", "--engine", "openai:http://127.0.0.1:9", "--compile", "on"]) == 2
    assert "--compile compiles the built-in engine's step, not --engine's" in capsys.readouterr().err
