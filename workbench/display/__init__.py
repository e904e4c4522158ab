"""Display helpers every view shares: deterministic HTML (`html`), pandas frames (`frames`) and
matplotlib figures (`figure`), loaded only when a view is drawn."""
