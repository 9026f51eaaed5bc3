"""What the scripts in ``benchmarks/`` share.

- ``cli_runs``: ``fastvec train`` / ``fastvec eval`` run as a user runs them (the command
  line, a fresh process, the result JSON, the run's ``metrics.jsonl``);
- ``processes``: fresh processes (their ``PYTHONPATH``, their last JSON line, the CPU
  time of the children waited for);
- ``common``: a run's bookkeeping (arguments, machine, progress, ``span``, the files);
- ``envs``: the env factories; ``vecenv``, ``loops`` and ``loop_children``,
  ``train_children``: the measurements; ``report``, ``train_report``, ``soak_report``:
  tables and charts.

The scripts put ``benchmarks/`` first on ``sys.path`` and import ``harness`` from there,
so one harness measures any build of fastvec that ``PYTHONPATH`` points at
(``ab_builds.py``): it uses only fastvec's public doors and long-standing internals
(``fastvec.options.available_cores``, ``Engine.wait_counts``, the trainer's public
``fastvec.train`` names).
"""
