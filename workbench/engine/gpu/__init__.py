"""The CUDA path that waits for a GPU: prepared and tested on CPU (their CPU twins, Triton's
interpreter), wired into nothing yet.

`step_graphs` (decode steps captured as CUDA graphs, with a CPU eager twin), `device_sampling`
(sampling on the device without host syncs) and `triton/` (paged attention over block tables,
fused add+RMSNorm, rotary+KV write and SiLU kernels). `make gpu-check` runs them on a GPU.
"""
