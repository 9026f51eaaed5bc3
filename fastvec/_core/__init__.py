"""The engine's pieces, one concern per module (``docs/ARCHITECTURE.md`` has the map,
``docs/guide/engine-internals.md`` the details).

Compiled (Cython, sources in ``csrc/fastvec/_core/``):

- ``protocol``: the wire protocol's constants, declared once (``protocol.pxd``), and
  ``WaitResult``, how a wait for replies ended;
- ``framing``: 16-byte headers and payloads on a socketpair per worker;
- ``controller``: the parent's side of the doorbells of the shared control block;
- ``worker_channel``: a worker's side of them;
- ``channel``: one import point for the three above (how their waits learn the loop is
  in ``forecast.pxd``, the machine-tuned numbers in ``tuning.pxd``, the atomics and
  clock in ``sync.pxd``);
- ``stepper``: the worker's step loop;
- ``bounds``: the action bounds check;
- ``infotable``: the shared info table's helpers.

Python:

- ``base``: ``EngineBase``, what every engine does on its caller's side;
- ``startup``, ``batch_groups``, ``resets_calls``: ``Engine``'s start-up (spawn, probe,
  place, lay out the segment, replace a worker), its batch groups, its resets and calls;
- ``segment``: how spaces map onto one shared-memory segment; creating, attaching and
  freeing it;
- ``actions``: validating a batch of actions before anything is sent;
- ``pickled``: pickling payloads, and the rows of leaves that travel pickled;
- ``infos``: step infos on their way from workers to the doors, and ``StepResult``;
- ``replies``: every worker's reply to a command, waited for, read and decoded;
- ``placement``: which envs each worker runs, and ``PlacementReport``;
- ``supervisor``: starting, watching, replacing and stopping worker processes;
- ``worker``: the worker process (``WorkerSpec``, what it starts from).
"""
