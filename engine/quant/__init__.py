"""INT4 weight-only quantization: converters into the kernel's canonical form, the
``Int4Linear`` module, the GPTQ and round-to-nearest quantizers and the GPTQ checkpoint writer.

The canonical packed weight is ``kernels.int4_gemm.Int4Weight``; everything here converts
into it (GPTQ, AWQ, GGUF Q4_1) or out of it.
"""
