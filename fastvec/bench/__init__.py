"""Measuring code for fastvec (importable from an installed package)."""
