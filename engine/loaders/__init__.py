"""Readers for model files: Hugging Face directories and GGUF files (see engine.loader)."""
