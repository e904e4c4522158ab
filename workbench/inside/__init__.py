"""What a request sees and changes inside the model, by TransformerLens's names.

`params` (what a request asks: `CaptureParams`, `LogitLensParams`, `Intervention`), the views
of what the engine recorded (`ActivationCache`, `AttentionPattern`, `LogitLens`), and `tensors`,
the wire form of their arrays over HTTP. Plain data, below the engine and the serving layer,
which build and send them; names load lazily (no pandas or matplotlib at import).
"""
