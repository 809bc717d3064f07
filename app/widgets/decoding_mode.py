"""The "Decoding (all requests)" choice of the speculative pages: greedy, sampled at a temperature, or
each request as the scenario says; applied by rewriting every request's temperature (and seed)."""
from __future__ import annotations

from app.scenarios import RequestSpec, Scenario

DECODING_MODES = ("greedy", "sampled, T = 0.7", "sampled, T = 1.0", "as in the scenario")


def default_mode_index(scenario: Scenario) -> int:
    temps = {r.temperature for r in scenario.requests}
    return 0 if temps == {0.0} else 3


def apply_decoding_mode(scenario: Scenario, mode: str) -> Scenario:
    """Every request greedy or sampled at the mode's temperature; sampled requests without a seed get
    their index as seed, so a rerun draws the same tokens."""
    if mode == "as in the scenario":
        return scenario
    t = 0.0 if mode == "greedy" else float(mode.split("= ")[1])
    return scenario.with_requests([RequestSpec(**{**r.to_dict(), "stop": tuple(r.stop), "temperature": t,
                                                  "seed": r.seed if r.seed is not None or t == 0 else i})
                                   for i, r in enumerate(scenario.requests)])
