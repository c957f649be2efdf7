"""One small module per family, each a thin use of `ula.core` (DESIGN §3)."""
