"""The SB3 door: ``fastvec.SubprocVecEnv``, a drop-in for SB3's and baselines' SubprocVecEnv.

It speaks SB3's ``VecEnv`` API (4-tuple steps, ``terminal_observation`` and
``TimeLimit.truncated`` in infos, ``env_method``, ...) over the shared-memory engine.
When Stable-Baselines3 is installed the class derives from its ``VecEnv`` so SB3's
algorithms and wrappers accept it; SB3 stays optional. This module turns the engine's
``StepResult`` into SB3's per-env info dicts: from the shared info table in one
compiled pass (``_sb3_infos``) on the common step, from records otherwise.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from copy import deepcopy
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core.infos import StepResult
from .._core.segment import build_nested, get_path, leaves_of
from ..options import EngineOptions
from . import _sb3_infos
from .base import EngineDoor, check_num_workers, check_seed
from .threads import TorchThreads

if TYPE_CHECKING:  # checked as what it is wherever SB3 is installed
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv as _Base
else:
    try:  # SB3 is optional: without it the class is a plain object with the same API.
        from stable_baselines3.common.vec_env.base_vec_env import VecEnv as _Base
    except ImportError:  # pragma: no cover - exercised in environments without SB3
        _Base = object


def tile_images(images: Sequence[np.ndarray]) -> np.ndarray:
    """Tile N HxWxC images into one near-square grid (SB3's layout)."""
    imgs = np.asarray(images)
    n, h, w, c = imgs.shape
    rows = int(np.ceil(np.sqrt(n)))
    cols = int(np.ceil(n / rows))
    padded = np.zeros((rows * cols, h, w, c), dtype=imgs.dtype)
    padded[:n] = imgs
    return padded.reshape(rows, cols, h, w, c).transpose(0, 2, 1, 3, 4).reshape(rows * h, cols * w, c)


class SubprocVecEnv(EngineDoor, _Base):
    """Shared-memory multiprocess vector env with Stable-Baselines3's ``VecEnv`` API.

    Parameters
    ----------
    env_fns : list of callables
        Functions returning gymnasium envs (pickled with cloudpickle; lambdas work).
    start_method : str, optional
        "fork", "forkserver" or "spawn"; default: multiprocessing's default.
    num_workers : int, "auto" or None
        Worker processes (default ``min(num_envs, cores)``); each runs a group of envs
        (``placement``), so ``num_envs`` may exceed the core count. "auto": the fastest
        worker count and placement timed on these envs at start-up (``fastvec.worker_layouts``).
    copy : bool, default True
        Return observations as fresh arrays. With ``copy=False`` they are read-only
        views into shared memory, valid until ``num_slots - 1`` further ``step``/``reset``
        calls have returned (the default ring of 2 keeps the previous observation
        intact through the next step, as SB3's algorithms need).
    num_slots : int, default 2
        Depth of the ring of result slots.
    step_timeout : float, optional
        Seconds before a silent worker raises ``fastvec.WorkerError``.
    restart_on_error : bool, default False
        Replace a worker that died, hung or whose env raised in ``step``; its envs are
        reset and report ``done`` with ``info["fastvec_restarted"] = True`` (a
        ``RuntimeWarning`` says which), so a long job survives a flaky env.
    spin_us, main_spin_us : float, optional
        None (default): waits that learn the loop; a number: a fixed spin in
        microseconds before sleeping (see ``fastvec.options.EngineOptions``).
    torch_threads : "auto", int or None, default "auto"
        If torch is loaded in this process, give it the cores the workers leave:
        ``"auto"`` lowers its intra-op threads to ``max(1, cores - num_workers)`` unless
        ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` is set; an int sets that many; None
        leaves torch alone. ``close()`` restores the count (``fastvec.doors.threads``).
    placement : "contiguous" (default), "balanced" or a list of env index lists
        Which envs each worker runs (env ``i``'s results stay at index ``i``):
        "balanced" places envs that differ in cost so that every worker's share of a
        step costs about the same (``env_costs``, or timed at start-up); see
        ``fastvec.AsyncVectorEnv`` and ``venv.placement``.
    env_costs : sequence of float, optional
        One relative cost per env for ``placement="balanced"`` (no probe).
    """

    def __init__(
        self,
        env_fns: list[Callable],
        start_method: str | None = None,
        *,
        num_workers: int | str | None = None,
        copy: bool = True,
        num_slots: int = 2,
        step_timeout: float | None = None,
        restart_on_error: bool = False,
        spin_us: float | None = None,
        main_spin_us: float | None = None,
        torch_threads: int | str | None = "auto",
        placement: str | Sequence[Sequence[int]] = "contiguous",
        env_costs: Sequence[float] | None = None,
    ):
        self.closed = True
        torch = TorchThreads(torch_threads)  # checked before any process starts
        self.waiting = False
        auto, workers = check_num_workers(num_workers)
        if auto:  # time the candidate layouts (fastvec.worker_layouts)
            from ..worker_layouts import resolve_auto
            from .gymnasium import AsyncVectorEnv  # times the layouts: the engine is the same

            layout = resolve_auto(AsyncVectorEnv, env_fns, placement, env_costs, context=start_method)
            workers, placement = layout.num_workers, layout.placement
        options = EngineOptions(
            num_slots=num_slots,
            autoreset_mode="same_step",
            context=start_method,
            step_timeout=step_timeout,
            restart_on_error=restart_on_error,
            spin_us=spin_us,
            main_spin_us=main_spin_us,
        )
        engine = self._make_engine(env_fns, options, workers, placement, env_costs)
        self._open_door(engine, copy, torch)
        # The compiled builder's column spec (_cols), made once per info-table schema (_cols_for).
        self._cols_for: list | None = None
        self._cols: list[tuple[Any, str, bool, np.dtype | None, type]] = []
        eng = engine
        self.num_envs = eng.num_envs
        self.observation_space = eng.single_observation_space
        self.action_space = eng.single_action_space
        self.reset_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._seeds: list[int | None] = [None for _ in range(self.num_envs)]
        self._options: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self.render_mode = eng.render_mode
        modes = (
            ["human", "rgb_array"]
            if self.render_mode == "rgb_array"
            else ([self.render_mode] if self.render_mode is not None else [])
        )
        self.metadata = {"render_modes": modes}
        self.closed = False

    @property
    def unwrapped(self):
        return self

    # -------------------------------------------------------------- stepping
    def reset(self):
        self._idle()
        slot = self._free_slot()
        kwargs: dict[int, dict[str, Any]] = {}
        for i in range(self.num_envs):
            kw: dict[str, Any] = {"seed": self._seeds[i]}
            if self._options[i]:
                kw["options"] = self._options[i]
            kwargs[i] = kw
        infos = self._engine.reset(slot, kwargs)
        for i, info in infos.items():
            self.reset_infos[i] = info
        self._slot = slot
        self._seeds = [None for _ in range(self.num_envs)]
        self._options = [{} for _ in range(self.num_envs)]
        return self._observation(slot)

    def step_async(self, actions: np.ndarray) -> None:
        self._send_step(self._batched(actions))

    def _batched(self, actions):
        if hasattr(self.action_space, "spaces") and not isinstance(actions, Mapping):
            return _batch_per_env_actions(self.action_space, actions, self.num_envs)
        return actions

    def step_wait(self):
        return self._step_result(self._receive_step())

    def step(self, actions: np.ndarray):
        return self._step_result(self._step(self._batched(actions)))

    def _table_infos(self, result: StepResult) -> list | None:
        """Per-env infos straight from the info table (the envs' own keys, values and
        types), or None when some env lacks some key."""
        info_i, info_f, mask, schema = result.table
        if self._cols_for is not schema:
            self._cols = [(key, f"_{key}", is_int, None, kind) for key, kind, is_int in schema]
            self._cols_for = schema
        return _sb3_infos.table_env_infos(info_i, info_f, mask, result.slot, self._cols)

    def _step_result(self, result: StepResult):
        eng = self._engine
        slot = result.slot
        term = eng.terminated[slot]
        trunc = eng.truncated[slot]
        dones = term | trunc
        rewards = eng.rewards[slot].astype(np.float32)
        time_limit = (trunc & ~term).tolist()
        env_infos = self._table_infos(result) if result.table is not None else None
        infos: list[dict]
        records: Sequence[tuple] = ()  # (env, step info, reset info)
        if env_infos is not None:  # the envs' own keys first, as DummyVecEnv has them
            for info, v in zip(env_infos, time_limit):
                info["TimeLimit.truncated"] = v
            infos = env_infos
        else:
            infos = [{"TimeLimit.truncated": v} for v in time_limit]
            records = result.as_records()
        ended = np.flatnonzero(dones).tolist()
        for i in ended:  # an auto-reset whose info was empty sent no record
            self.reset_infos[i] = {}
        for i, step_info, reset_info in records:
            if step_info:  # the env's own keys first, as DummyVecEnv has them
                step_info["TimeLimit.truncated"] = time_limit[i]
                infos[i] = step_info
            if reset_info is not None:
                self.reset_infos[i] = reset_info
        for i in ended:
            infos[i]["terminal_observation"] = eng.final_obs_of(slot, i)
        return self._observation(slot), rewards, dones, infos

    # -------------------------------------------------------------- seeding
    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        if seed is None:
            seed = int(np.random.randint(0, np.iinfo(np.uint32).max, dtype=np.uint32))
        first = check_seed(seed, "seed")
        self._seeds = [first + idx for idx in range(self.num_envs)]
        return self._seeds

    def set_options(self, options: list[dict] | dict | None = None) -> None:
        if options is None:
            options = {}
        if isinstance(options, dict):
            self._options = deepcopy([options] * self.num_envs)
        else:
            options = list(options)
            if len(options) != self.num_envs or not all(isinstance(o, dict) for o in options):
                raise ValueError(f"options must be a dict or a list of {self.num_envs} dicts")
            self._options = deepcopy(options)

    # -------------------------------------------------------------- env access
    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        self._idle()
        return self._engine.call("get_attr", attr_name, indices=indices)

    def has_attr(self, attr_name: str) -> bool:
        self._idle()
        return all(self._engine.call("has_attr", attr_name))

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        self._idle()
        n = len(self._engine.normalize_indices(indices))
        self._engine.call("set_attr", attr_name, indices=indices, values=[value] * n)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        self._idle()
        return self._engine.call("env_method", method_name, method_args, method_kwargs, indices=indices)

    def env_is_wrapped(self, wrapper_class: type, indices=None) -> list[bool]:
        self._idle()
        n = len(self._engine.normalize_indices(indices))
        return self._engine.call("is_wrapped", None, indices=indices, values=[wrapper_class] * n)

    def getattr_depth_check(self, name: str, already_found: bool) -> str | None:
        if hasattr(self, name) and already_found:
            return f"{type(self).__module__}.{type(self).__name__}"
        return None

    def _get_indices(self, indices) -> list[int]:
        return self._engine.normalize_indices(indices)

    # -------------------------------------------------------------- rendering
    def get_images(self) -> Sequence[np.ndarray | None]:
        self._idle()
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        return self._engine.call("render", None)

    def render(self, mode: str | None = None) -> np.ndarray | None:
        """Same contract as SB3's ``VecEnv.render``: tiles rgb_array frames."""
        if mode == "human" and self.render_mode != mode:
            if self.render_mode != "rgb_array":
                warnings.warn(
                    f"You tried to render a VecEnv with mode='{mode}' but the render mode defined when "
                    f"initializing the environment must be 'human' or 'rgb_array', not '{self.render_mode}'.",
                    stacklevel=2,
                )
                return None
        elif mode and self.render_mode != mode:
            warnings.warn(
                f"render modes are fixed when the envs are created; mode={mode!r} differs from "
                f"the envs' render_mode={self.render_mode!r}",
                stacklevel=2,
            )
            return None
        mode = mode or self.render_mode
        if mode is None:
            warnings.warn(
                "You tried to call render() but no `render_mode` was passed to the env constructor.", stacklevel=2
            )
            return None
        if self.render_mode == "human":
            self.env_method("render")
            return None
        if mode in ("rgb_array", "human"):
            # render_mode is "rgb_array" here (the checks above), so get_images() has frames, no None
            big = tile_images(self.get_images())  # type: ignore[arg-type]
            if mode == "human":
                import cv2  # only needed to show frames of rgb_array envs

                cv2.imshow("vecenv", big[:, :, ::-1])
                cv2.waitKey(1)
                return None
            return big
        self.env_method("render")
        return None

    # -------------------------------------------------------------- closing
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._close_door()


def _batch_per_env_actions(space, actions, num_envs: int) -> dict | tuple:
    """SB3 passes Dict/Tuple actions as a sequence with one action per env
    (``actions[i]`` goes to env i); turn that into the batched form the engine takes."""
    if isinstance(actions, (str, bytes)) or not hasattr(actions, "__len__") or len(actions) != num_envs:
        raise ValueError(
            f"actions for a {type(space).__name__} action space must be a sequence of {num_envs} "
            f"per-env actions (or a batched dict), got {type(actions).__name__}"
        )
    per_leaf = []
    for leaf in leaves_of(space):
        where = "actions[i]" + "".join(f"[{k!r}]" for k in leaf.path)
        values = []
        for i in range(num_envs):
            try:
                values.append(np.asarray(get_path(actions[i], leaf.path)))
            except (KeyError, IndexError, TypeError) as exc:
                raise ValueError(f"{where} is missing for env {i}: {exc!r}") from None
        try:
            per_leaf.append(np.stack(values))
        except ValueError as exc:
            raise ValueError(f"{where}: the envs' actions do not stack: {exc}") from None
    return build_nested(space, per_leaf)[0]
