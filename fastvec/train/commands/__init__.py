"""The commands: ``fastvec train``, ``fastvec eval`` and ``fastvec export``, from a shell or from Python.

- ``cli``: the command lines, their flags and errors;
- ``launch``: ``run_training``, the one place that builds envs and picks a backend;
- ``outputs``: ``--track`` and its options, and the model card a run leaves;
- ``local_ranks``: ``fastvec train --nproc N``, N ranks on this machine;
- ``evaluate``: ``fastvec eval``, a checkpoint's policy played for some episodes;
- ``export``: ``fastvec export``, a run's policy written as a TorchScript or ONNX file.
"""
