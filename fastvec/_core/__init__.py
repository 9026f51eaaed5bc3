"""The engine's pieces, one concern per module (``docs/ARCHITECTURE.md`` has the map).

Compiled (Cython, sources in ``csrc/fastvec/_core/``):

- ``protocol``: the wire protocol's constants, declared once (``protocol.pxd``), and
  ``WaitResult``, how a wait for replies ended;
- ``channel``: one import point for the control channel's pieces: ``framing`` (socket
  framing), ``controller`` (the parent's side of the doorbells of the shared control
  block) and ``worker_channel`` (a worker's side); how their waits learn the loop is in
  ``forecast.pxd``, the machine-tuned numbers in ``tuning.pxd``;
- ``stepper``: the worker's step loop;
- ``bounds``: the action bounds check;
- ``infotable``: the shared info table's helpers.

Python:

- ``layout``: how spaces map onto one shared-memory segment;
- ``shm``: creating, attaching and freeing that segment;
- ``actions``: validating a batch of actions before anything is sent;
- ``infos``: step infos on their way from workers to the doors, and ``StepResult``;
- ``worker``: the worker process;
- ``supervisor``: starting, watching, replacing and stopping worker processes;
- ``base``: ``EngineBase``, what every engine does on its caller's side.
"""
