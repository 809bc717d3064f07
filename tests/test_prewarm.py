"""`python3 -m app.prewarm`: each lab's default run is computed once and stored where the page reads it, so a
page opened on a prepared machine shows it at once (read back, saying so) and runs nothing."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

import engine.act_quant.lab as aq_lab
import engine.kv_compression.lab as kv_lab
import engine.kv_latent.lab as latent_lab
import engine.lora.merge_lab as merge_lab
import engine.result_store as store
import engine.weight_quant.lab as wq_lab
from app import prewarm, state
from engine.weight_quant.lab import LabSettings
from tests.apptest_helpers import assert_clean, open_page, random_app  # noqa: F401 (fixture)
from tests.test_kv_compression_page import PAGE as KV_PAGE
from tests.test_weight_quant_page import PAGE, PREFIX

# The cheapest real weight-quantization result (one method, two tokens), standing in for the default run's.
ONE_METHOD = LabSettings(methods=("rtn",), bits=4, group=64, calibration_tokens=64, max_new_tokens=2)


@dataclass(frozen=True)
class _MergeStandIn:
    """What the LoRA lab's stand-in returns: like its result, a record with an adapter field."""

    adapter: object = None


def _never(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    raise AssertionError("ran again")


def test_prewarm_stores_each_default_run_where_the_page_reads_it(random_app, random_weights, tmp_path,  # noqa: ANN001
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "memo_dir", lambda: tmp_path)
    small = wq_lab.run_lab(random_weights, ONE_METHOD)
    ran: list[str] = []

    def stand_in(name: str, value: object):  # noqa: ANN202 - a lab's run, counted, returning a cheap result
        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            ran.append(name)
            return value
        return run

    monkeypatch.setattr(wq_lab, "run_lab", stand_in("weight", small))
    monkeypatch.setattr(aq_lab, "run_lab", stand_in("activation", "activation result"))
    monkeypatch.setattr(latent_lab, "run_latent_lab", stand_in("latent", "latent result"))
    monkeypatch.setattr(merge_lab, "run_merge_lab", stand_in("lora", _MergeStandIn()))
    hi = random_weights.tokenizer.chat_prompt_ids("Hi")
    kv_small = kv_lab.KVLab(random_weights).run(hi, [kv_lab.Variant("int4")], 2)
    monkeypatch.setattr(kv_lab.KVLab, "run", stand_in("kv", kv_small))
    labs = ["weight", "activation", "latent", "lora", "kv"]
    lines: list[str] = []
    first = prewarm.prewarm(random_weights, log=lines.append)
    assert ran == labs and not any(r.from_disk for r in first)
    assert sum("computed in" in line and "and stored" in line for line in lines) == len(labs)
    again = prewarm.prewarm(random_weights, log=lines.append)
    assert ran == labs and all(r.from_disk for r in again)
    assert sum("already on disk" in line for line in lines) == len(labs)

    # The weight-quantization page at its default settings, on a fresh server: read back, nothing run.
    monkeypatch.setattr(wq_lab, "run_lab", _never)
    monkeypatch.setattr(state, "_SERVER_RUNS", type(state._SERVER_RUNS)())
    at = open_page(random_app, PAGE)
    assert_clean(at)
    assert at.session_state[f"{PREFIX}-settings"] == LabSettings()
    assert any("Read back from this machine's disk cache" in c.value for c in at.caption)
    # So does the KV compression page, whose lab is built from the prompt's tokens rather than a settings record.
    monkeypatch.setattr(kv_lab.KVLab, "run", _never)
    at = open_page(random_app, KV_PAGE)
    assert_clean(at)
    assert any("Read back from this machine's disk cache" in c.value for c in at.caption)


def test_on_a_gpu_server_there_is_nothing_to_prepare(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(prewarm, "device", lambda: "cuda")
    monkeypatch.setattr(prewarm, "load_weights", _never)
    assert prewarm.main([]) == 0
    assert "CPU runs only" in capsys.readouterr().out
