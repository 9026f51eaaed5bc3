# cython: language_level=3
"""The wire protocol's constants (declared in protocol.pxd), for Python code."""
