"""The bench commands the pages print (when a results file is missing) name scripts that exist, and the
speculative pages' two commands are the ones bench/spec.py's docstring gives, so a reader can copy either."""
from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

from app.analysis import kv_quant_kernel, lora_merge, parallelism, speculative, weight_quant

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "kv_quant_kernel": kv_quant_kernel.BENCH_COMMAND, "lora_merge": lora_merge.BENCH_COMMAND,
    "parallelism": parallelism.BENCH_COMMAND, "parallelism (CPU)": parallelism.CPU_BENCH_COMMAND,
    "weight_quant": weight_quant.BENCH_COMMAND, "speculative": speculative.BENCH_COMMAND,
    "speculative (every drafter)": speculative.ALL_DRAFTERS_BENCH_COMMAND,
}


def script_of(command: str) -> Path:
    words = [w for w in shlex.split(command) if "=" not in w or w.startswith("-")]
    return ROOT / next(w for w in words if w.endswith(".py"))


def test_every_command_names_a_bench_script() -> None:
    for page, command in COMMANDS.items():
        assert script_of(command).is_file(), (page, command)


def test_speculative_commands_match_the_script_docstring() -> None:
    doc = ast.get_docstring(ast.parse((ROOT / "bench" / "spec.py").read_text()))
    assert doc is not None
    # One command per usage line: join the backslash continuations, drop the trailing comments.
    usage = [re.sub(r"\s+#.*$", "", line).strip()
             for line in re.sub(r"\\\n\s*", "", doc).splitlines() if "bench/spec.py" in line]
    usage = [" ".join(line.split()) for line in usage]
    for command in (speculative.BENCH_COMMAND, speculative.ALL_DRAFTERS_BENCH_COMMAND):
        assert " ".join(command.split()) in usage, (command, usage)
