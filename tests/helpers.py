"""Helpers shared by the test files: comparisons for the equivalence tests; for the
trainer's, its zero-copy storage, a run's clock and one-line errors."""

from __future__ import annotations

import numbers

import numpy as np


def assert_same(actual, expected, path: str = "value", check_dtype: bool = True) -> None:
    """Recursively assert that ``actual`` equals ``expected``.

    dicts: same keys, values compared recursively; tuples/lists: same length and type;
    numpy arrays: same shape, same dtype (unless ``check_dtype`` is false) and equal
    values (NaN equals NaN); object arrays are compared element by element, recursively.
    A numpy scalar and a 0-d array of the same dtype compare equal; Python numbers are
    compared by value.
    """
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected a dict, got {type(actual).__name__}"
        assert set(actual) == set(expected), (
            f"{path}: keys differ: got {sorted(map(str, actual))}, expected {sorted(map(str, expected))}"
        )
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]", check_dtype)
        return
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, type(expected)), (
            f"{path}: expected a {type(expected).__name__}, got {type(actual).__name__}"
        )
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{k}]", check_dtype)
        return
    if isinstance(expected, np.ndarray) and expected.dtype == object:
        assert isinstance(actual, np.ndarray), f"{path}: expected an object array, got {type(actual).__name__}"
        assert actual.dtype == object, f"{path}: dtype {actual.dtype} != object"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        for idx in np.ndindex(expected.shape):
            assert_same(actual[idx], expected[idx], f"{path}[{', '.join(map(str, idx))}]", check_dtype)
        return
    if isinstance(expected, (np.ndarray, np.generic)):
        assert isinstance(actual, (np.ndarray, np.generic)), (
            f"{path}: expected a numpy value of dtype {expected.dtype}, got {type(actual).__name__} {actual!r}"
        )
        a, e = np.asarray(actual), np.asarray(expected)
        if check_dtype:
            assert a.dtype == e.dtype, f"{path}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"{path}: shape {a.shape} != {e.shape}"
        np.testing.assert_array_equal(a, e, err_msg=path, strict=False)
        return
    if expected is None or isinstance(expected, (str, bytes, bool)):
        assert actual == expected and type(actual) is type(expected), f"{path}: {actual!r} != {expected!r}"
        return
    if isinstance(expected, numbers.Number):
        assert isinstance(actual, (numbers.Number, np.generic)), f"{path}: {actual!r} is not a number"
        if type(expected) in (int, float, complex):  # infos keep the env's own types
            assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != {type(expected).__name__}"
        assert actual == expected or (actual != actual and expected != expected), f"{path}: {actual!r} != {expected!r}"
        return
    assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def copy_nested(value):
    """A deep copy of a nested observation (dicts/tuples of arrays)."""
    if isinstance(value, dict):
        return {k: copy_nested(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(copy_nested(v) for v in value)
    return np.array(value, copy=True)


def leaves(value):
    """The arrays of a nested observation, depth first."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in leaves(v)]
    if isinstance(value, tuple):
        return [x for v in value for x in leaves(v)]
    return [value]


def count_builds(monkeypatch, name: str) -> list:
    """Wrap a door's compiled info builder (``table_vector_infos`` of the gymnasium door,
    ``table_env_infos`` of the SB3 door): the returned list gets one bool per call, True
    when it built the infos (False: it declined)."""
    import importlib

    E = importlib.import_module(
        {"table_vector_infos": "fastvec.doors._gym_infos", "table_env_infos": "fastvec.doors._sb3_infos"}[name]
    )

    built: list = []
    original = getattr(E, name)

    def counting(*args):
        out = original(*args)
        built.append(out is not None)
        return out

    monkeypatch.setattr(E, name, counting)
    return built


def run_clock(monkeypatch) -> list:
    """Wrap a training run's clock (``fastvec.train.run.loop.Run.wall``): the returned
    list gets ``(phase, wall_before, seconds)`` per reading, the run's phase at the time
    ("safe point": its stop check), the wall time it resumed from (0 for a new run) and
    the reading, counted over resumes."""
    from fastvec.train.run.loop import Run

    readings: list = []
    wall = Run.wall

    def reading(self, now):
        seconds = wall(self, now)
        readings.append((self.phase, self.wall_before, seconds))
        return seconds

    monkeypatch.setattr(Run, "wall", reading)
    return readings


def stop_checks(readings: list) -> list:
    """The readings of ``run_clock`` a run's stop checks made, one per safe point."""
    return [seconds for phase, _before, seconds in readings if phase == "safe point"]


def engine_storage(env_fns, num_slots, num_workers):
    """The trainer's zero-copy storage over a forked engine, as ``fastvec train`` builds it."""
    from fastvec.engine import Engine
    from fastvec.train import EngineStorage

    return EngineStorage(
        Engine(env_fns, num_workers=num_workers, num_slots=num_slots, autoreset_mode="same_step", context="fork")
    )


def one_line_error(capsys, code, expect):
    """A command's failure (``code``) as a user sees it: ``expect`` in one line of
    stderr, no traceback."""
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert expect in err, err
