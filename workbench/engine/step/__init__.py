"""The model step: one forward pass over a step's scheduled tokens, and what turns its logits
into tokens.

`runner` (decoders: one ragged row, paged KV) and `encoder_runner` (embedding models) run the
model; `model_limits` probes what it computes at start-up; `decoder` is the lean layer loop,
`attention` / `attention_modules` the paged attention, `fusion` the fused projections on the
chosen kernel, `lora_manager` the adapters' rows, `inspection` the per-request recording and
interventions, `sampler` the sampling, `pooling` the pooled results. Below it: the kernels
(`engine/kernels/`) and request life (`engine/requests/`).
"""
