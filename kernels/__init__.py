"""Kernel families. Each has a torch reference and (on CUDA) a Triton kernel of the same signature;
`kernels.dispatch.Kernels` picks one and times every call."""
