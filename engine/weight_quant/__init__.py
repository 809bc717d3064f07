"""Weight-only quantization of the live model: round-to-nearest, AWQ and GPTQ, calibrated on real text and
measured against the full-precision model (Inference 101: GPTQ, AWQ and keeping your fine-tune)."""
