"""A latent KV cache retrofitted onto the live model: MLA's idea (cache one small vector per token and layer,
rebuild K and V from it) applied to SmolLM2's GQA projections by factoring them, with the cache really holding
only the latent. DeepSeek's MLA learns the factorisation in training; this finds one after the fact."""
