"""Weights and activations quantized (W8A8 INT8, FP8 E4M3, NVFP4 and MXFP4) with and without SmoothQuant, simulated in
fp32 on the live model and measured against the full model (Inference 101: FP8 and FP4 inference, SmoothQuant
and activation quantization)."""
