"""The merge-or-serve page: the lab on the tiny model (merged and unmerged write the same tokens, the timings and
their LoRA kernels, dW's rank, the sizes and FLOPs), the memory arithmetic, a bundled adapter's file and
training record, the bench's file, and the page under AppTest (random weights, CPU, a small run in place of the
default): every section, bad input and a failing run as messages that keep the last results."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from streamlit.testing.v1 import AppTest

import engine.lora.merge_lab as merge_lab
from engine.lora import random_adapter, save_adapter
from engine.lora.adapter import TARGETS, hf_weight_name, target_shape
from engine.lora.anatomy import adapter_params, anatomy, base_params, spectrum
from engine.lora.merge_lab import RANDOM, MergeSettings, default_settings, file_stamp, resolve_adapter, run_merge_lab

import app.sections.lora_merge as section
from app.analysis.lora_merge import (H200_BYTES, LLAMA_8B, PARTS, Deployment, breakdown, divergence, examples,
                                     learned_frame, live_deployment, load_bench, memory_frame, result_json,
                                     shaped_deployment, timing_frame, training_line)
from app.charts.lora_merge import (anatomy_figure, bench_figure, memory_figure, spectrum_figure,
                                   step_time_figure)
from app.registry import PAGES
from tests.apptest_helpers import assert_clean, open_page, random_app  # noqa: F401 (fixture)

PAGE, PREFIX = "16_lora_merge.py", "lm"
SUBMIT = f"FormSubmitter:{PREFIX}-form-Merge, serve and measure"
SMALL = MergeSettings(adapter=RANDOM, rank=4, prompt="Name a colour.", max_new_tokens=4, batch_sizes=(1, 2),
                      warmup_steps=1, timed_steps=2)
TINY = MergeSettings(adapter=RANDOM, rank=4, prompt="Tell me about cats.", max_new_tokens=10, batch_sizes=(1, 3),
                     warmup_steps=1, timed_steps=3)


def test_page_is_registered() -> None:
    spec = next(p for p in PAGES if p.url_path == "lora-merge-or-serve")
    assert spec.available and spec.path == "pages/16_lora_merge.py"


@pytest.fixture(scope="module")
def strong(tiny_weights):  # noqa: ANN001, ANN201
    # Strong enough on the x10-scaled tiny model (std 0.5) that the adapter changes the greedy answer.
    return random_adapter(tiny_weights.config, "strong", 4, seed=1, std=0.5)


@pytest.fixture(scope="module")
def tiny_result(tiny_weights, strong):  # noqa: ANN001, ANN201
    return run_merge_lab(tiny_weights, TINY, adapter=strong)


def test_merged_and_unmerged_write_the_same_tokens(tiny_result, tiny_weights) -> None:  # noqa: ANN001
    r = tiny_result
    assert [a.kind for a in r.answers] == ["base", "merged", "unmerged"]
    assert len(r.merged.token_ids) == TINY.max_new_tokens
    assert r.unmerged.token_ids == r.merged.token_ids
    assert divergence(r, tiny_weights.tokenizer.decode) is None
    assert r.base.token_ids != r.merged.token_ids  # the adapter really changes the answer
    assert r.unmerged.text == tiny_weights.tokenizer.decode(list(r.unmerged.token_ids))


def test_timings_split_the_lora_kernels_out(tiny_result) -> None:  # noqa: ANN001
    r = tiny_result
    assert [(t.deployment, t.batch) for t in r.timings] == [("merged", 1), ("unmerged", 1), ("merged", 3),
                                                            ("unmerged", 3)]
    fp = r.footprint
    for t in r.timings:
        assert len(t.step_seconds) == TINY.timed_steps and t.median in t.step_seconds
        assert any(n.startswith("linear.") for n in t.kernels)
        lora = {n for n in t.kernels if n.startswith("lora.")}
        if t.deployment == "merged":
            assert not lora  # a merged checkpoint runs no extra kernel
        else:
            assert lora == {"lora.qkv", "lora.o", "lora.gate_up", "lora.down"}
            # The engine's count: every row runs every fused group's padded update.
            assert t.flops_of("lora.") == pytest.approx(t.batch * fp.served_flops)
        assert len(t.profiled_seconds) == len(t.step_kernels) == TINY.timed_steps  # profiled after the timed ones
        parts = breakdown(t)
        kernel_seconds = sum(secs for secs, _, _ in t.kernels.values())
        assert t.profiled_median in t.profiled_seconds
        # The stack is the step it explains (its label), split in the profiled step's proportions.
        assert list(parts) == list(PARTS) and sum(parts.values()) == pytest.approx(t.median)
        profiled = max(t.profiled_median, kernel_seconds)
        assert parts["LoRA kernels"] == pytest.approx(t.seconds_of("lora.") / profiled * t.median)
        assert parts["Outside the kernels"] == pytest.approx((profiled - kernel_seconds) / profiled * t.median)
        assert (parts["LoRA kernels"] > 0) == (t.deployment == "unmerged")
    frame = timing_frame(r)
    assert list(frame["Batch"]) == [1, 3] and (frame["LoRA share of step"] > 0).all()
    assert (frame["LoRA FLOPs vs linears"] > 0).all()


def test_the_update_has_rank_r(tiny_result, tiny_weights, strong) -> None:  # noqa: ANN001
    sp = tiny_result.spectrum
    assert (sp.layer, sp.target) == tiny_result.anatomy.largest()
    d_out, d_in = target_shape(tiny_weights.config, sp.target)
    assert len(sp.delta) == len(sp.weight) == min(d_out, d_in)
    assert sp.numerical_rank == strong.rank and sp.tail_ratio < 1e-5
    assert sp.weight[strong.rank] > 1e-3 * sp.weight[0]  # W itself is not low rank
    # The norms come from r x r products; the same as forming dW.
    for (layer, target) in [(0, "q"), (1, "down")]:
        w = tiny_weights.state_dict[hf_weight_name(layer, target)]
        want = float(strong.delta(layer, target).norm() / w.norm())
        assert tiny_result.anatomy.rel_norm[layer, TARGETS.index(target)] == pytest.approx(want, rel=1e-4)
    partial = random_adapter(tiny_weights.config, "attn", 2, targets=("q", "v"), seed=3)
    rel = anatomy(tiny_weights, partial).rel_norm
    assert rel.shape == (2, 7) and np.isnan(rel[:, [1, 3, 4, 5, 6]]).all() and (rel[:, [0, 2]] > 0).all()
    sp2 = spectrum(tiny_weights, partial, 1, "v")
    assert sp2.numerical_rank == 2 and sp2.tail_ratio < 1e-5
    with pytest.raises(ValueError, match="does not change"):
        spectrum(tiny_weights, partial, 0, "o")


def test_sizes_and_memory_arithmetic(tiny_result, tiny_weights, strong) -> None:  # noqa: ANN001
    fp = tiny_result.footprint
    cfg = tiny_weights.config
    params = sum(t.numel() for t in tiny_weights.state_dict.values())
    assert fp.base_params == params == base_params(cfg) and fp.checkpoint_bytes == 2 * params
    assert fp.adapter_params == strong.num_params == adapter_params(cfg, 4, TARGETS)
    assert fp.adapter_bytes == 2 * strong.num_params
    assert fp.adapter_flops == 2 * strong.num_params  # 2 r (d_in + d_out) per adapted linear
    assert fp.base_linear_flops == sum(2 * o * i for o, i in (target_shape(cfg, t) for t in TARGETS)) * cfg.num_layers
    assert 0 < fp.extra_flops_share < 1 and fp.served_flops >= fp.adapter_flops
    d = Deployment("m", checkpoint_bytes=1000, adapter_bytes=10)
    assert d.merged_bytes(5) == 5000 and d.unmerged_bytes(5) == 1050
    assert d.merged_fit(10_500) == 10 and d.adapters_fit(10_500) == 950
    assert d.merged_fit(999) == 0 and d.adapters_fit(999) == 0
    frame = memory_frame([d], np.array([1, 10, 100]))
    assert list(frame["bytes"]) == [1000, 10_000, 100_000, 1010, 1100, 2000]
    # The real model's sizes, from its shape: 134.5M parameters, 269 MB in bf16; rank 8 on every linear ~4.9 MB.
    from engine.config import ModelConfig
    smol = shaped_deployment(ModelConfig(), 8, TARGETS)
    assert smol.checkpoint_bytes == 2 * 134_515_008 and smol.adapter_bytes == 2 * 8 * 30 * 10_176
    assert smol.merged_fit(H200_BYTES) == 557 and smol.adapters_fit(H200_BYTES) > 30_000  # 139.8 GiB
    big = shaped_deployment(LLAMA_8B, 8, TARGETS)
    assert 7.9e9 < big.checkpoint_bytes / 2 < 8.1e9 and big.merged_fit(H200_BYTES) == 9
    assert live_deployment(fp, "tiny").checkpoint_bytes == fp.checkpoint_bytes


def test_charts_and_json_of_a_run(tiny_result) -> None:  # noqa: ANN001
    r = tiny_result
    fp = r.footprint
    live = live_deployment(fp, "tiny")
    big = shaped_deployment(LLAMA_8B, r.rank, r.targets)
    figs = [step_time_figure(r), anatomy_figure(r), spectrum_figure(r.spectrum),
            memory_figure(memory_frame([live, big]), live, big, H200_BYTES)]
    for fig in figs:
        assert isinstance(fig, go.Figure) and fig.layout.title.text
    assert len(figs[0].data) == len(PARTS) + 1 and len(figs[0].data[0].y) == 4  # 2 batches x 2 deployments
    assert len(figs[3].data) == 4
    # The line states the capacity the fits divide: 139.8 GiB, not "140 GiB" beside 557 merged (140 / 0.2506 = 558).
    assert [a.text for a in figs[3].layout.annotations] == ["one H200: 139.8 GiB"]
    data = json.loads(result_json(r))
    assert data["answers"]["merged"]["token_ids"] == list(r.merged.token_ids)
    assert [t["deployment"] for t in data["timings"]] == ["merged", "unmerged", "merged", "unmerged"]
    assert data["adapter"]["name"] == "strong" and data["footprint"]["adapter_params"] == fp.adapter_params


def test_settings_and_bundled_adapters(tiny_weights, tmp_path) -> None:  # noqa: ANN001
    for bad, msg in [(MergeSettings(prompt="  "), "prompt is empty"), (MergeSettings(prompt="x" * 1001), "at most"),
                     (MergeSettings(rank=5), "rank must be one of"), (MergeSettings(batch_sizes=()), "at least one"),
                     (MergeSettings(batch_sizes=(1, 1)), "distinct"), (MergeSettings(max_new_tokens=0), "1 to"),
                     (MergeSettings(adapter="nope"), "no adapter file nope.safetensors")]:
        with pytest.raises(ValueError, match=msg):
            bad.check(tmp_path)
    assert default_settings(tmp_path).adapter == RANDOM and file_stamp("pirate", tmp_path) == ""
    a = random_adapter(tiny_weights.config, "terse", 2, targets=("q", "o"), seed=4)
    a = type(a)(a.name, a.rank, a.alpha, a.targets, a.weights, "Terse answers",
                {"metric": {"adapter": {"words_per_answer": 9.5}, "base": {"words_per_answer": 61.0},
                            "held_out_prompts": 24}, "held_out_loss_base": 2.1, "held_out_loss": 0.7, "steps": 200,
                 "examples": [{"prompt": "Hi?", "base": "Hello there, friend.", "adapted": "Hello."}]})
    save_adapter(a, tmp_path / "terse.safetensors", dtype=torch.float32)
    s = default_settings(tmp_path)
    assert s.adapter == "terse" and s.stamp == file_stamp("terse", tmp_path) != ""
    s.check(tmp_path)
    got = resolve_adapter(tiny_weights.config, "terse", 8, tmp_path)
    assert got.rank == 2 and got.targets == ("q", "o")
    assert got is resolve_adapter(tiny_weights.config, "terse", 8, tmp_path)  # read once per file version
    frame = learned_frame(dict(got.meta))
    assert list(frame["What"]) == ["Words per answer", "Loss (nats per answer token)"]
    assert list(frame["Fine-tuned"]) == ["9.5", "0.7"] and list(frame["Base model"]) == ["61", "2.1"]
    assert examples(dict(got.meta))[0]["adapted"] == "Hello." and "200 steps" in training_line(dict(got.meta))
    assert learned_frame({}) is None and examples({}) == [] and training_line({}) == ""
    with pytest.raises(ValueError, match="no adapter file"):
        resolve_adapter(tiny_weights.config, "pirate", 8, tmp_path)


def test_a_run_is_kept_on_disk_and_read_back_whole(tiny_weights, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The lab's result survives the disk store, its adapter given back from the settings (its tensors are not
    kept: about 10 MB at rank 8 on the real model); a second call runs nothing."""
    import engine.result_store as store

    monkeypatch.setattr(store, "memo_dir", lambda: tmp_path)
    first = merge_lab.stored_merge_lab(tiny_weights, SMALL)
    monkeypatch.setattr(merge_lab, "run_merge_lab", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    again = merge_lab.stored_merge_lab(tiny_weights, SMALL)
    assert not first.from_disk and again.from_disk
    assert again.value.merged.token_ids == first.value.merged.token_ids
    assert [t.step_seconds for t in again.value.timings] == [t.step_seconds for t in first.value.timings]
    key = (0, TARGETS[0])
    assert all(torch.equal(x, y) for x, y in zip(again.value.adapter.weights[key], first.value.adapter.weights[key]))
    (entry,) = tmp_path.glob("lora-merge-lab-*.pkl")
    assert b"LoraAdapter" not in entry.read_bytes()
    with pytest.raises(ValueError, match="prompt is empty"):  # settings are checked before anything else
        merge_lab.stored_merge_lab(tiny_weights, dataclasses.replace(SMALL, prompt=" "))


def test_bench_file(tmp_path) -> None:  # noqa: ANN001
    rows = [{"rank": r, "batch": b, "merged_ms": 10.0 * b, "unmerged_ms": 11.0 * b + r, "lora_ms": 1.0}
            for r in (8, 64) for b in (1, 8)]
    (tmp_path / "lora_merge_cpu.json").write_text(json.dumps({"weights": "real", "dtype": "float32", "rows": rows}))
    frame = load_bench("cpu", tmp_path)
    assert len(frame) == 4 and frame["extra"].iloc[0] == pytest.approx(0.9)
    fig = bench_figure({"CPU": frame})
    assert len(fig.data) == 2 and fig.layout.title.text
    # Ranks in hues apart (tints of one orange left ranks 8 and 16 nearly alike), also to red-green colour blindness;
    # the same rank keeps its colour on either device.
    from app.charts.lora_merge import RANK_COLORS
    from tests.color_distance import VISIONS, color_distance
    assert min(color_distance(a, b, v) for i, a in enumerate(RANK_COLORS) for b in RANK_COLORS[i + 1:]
               for v in VISIONS) > 15
    both = bench_figure({"CPU": frame, "GPU": frame})
    assert [t.line.color for t in both.data] == [RANK_COLORS[0], RANK_COLORS[1]] * 2
    # The GPU sentence gives the added milliseconds beside the relative cost (its lines above the CPU's read as
    # the GPU doing worse).
    assert section._gpu_extra_text(frame) == ("A GPU kernel fuses that work: in the bench below it adds 9 to 72 ms a "
                                              "step, yet that is +20% to +650% of the step, because a whole step of a "
                                              "135M model there takes only 10 to 80 ms.")
    for text in ("not json", '{"rows": [{"rank": 8}]}', '{"rows": []}'):
        (tmp_path / "lora_merge_cuda.json").write_text(text)
        assert load_bench("cuda", tmp_path) is None, text
    assert load_bench("cpu", tmp_path / "missing") is None


def test_page_runs_and_keeps_results_on_bad_input(random_app: AppTest, monkeypatch: pytest.MonkeyPatch) -> None:
    """One AppTest with a small run in place of the default (the default takes ~20 s on this CPU)."""
    monkeypatch.setattr(section, "bundled_names", lambda: ())
    random_app.session_state[f"{PREFIX}-settings"] = SMALL
    at = open_page(random_app, PAGE)
    assert_clean(at)
    assert [s.value for s in at.subheader] == [
        "The same fine-tune, deployed two ways", "What serving it unmerged costs per decode step",
        "What the adapter adds: ΔW = (α/r)·BA, rank r",
        "One checkpoint per fine-tune, or one base and many adapters"]
    assert any("No trained adapter yet" in i.value for i in at.info)
    assert any("Merged and unmerged wrote the same 4 tokens" in s.value for s in at.success)
    assert [m.label for m in at.metric][:2] == ["Batch 1: unmerged", "Batch 2: unmerged"]
    assert "On one H200 (139.8 GiB)" in [m.label for m in at.metric]
    charts = len(at.get("plotly_chart"))
    assert charts >= 4  # steps, anatomy, spectrum, memory (+ the bench's file when there is one)
    assert "CPU" in " ".join(c.value for c in at.caption)
    # Merging removes the LoRA kernels' time, which the advice quotes (a merged step that timed slower on a busy
    # host made the "Extra" range read "-27% ... is gone").
    (timing,) = [d.value for d in at.dataframe if "LoRA kernels ms" in d.value.columns]
    lora_ms = timing["LoRA kernels ms"]
    advice = next(m.value for m in at.markdown if m.value.startswith("**Merge**"))
    assert f"the LoRA kernels' {lora_ms.min():.3g} to {lora_ms.max():.3g} ms a step above are gone" in advice
    # Another linear's spectrum comes from the run's adapter (nothing runs again).
    monkeypatch.setattr(merge_lab, "run_merge_lab", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran again")))
    at.selectbox(key=f"{PREFIX}-sv-target-random-r4").set_value("down").run()
    at.number_input(key=f"{PREFIX}-sv-layer-random-r4").set_value(3).run()
    assert_clean(at)
    assert any("Layer 3, down_proj" in str(c.proto.spec) for c in at.get("plotly_chart"))
    # Bad input: a message, and the results stay.
    at.text_input(key=f"{PREFIX}-prompt").set_value("   ")
    at.button(key=SUBMIT).click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The prompt is empty: type a message for the models to answer. "
                                           "The results below are the last run's."]
    assert len(at.get("plotly_chart")) == charts
    # A failing run is a message; the last results stay on screen.
    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(merge_lab, "run_merge_lab", broken)
    at.text_input(key=f"{PREFIX}-prompt").set_value("Name a fruit.")
    at.button(key=SUBMIT).click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The run failed: out of memory (simulated)"]
    assert len(at.get("plotly_chart")) == charts and len(at.subheader) == 4


def test_page_shows_what_a_bundled_adapter_learned(random_app: AppTest) -> None:
    """A trained adapter from engine/assets/adapters/ (when one is there): its training record as a table."""
    from engine.lora import load_adapter
    from engine.lora.adapter import ADAPTERS_DIR
    from engine.lora.merge_lab import bundled_names

    names = bundled_names()
    if not names:
        pytest.skip("no bundled adapter file yet (python -m training.train_lora --adapter all)")
    name = "pirate" if "pirate" in names else names[0]
    random_app.session_state[f"{PREFIX}-settings"] = MergeSettings(
        adapter=name, prompt="Name a colour.", max_new_tokens=3, batch_sizes=(1,), warmup_steps=0, timed_steps=1,
        stamp=file_stamp(name))
    at = open_page(random_app, PAGE)
    assert_clean(at)
    assert not at.info  # there is a trained adapter: no "no adapter yet" notice
    subheaders = [s.value for s in at.subheader]
    if load_adapter(ADAPTERS_DIR / f"{name}.safetensors").meta:
        assert "What this fine-tune learned" in subheaders and len(at.dataframe) == 2  # learned + timings
    assert any(f"Adapter **{name}**" in m.value for m in at.markdown)
    # Submitting the form with a trained adapter (the random-rank control hidden from the run): the run and its
    # JSON download work (the form once stored the class's slot descriptor as the rank).
    at.number_input(key=f"{PREFIX}-new-tokens").set_value(2)
    at.button(key=SUBMIT).click().run()
    assert_clean(at)
    shown = at.session_state[f"{PREFIX}-settings"]
    assert (shown.adapter, shown.rank, shown.max_new_tokens) == (name, MergeSettings().rank, 2)
    json.dumps(dataclasses.asdict(shown))
