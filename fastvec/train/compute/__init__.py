"""Where the trainer computes: torch's device, the processes of a data-parallel run.

- ``torch_state``: the device, torch's RNG states and threads;
- ``ranks``: the ranks of a data-parallel run and the collectives they share;
- ``pinned``: page-locked host memory, for asynchronous copies to a GPU;
- ``busy``: the fraction of the time the learner's device is busy.
"""
