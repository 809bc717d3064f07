"""Serving under load, on the live engine: requests arrive at a given rate (Poisson), each engine
configuration serves them on engine time, and every request's TTFT and TPOT are checked against latency
SLOs. Goodput is the highest rate at which enough requests still meet them."""
from engine.serving_load.runner import LoadConfig, LoadRun, StepSample, run_load
from engine.serving_load.slo import (SLO, RequestTiming, attainment, goodput_rate, passes_after_miss, percentile,
                                     reaches_goal)
from engine.serving_load.sweep import SweepResult, check_sweep, run_sweep
from engine.serving_load.workload import WORKLOADS, LoadRequest, WorkloadSpec, arrivals, make_requests

__all__ = ["SLO", "WORKLOADS", "LoadConfig", "LoadRequest", "LoadRun", "RequestTiming", "StepSample", "SweepResult",
           "WorkloadSpec", "arrivals", "attainment", "check_sweep", "goodput_rate", "make_requests",
           "passes_after_miss", "percentile", "reaches_goal", "run_load", "run_sweep"]
