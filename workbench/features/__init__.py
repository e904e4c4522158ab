"""Features: sparse autoencoders (SAELens's format) read and steered per request, and trained.

`sae` loads an SAE folder and computes SAELens's `encode` / `decode`; the engine reads features at
the SAE's hook on the rows of the requests that ask (`engine/step/inspection.py`), and an
intervention adds a feature's decoder direction (`workbench.inside.resolve`). `train` trains one
with SAELens's trainer on activation rows (optional: `pip install 'workbench[train]'`).
"""
