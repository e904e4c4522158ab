"""The kernels: what computes a model's projections and the small ops between them on this CPU.

`projections` is the table of projection kernels ("avx2", "avx512bf16", "amx", "onednn",
"torch", "gguf", "gguf_q8") and the choice among them by probed capability. The C library
(`c_library`: the sources in `csrc/`, compiled once per machine, loaded with ctypes) holds one
module per kernel: `c_products` (few-row float32 / bfloat16 / AMX products), `gguf_products`
(products with a GGUF file's blocks), `gguf_q8` (the same blocks times int8 activations:
llama.cpp's arithmetic, `gguf_activations="q8"`), `c_attention`, `c_layer_ops` (norms, rotary, SiLU) and
`c_decode_stack` (a decode step in one call). `python -m workbench.engine.kernels` prints what
this machine has and picks.
"""
