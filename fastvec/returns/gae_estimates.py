"""Generalized Advantage Estimation (GAE) on ``[T, N]`` rollouts.

The recursion runs in a typed Cython kernel (:mod:`fastvec._gae`) with the
GIL released; this module validates and converts the inputs, allocates (or
checks) the outputs and calls the kernel. Two conventions are offered:

* :func:`gae` -- gymnasium convention: per-step ``terminated`` / ``truncated``
  flags and an explicit ``next_values`` array (the value of the state that
  followed each step, i.e. of the final observation when an episode ended).
* :func:`gae_from_dones` -- CleanRL ``ppo.py`` convention: ``dones[t]`` marks
  observation ``t`` as the first of a new episode, plus ``last_value`` /
  ``last_done`` for the observation after the last step.
"""

from __future__ import annotations

from .._gae import gae_dones_kernel, gae_kernel
from .kernel_arrays import as_array, coef, finish, flag_input, float_input, outputs, values_dtype

__all__ = ["gae", "gae_from_dones"]


# --------------------------------------------------------------------------- #
# public API
# --------------------------------------------------------------------------- #
def gae(rewards, values, next_values, terminated, truncated, gamma, lam, *, out=None):
    r"""Generalized Advantage Estimation with terminated / truncated flags.

    For ``t = T-1, ..., 0`` and every environment ``n``::

        delta[t] = rewards[t] + gamma * (1 - terminated[t]) * next_values[t] - values[t]
        A[t]     = delta[t] + gamma * lam * (1 - terminated[t]) * (1 - truncated[t]) * A[t+1]
        A[T]     = 0
        returns  = A + values

    ``terminated`` ends the episode without bootstrapping (the value of the
    state after a terminal step is 0). ``truncated`` (time limit) still
    bootstraps from ``next_values[t]`` but stops the recursion, like a
    terminal step. When both are set, ``terminated`` wins (no bootstrap).

    Masking is exact, not arithmetic: where ``terminated[t]`` is set,
    ``next_values[t]`` is never read (it may hold anything, NaN included),
    and where either flag is set ``A[t+1]`` is not used, so a NaN/inf does not
    leak across an episode boundary. Otherwise NaN propagates: a NaN input at
    step ``t`` makes ``A`` NaN at ``t`` and at the earlier steps of the same
    episode segment.

    Parameters
    ----------
    rewards : array_like, shape [T, N]
        ``rewards[t, n]``, reward of step ``t`` in environment ``n``. Any real
        dtype (bool, integer, float); converted to the dtype of ``values``.
    values : array_like, shape [T, N], float32 or float64
        ``values[t]`` = V(s_t), the value of the observation step ``t`` was
        taken from. Its dtype is the computation and output dtype.
    next_values : array_like, shape [T, N]
        ``next_values[t]`` = value of the state that followed step ``t``
        (the value of the *final* observation when the episode ended at
        ``t``). Converted to the dtype of ``values`` (float64 next_values
        with float32 values are rounded to float32).
    terminated, truncated : array_like, shape [T, N]
        Per-step flags. bool, any integer or any float dtype; any value
        ``!= 0`` counts as set (NaN too). bool / int8 / uint8 are used without
        a copy.
    gamma : float
        Discount factor, finite, in ``[0, 1]``.
    lam : float
        GAE lambda, finite, in ``[0, 1]``.
    out : tuple of two ndarray, optional
        ``(adv_out, ret_out)``: writable arrays of shape ``[T, N]`` and
        exactly the dtype of ``values``, filled in place and returned (the same
        objects). They must not overlap each other or any input. Any strides
        are accepted (a layout the kernel cannot write directly goes through a
        temporary).

    Returns
    -------
    advantages, returns : ndarray, shape [T, N]
        In the dtype of ``values``.

    Raises
    ------
    ValueError
        Naming the offending argument, for: non-numeric input (None, strings,
        object or complex arrays, ragged lists); ``values`` not float32 /
        float64; an input that is not 2-D (1-D ``[T]`` inputs are rejected:
        use ``x[:, None]``); a shape different from ``values.shape``;
        ``gamma`` / ``lam`` non-finite or outside ``[0, 1]``; a bad ``out``.

    Notes
    -----
    * Rank must be 2. Empty inputs (``T == 0`` or ``N == 0``) are allowed and
      give empty outputs.
    * Layout: inputs whose last axis is unit-stride (C-contiguous arrays, row
      slices such as ``x[::2]``) are read in place; others (e.g. transposed
      views) are copied once to C order first. Results never depend on the
      layout.
    * The kernel runs without the GIL; other Python threads keep running.
    * Arithmetic is done in the dtype of ``values``.

    Examples
    --------
    >>> import numpy as np
    >>> from fastvec.returns.gae_estimates import gae
    >>> r = np.ones((3, 1)); v = np.zeros((3, 1)); nv = np.zeros((3, 1))
    >>> z = np.zeros((3, 1), bool)
    >>> adv, ret = gae(r, v, nv, z, z, gamma=0.5, lam=1.0)
    >>> adv[:, 0].tolist()
    [1.75, 1.5, 1.0]
    """
    values, dt = values_dtype(values)
    shape = values.shape
    rewards = float_input(rewards, "rewards", dt, shape)
    next_values = float_input(next_values, "next_values", dt, shape)
    terminated = flag_input(terminated, "terminated", shape)
    truncated = flag_input(truncated, "truncated", shape)
    gamma = coef(gamma, "gamma")
    lam = coef(lam, "lam")
    adv, ret, adv_k, ret_k = outputs(
        out,
        dt,
        shape,
        (
            ("rewards", rewards),
            ("values", values),
            ("next_values", next_values),
            ("terminated", terminated),
            ("truncated", truncated),
        )
        if out is not None
        else (),
    )
    gae_kernel(rewards, values, next_values, terminated, truncated, gamma, lam, adv_k, ret_k)
    return finish(adv, ret, adv_k, ret_k)


def gae_from_dones(rewards, values, dones, last_value, last_done, gamma, lam, *, out=None):
    r"""GAE in the CleanRL ``ppo.py`` convention (``dones`` mark episode starts).

    ``dones[t]`` is 1 when observation ``t`` is the first of a new episode
    (CleanRL stores ``next_done`` before step ``t``), ``last_value`` is
    V(observation after the last step) and ``last_done`` its done flag.
    Computes exactly CleanRL's loop::

        for t in reversed(range(T)):
            if t == T - 1:
                nextnonterminal = 1.0 - last_done; nextvalues = last_value
            else:
                nextnonterminal = 1.0 - dones[t + 1]; nextvalues = values[t + 1]
            delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
        returns = advantages + values

    i.e. :func:`gae` with ``next_values[t] = values[t + 1]``
    (``last_value`` at ``T - 1``), ``terminated[t] = dones[t + 1]``
    (``last_done`` at ``T - 1``) and no truncation, on the same kernel, with
    no copies of ``values`` / ``dones``. As in :func:`gae` the masks are
    exact selects, so a NaN in ``values[t + 1]`` where ``dones[t + 1]`` is set
    does not leak into step ``t`` (CleanRL's ``0 * nan`` would).

    Parameters
    ----------
    rewards : array_like, shape [T, N]
        Any real dtype, converted to the dtype of ``values``.
    values : array_like, shape [T, N], float32 or float64
        ``values[t]`` = V(obs t). Sets the computation / output dtype.
    dones : array_like, shape [T, N]
        Episode-start flags; bool, integer or float, ``!= 0`` means set.
        ``dones[0]`` is not used (as in CleanRL).
    last_value : array_like, shape [N] or [1, N]
        Value of the observation after the last step (CleanRL's
        ``next_value``). Converted to the dtype of ``values``.
    last_done : array_like, shape [N] or [1, N]
        Done flag of that observation (CleanRL's ``next_done``); same flag
        rules as ``dones``.
    gamma, lam : float
        Finite, in ``[0, 1]``.
    out : tuple of two ndarray, optional
        ``(adv_out, ret_out)``, as in :func:`gae`.

    Returns
    -------
    advantages, returns : ndarray, shape [T, N]
        In the dtype of ``values``.

    Raises
    ------
    ValueError
        As in :func:`gae`, naming the argument; ``last_value`` /
        ``last_done`` must have shape ``[N]`` or ``[1, N]``.
    """
    values, dt = values_dtype(values)
    shape = values.shape
    n = shape[1]
    rewards = float_input(rewards, "rewards", dt, shape)
    dones = flag_input(dones, "dones", shape)
    last_value = as_array(last_value, "last_value")
    if last_value.ndim == 2 and last_value.shape[0] == 1:
        last_value = last_value[0]
    last_value = float_input(last_value, "last_value", dt, (n,))
    last_done = as_array(last_done, "last_done")
    if last_done.ndim == 2 and last_done.shape[0] == 1:
        last_done = last_done[0]
    last_done = flag_input(last_done, "last_done", (n,))
    gamma = coef(gamma, "gamma")
    lam = coef(lam, "lam")
    adv, ret, adv_k, ret_k = outputs(
        out,
        dt,
        shape,
        (
            ("rewards", rewards),
            ("values", values),
            ("dones", dones),
            ("last_value", last_value),
            ("last_done", last_done),
        )
        if out is not None
        else (),
    )
    gae_dones_kernel(rewards, values, dones, last_value, last_done, gamma, lam, adv_k, ret_k)
    return finish(adv, ret, adv_k, ret_k)
