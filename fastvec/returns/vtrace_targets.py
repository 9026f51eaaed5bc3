"""V-trace: importance-clipped advantages and value targets on ``[T, N]`` rollouts.

The off-policy counterpart of :func:`fastvec.gae`, for data that a slightly
older policy (the behaviour policy) collected while the learner moved on, as
in an asynchronous pipeline. The recursion runs in the compiled kernel beside
GAE's (:func:`fastvec._gae.vtrace_kernel`, GIL released); this module
validates and converts the inputs with :mod:`fastvec.gae`'s helpers, so the
conventions (dtypes, flags, layouts, ``out=``) are GAE's.
"""

from __future__ import annotations

from .._gae import vtrace_kernel
from .kernel_arrays import clip, coef, finish, flag_input, float_input, outputs, values_dtype

__all__ = ["vtrace"]

_ADVANTAGES = ("vtrace", "gae")


def _scalars(gamma, lam, rho_bar, c_bar, pg_rho_bar, advantages):
    """``vtrace``'s numbers and its ``advantages`` choice, checked (ValueError naming
    the argument): ``(gamma, lam, rho_bar, c_bar, pg_rho_bar)``, ``pg_rho_bar``
    defaulting to ``rho_bar`` and refused with ``advantages="gae"``, which has no use
    for it."""
    gamma = coef(gamma, "gamma")
    lam = coef(lam, "lam")
    rho_bar = clip(rho_bar, "rho_bar")
    c_bar = clip(c_bar, "c_bar")
    if not isinstance(advantages, str) or advantages not in _ADVANTAGES:
        raise ValueError(f"advantages must be 'vtrace' or 'gae', got {advantages!r}")
    if pg_rho_bar is None:
        pg_rho_bar = rho_bar
    elif advantages == "gae":
        raise ValueError("pg_rho_bar only applies to advantages='vtrace' (the 'gae' advantages use rho_bar)")
    else:
        pg_rho_bar = clip(pg_rho_bar, "pg_rho_bar")
    return gamma, lam, rho_bar, c_bar, pg_rho_bar


def vtrace(
    rewards,
    values,
    next_values,
    terminated,
    truncated,
    log_rhos,
    gamma,
    lam=1.0,
    rho_bar=1.0,
    c_bar=1.0,
    *,
    pg_rho_bar=None,
    advantages="vtrace",
    out=None,
):
    r"""V-trace (Espeholt et al. 2018, IMPALA) with terminated / truncated flags.

    ``log_rhos[t] = log pi(a_t | s_t) - log mu(a_t | s_t)``: the log ratio of
    the policy being learned (pi) to the policy that acted (mu). For
    ``t = T-1, ..., 0`` and every environment ``n``::

        w[t]     = exp(log_rhos[t])
        rho[t]   = min(rho_bar, w[t])
        c[t]     = lam * min(c_bar, w[t])
        x[t]     = 0 if terminated[t] else next_values[t]
        delta[t] = rho[t] * (rewards[t] + gamma * x[t] - values[t])
        corr[t]  = delta[t] + gamma * c[t] * corr[t+1]    # corr[t] = v[t] - values[t]
        value_targets[t] = v[t] = values[t] + corr[t]

    where the carried term ``gamma * c[t] * corr[t+1]`` is dropped (not
    multiplied by 0) at ``t = T-1`` and wherever ``terminated[t]`` or
    ``truncated[t]`` is set: a truncation bootstraps from ``next_values[t]``
    in ``delta`` but carries no trace; a termination does neither
    (``terminated`` wins when both are set).

    ``advantages="vtrace"`` (default) returns IMPALA's policy-gradient
    advantage, ``q[t] - values[t]`` clipped by ``pg_rho_bar``::

        advantages[t] = min(pg_rho_bar, w[t]) * (rewards[t] + gamma * q[t] - values[t])
        q[t] = v[t+1]   (= value_targets[t+1]) where t < T-1 and no episode ended at t
             = x[t]     otherwise: next_values[t] at a truncation or at t = T-1,
                        0 at a termination

    ``advantages="gae"`` returns ``corr = value_targets - values`` instead:
    the importance-clipped GAE, which is GAE's advantage itself on-policy.

    What reduces to what:

    * **On-policy** (``log_rhos == 0``, ``rho_bar >= 1``, ``c_bar >= 1``):
      ``rho = 1`` and ``c = lam``, so ``value_targets`` are
      :func:`fastvec.gae`'s returns (lambda-returns) and ``advantages="gae"``
      gives its advantages, for every ``lam``. The default advantages are then
      ``delta[t] + gamma * A_gae[t+1]`` (given ``next_values[t] ==
      values[t+1]`` inside an episode, as in a rollout): equal to GAE's
      advantages at ``lam = 1`` only; for ``lam < 1`` GAE weights the next
      step's advantage by ``gamma * lam``, V-trace's policy gradient by
      ``gamma``.
    * **lam = 1**: the paper's n-step definition,
      ``v[s] = values[s] + sum_t gamma^(t-s) (prod_{i=s}^{t-1} c[i]) delta[t]``,
      the sum running to the end of the episode segment in the rollout.
    * **Infinite clips** (``rho_bar = c_bar = inf``): the unclipped
      per-decision importance-weighted return, with ``values`` as a control
      variate (with ``values = next_values = 0`` and ``lam = 1``:
      ``v[s] = sum_t gamma^(t-s) (prod_{i=s}^{t} w[i]) rewards[t]``).

    Masking and NaN follow :func:`fastvec.gae`: where ``terminated[t]`` is
    set, ``next_values[t]`` is never read; where either flag is set, nothing
    from ``t + 1`` is used. A NaN ``log_rhos[t]`` makes the results NaN at
    ``t`` and at the earlier steps of its episode segment. With an infinite
    clip, a ratio that overflows (``log_rhos`` above about 88 in float32,
    709 in float64) gives inf / NaN.

    Parameters
    ----------
    rewards, values, next_values, terminated, truncated : array_like, shape [T, N]
        As in :func:`fastvec.gae` (``[T, N]``; ``values`` float32 or float64
        sets the computation and output dtype; flags: any value ``!= 0`` is
        set). ``values`` are the learner's estimates V(s_t).
    log_rhos : array_like, shape [T, N]
        Log importance ratios, converted to the dtype of ``values``.
    gamma : float
        Discount factor, finite, in ``[0, 1]``.
    lam : float, default 1.0
        Trace-cutting lambda, finite, in ``[0, 1]`` (1: the paper's V-trace).
    rho_bar : float, default 1.0
        Clip of ``rho`` in the TD errors; positive, ``inf`` allowed.
    c_bar : float, default 1.0
        Clip of the trace ``c``; positive, ``inf`` allowed.
    pg_rho_bar : float, optional
        Clip of the ratio weighting the policy-gradient advantage (default:
        ``rho_bar``). Only with ``advantages="vtrace"``.
    advantages : {"vtrace", "gae"}, default "vtrace"
        Which advantages to return (see above).
    out : tuple of two ndarray, optional
        ``(adv_out, targets_out)``, rules as in :func:`fastvec.gae`.

    Returns
    -------
    advantages, value_targets : ndarray, shape [T, N]
        In the dtype of ``values``.

    Raises
    ------
    ValueError
        Naming the offending argument, as :func:`fastvec.gae` does, and for
        ``log_rhos``; ``rho_bar`` / ``c_bar`` / ``pg_rho_bar`` zero, negative
        or NaN; ``advantages`` not one of the two; ``pg_rho_bar`` with
        ``advantages="gae"``.

    Examples
    --------
    >>> import numpy as np
    >>> from fastvec.returns.vtrace_targets import vtrace
    >>> r = np.ones((3, 1)); v = np.zeros((3, 1)); z = np.zeros((3, 1), bool)
    >>> adv, target = vtrace(r, v, v, z, z, np.log(np.full((3, 1), 2.0)), gamma=0.5)
    >>> target[:, 0].tolist()  # rho = c = 1 (ratio 2 clipped): discounted returns
    [1.75, 1.5, 1.0]
    """
    values, dt = values_dtype(values)
    shape = values.shape
    rewards = float_input(rewards, "rewards", dt, shape)
    next_values = float_input(next_values, "next_values", dt, shape)
    terminated = flag_input(terminated, "terminated", shape)
    truncated = flag_input(truncated, "truncated", shape)
    log_rhos = float_input(log_rhos, "log_rhos", dt, shape)
    gamma, lam, rho_bar, c_bar, pg_rho_bar = _scalars(gamma, lam, rho_bar, c_bar, pg_rho_bar, advantages)
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
            ("log_rhos", log_rhos),
        )
        if out is not None
        else (),
        second=("value targets", "targets_out"),
    )
    vtrace_kernel(
        rewards,
        values,
        next_values,
        terminated,
        truncated,
        log_rhos,
        gamma,
        lam,
        rho_bar,
        c_bar,
        pg_rho_bar,
        advantages == "gae",
        adv_k,
        ret_k,
    )
    return finish(adv, ret, adv_k, ret_k)
