"""Thin, typed access to CUDA through CuPy (optional dependency)."""
