"""bench/results_io.py: a benchmark's default file name says which card ran it (the device tool lends H100s as
well as H200s), and the JSON lands where it says."""
from __future__ import annotations

import json

import pytest

from bench.results_io import RESULTS, default_results_path, device_tag, engine_results_path, write_results_and_out


@pytest.mark.parametrize("name, tag", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                       ("NVIDIA A100-SXM4-80GB", "a100_sxm4_80gb"), ("NVIDIA L40S", "l40s"),
                                       ("NVIDIA GeForce RTX 4090", "geforce_rtx_4090"), ("", "cuda")])
def test_the_tag_names_the_card(name: str, tag: str) -> None:
    assert device_tag(name) == tag
    assert default_results_path("kernels", name) == RESULTS / f"kernels_{tag}.json"


def test_without_cuda_the_tag_is_cpu(monkeypatch) -> None:  # noqa: ANN001
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_tag() == "cpu"


def test_engine_benches_name_the_device_the_flag_chose(monkeypatch) -> None:  # noqa: ANN001
    import torch

    # A CPU run on a GPU machine is a CPU result; a CUDA run names its card.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 80GB HBM3")
    assert engine_results_path("throughput", cuda=False) == RESULTS / "throughput_cpu.json"
    assert engine_results_path("throughput", cuda=True) == RESULTS / "throughput_cuda_h100.json"
    assert engine_results_path("slo_goodput", cuda=True, tag="run1") == RESULTS / "slo_goodput_cuda_h100_run1.json"


def test_a_copy_lands_in_out_under_the_same_name(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    write_results_and_out(tmp_path / "results" / "x_h100.json", {"a": 1})
    assert json.loads((tmp_path / "out" / "x_h100.json").read_text()) == {"a": 1}
    assert (tmp_path / "results" / "x_h100.json").is_file()


def test_a_path_already_in_out_is_written_once_and_odd_types_as_text(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    import torch

    monkeypatch.setenv("OUT", str(tmp_path))
    write_results_and_out(tmp_path / "k.json", {"dtype": torch.bfloat16})
    assert [p.name for p in tmp_path.iterdir()] == ["k.json"]
    assert json.loads((tmp_path / "k.json").read_text()) == {"dtype": "torch.bfloat16"}
