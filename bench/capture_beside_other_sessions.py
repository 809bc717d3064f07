"""Two visitors on one GPU server (CUDA only): one engine steps eagerly in a thread while engines with CUDA
graphs are built and run in another, as two Streamlit sessions would. Reports, with the device gate
(kernels/device_gate.py) on and off, the errors each side hit and whether the graph engines' greedy tokens
equal a run made alone.

    python3 bench/capture_beside_other_sessions.py [--gate on,off] [--rounds 3] [--out FILE]

Before the gate (one run on the H200, an earlier form of this script that compared CUDA's capture modes;
results/capture_beside_other_sessions_h200_before_gate.json): in the global mode and the thread-local mode
alike, the eager side failed (`operation not permitted when stream is capturing`: its torch.cuda.synchronize,
or the allocation of its KV pool) and so did one of three captures (`operation failed due to a previous error
during capture`). With the gate it has not run on a GPU yet (the session's device time was spent).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kernels.device_gate import DEVICE_GATE  # noqa: E402
from bench.results_io import default_results_path, write_results_and_out  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def graph_engine_tokens(weights, seed: int) -> list[tuple[int, ...]]:
    engine = LLMEngine(EngineConfig(weights="random", device="cuda", num_blocks=256, max_model_len=512,
                                    cuda_graphs=True, profile_kernels=False), weights)
    g = torch.Generator().manual_seed(seed)
    rids = [engine.add_request(torch.randint(1, 40000, (int(n),), generator=g).tolist(),
                               SamplingParams(max_tokens=24, ignore_eos=True))
            for n in (17, 33, 60)]
    while engine.has_work():
        engine.step()
    return [engine.result(r).token_ids for r in rids]


def eager_loop(weights, stop: threading.Event, errors: list[str], steps: list[int]) -> None:
    """The other visitor: an engine without graphs, timing every kernel (CUDA events, syncs), restarted when done."""
    try:
        while not stop.is_set():
            engine = LLMEngine(EngineConfig(weights="random", device="cuda", num_blocks=256, max_model_len=512,
                                            cuda_graphs=False, profile_kernels=True), weights)
            for n in (40, 80, 120, 20):
                engine.add_request(list(range(1, n)), SamplingParams(max_tokens=48, ignore_eos=True))
            while engine.has_work() and not stop.is_set():
                engine.step()
                steps[0] += 1
    except Exception:  # noqa: BLE001 - the point is to see what breaks
        errors.append(traceback.format_exc(limit=3))


def set_gate(on: bool) -> None:
    """Off: the one gate's sections do nothing (instance attributes shadow the methods)."""
    for name in ("shared", "exclusive", "released"):
        if on:
            DEVICE_GATE.__dict__.pop(name, None)
        else:
            setattr(DEVICE_GATE, name, lambda *a, **k: contextlib.nullcontext())


def run_with_gate(weights, gate: str, rounds: int, alone: dict[int, list]) -> dict:
    set_gate(gate == "on")
    stop, eager_errors, graph_errors, steps = threading.Event(), [], [], [0]
    other = threading.Thread(target=eager_loop, args=(weights, stop, eager_errors, steps))
    other.start()
    time.sleep(1.0)  # let the other visitor get going
    same = 0
    t0 = time.perf_counter()
    for r in range(rounds):
        try:
            same += graph_engine_tokens(weights, seed=r) == alone[r]
        except Exception:  # noqa: BLE001
            graph_errors.append(traceback.format_exc(limit=3))
    stop.set()
    other.join()
    torch.cuda.synchronize()
    return {"gate": gate, "rounds": rounds, "graph_runs_equal_to_alone": same, "graph_errors": graph_errors,
            "eager_errors": eager_errors, "eager_steps_meanwhile": steps[0], "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gate", default="on,off")  # off last: its failures may leave the device unusable
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None,
                    help="JSON path (default bench/results/capture_beside_other_sessions_<card>.json)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    weights = load_weights("random", seed=0)
    set_gate(True)
    alone = {r: graph_engine_tokens(weights, seed=r) for r in range(args.rounds)}
    results = []
    for gate in args.gate.split(","):
        res = run_with_gate(weights, gate, args.rounds, alone)
        results.append(res)
        print(f"gate {gate:>3}: graph runs equal to alone {res['graph_runs_equal_to_alone']}/{res['rounds']}, "
              f"graph-side errors {len(res['graph_errors'])}, eager-side errors {len(res['eager_errors'])}, "
              f"eager steps meanwhile {res['eager_steps_meanwhile']}, {res['seconds']:.1f} s", flush=True)
        for e in (res["graph_errors"] + res["eager_errors"])[:2]:
            print("   ", e.strip().splitlines()[-1])
    write_results_and_out(args.out or default_results_path("capture_beside_other_sessions"), {"device": torch.cuda.get_device_name(), "runs": results})


if __name__ == "__main__":
    main()
