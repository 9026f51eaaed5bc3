"""What the scripts in ``benchmarks/`` share: the vector-env workloads and candidates,
the real loops, reports, charts and the run's bookkeeping.

The scripts put ``benchmarks/`` first on ``sys.path`` and import ``harness`` from there,
so one harness measures any build of fastvec that ``PYTHONPATH`` points at
(``ab_builds.py``): it uses only fastvec's public doors and long-standing internals
(``fastvec.options.available_cores``, ``Engine.wait_counts``, the trainer's
``run_training``).
"""
