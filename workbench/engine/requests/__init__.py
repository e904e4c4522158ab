"""Request life and scheduling, torch-light and model-free.

A request from the moment it is checked to the output it ends as: `input_processor` (prompts to
`Request`s), `request` (requests and their sequences), `scheduler` and `block_manager` (which
tokens run in a step, and where their KV goes: paged blocks, prefix cache), `step_results`
(what a step computed for each sequence), `output_processor` and `detokenizer` (tokens to text,
stops), and the plain data they carry: `outputs` (`RequestOutput` and friends), `beam_search` /
`beam_tree`, `structured` (grammars), `thinking`, `prompt_embeds`, `recording`, `token_stats`.
Nothing here imports the model step, the kernels or the GPU path.
"""
