# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Typed GAE kernels (no input validation beyond memory safety).

Use :func:`fastvec.returns.gae_estimates.gae` / :func:`fastvec.returns.gae_estimates.gae_from_dones` /
:func:`fastvec.returns.vtrace_targets.vtrace`; they validate, convert and allocate, then call
the kernels here.

Layout contract (checked here because memory safety depends on it):

* every 2-D argument has the same shape ``[T, N]`` (``last_value`` /
  ``last_done``: ``[N]``);
* along N every array is unit-stride (or ``N <= 1``); the row stride (axis 0)
  is any multiple of the item size (negative and zero included), except that
  output rows must not overlap (``|row stride| >= N`` items);
* ``adv`` and ``ret`` are writable.

Not checked, the caller's duty (the wrapper does it): ``adv`` and ``ret``
overlap neither each other nor any input. Breaking this gives wrong numbers,
never an out-of-bounds access.

Loop order: ``t`` backwards in the outer loop, ``n`` inner over unit-stride
rows, so that the inner loop vectorises. The running advantage
``A[t + 1, :]`` is read back from the previous output row, so no scratch
buffer is needed. The whole loop runs with the GIL released.

Masking is done with selects, not multiplications: when ``terminated[t, n]``
is set, ``next_values[t, n]`` is not read at all, and when either flag is set
``A[t + 1, n]`` is not read, so NaN/inf there cannot leak across an episode
boundary (``0 * nan`` would be NaN).
"""
from cython cimport floating
from libc.math cimport exp, expf
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

ctypedef unsigned char flag_t

# Restrict-qualified pointer types for the parameters of ``_loop``. A row
# reads six arrays and writes two; without ``restrict`` gcc would need more
# run-time alias checks than it allows (--param
# vect-max-version-for-alias-checks=10) and would not vectorise the row loop.
# The Python wrapper guarantees that the outputs overlap neither the inputs
# nor each other, and the kernels check that output rows do not overlap,
# which is what ``restrict`` promises.
cdef extern from *:
    """
    #if defined(_MSC_VER)
    #define FASTVEC_RESTRICT __restrict
    #else
    #define FASTVEC_RESTRICT __restrict__
    #endif
    typedef float *FASTVEC_RESTRICT fastvec_f32_rp;
    typedef double *FASTVEC_RESTRICT fastvec_f64_rp;
    typedef const unsigned char *FASTVEC_RESTRICT fastvec_flag_rp;
    """
    ctypedef float* f32_rp "fastvec_f32_rp"
    ctypedef double* f64_rp "fastvec_f64_rp"
    ctypedef const flag_t* flag_rp "fastvec_flag_rp"

ctypedef fused real_rp:
    f32_rp
    f64_rp


cdef inline void _row(
    const floating* r, const floating* v, const floating* nv,
    const flag_t* term, const flag_t* trunc, const floating* a_next,
    floating* a, floating* ret, Py_ssize_t N, floating g, floating gl,
) noexcept nogil:
    """One row ``t`` of the recursion, ``n`` = 0..N-1 (unit stride).

    ``a_next`` is row t+1 of the advantages, or NULL for t = T-1 (A[T] = 0);
    ``trunc`` may be NULL (no truncation flags). Always inlined into
    :func:`_loop`, whose restrict-qualified parameters the pointers derive
    from, so gcc knows the rows do not alias and vectorises without run-time
    alias checks.

    The selects act on the loaded values (not on products) so that gcc
    if-converts them without -fno-trapping-math; selecting instead of
    multiplying by (1 - flag) also keeps NaN/inf from crossing a boundary.
    """
    cdef Py_ssize_t n
    cdef flag_t te, tt
    cdef floating vn, x, y, an
    if a_next == NULL:
        for n in range(N):
            vn = v[n]
            x = nv[n]
            if term[n] != 0:
                x = 0
            an = r[n] + g * x - vn
            a[n] = an
            ret[n] = an + vn
    elif trunc != NULL:
        for n in range(N):
            vn = v[n]
            x = nv[n]
            y = a_next[n]
            te = term[n]
            tt = te | trunc[n]
            if te != 0:
                x = 0
            if tt != 0:
                y = 0
            an = (r[n] + g * x - vn) + gl * y
            a[n] = an
            ret[n] = an + vn
    else:
        for n in range(N):
            vn = v[n]
            x = nv[n]
            y = a_next[n]
            if term[n] != 0:
                x = 0
                y = 0
            an = (r[n] + g * x - vn) + gl * y
            a[n] = an
            ret[n] = an + vn


cdef void _loop(
    Py_ssize_t T, Py_ssize_t N, bint dones_mode,
    real_rp pr, Py_ssize_t sr, real_rp pv, Py_ssize_t sv,
    real_rp pnv, Py_ssize_t snv, flag_rp pte, Py_ssize_t ste,
    flag_rp ptu, Py_ssize_t stu, real_rp plv, flag_rp pld,
    real_rp pa, Py_ssize_t sa, real_rp pret, Py_ssize_t sret, real_rp coef,
) noexcept nogil:
    """Backward loop over t (outer), rows inner.

    gae mode: row t uses next_values[t], terminated[t], truncated[t].
    dones mode: row t uses values[t+1] and dones[t+1] (``plv`` / ``pld`` at
    t = T-1), no truncation; ``pte``/``ste`` are the dones.
    ``coef = [gamma, gamma * lam]`` in the element type.
    """
    cdef Py_ssize_t t = T - 1
    if dones_mode:
        _row(pr + t * sr, pv + t * sv, plv, pld, NULL,
             NULL, pa + t * sa, pret + t * sret, N, coef[0], coef[1])
        for t in range(T - 2, -1, -1):
            _row(pr + t * sr, pv + t * sv, pv + (t + 1) * sv, pte + (t + 1) * ste, NULL,
                 pa + (t + 1) * sa, pa + t * sa, pret + t * sret, N, coef[0], coef[1])
    else:
        _row(pr + t * sr, pv + t * sv, pnv + t * snv, pte + t * ste, NULL,
             NULL, pa + t * sa, pret + t * sret, N, coef[0], coef[1])
        for t in range(T - 2, -1, -1):
            _row(pr + t * sr, pv + t * sv, pnv + t * snv, pte + t * ste, ptu + t * stu,
                 pa + (t + 1) * sa, pa + t * sa, pret + t * sret, N, coef[0], coef[1])


# ``_loop`` is called through these pointers so that it is never inlined
# into the kernel entry points: gcc only honours ``restrict`` on the
# parameters of a function that is compiled as such, not on those of a
# function inlined into its caller (measured: inlined, the rows fall back
# to scalar code, ~2.5x slower).
ctypedef void (*loop_f32_t)(
    Py_ssize_t, Py_ssize_t, bint, f32_rp, Py_ssize_t, f32_rp, Py_ssize_t,
    f32_rp, Py_ssize_t, flag_rp, Py_ssize_t, flag_rp, Py_ssize_t, f32_rp, flag_rp,
    f32_rp, Py_ssize_t, f32_rp, Py_ssize_t, f32_rp) noexcept nogil
ctypedef void (*loop_f64_t)(
    Py_ssize_t, Py_ssize_t, bint, f64_rp, Py_ssize_t, f64_rp, Py_ssize_t,
    f64_rp, Py_ssize_t, flag_rp, Py_ssize_t, flag_rp, Py_ssize_t, f64_rp, flag_rp,
    f64_rp, Py_ssize_t, f64_rp, Py_ssize_t, f64_rp) noexcept nogil
cdef loop_f32_t _loop_f32 = _loop[f32_rp]
cdef loop_f64_t _loop_f64 = _loop[f64_rp]


cdef inline Py_ssize_t _rstride(Py_ssize_t stride_bytes, Py_ssize_t itemsize, str name) except? -1:
    if stride_bytes % itemsize != 0:
        raise ValueError(f"{name}: row stride {stride_bytes} is not a multiple of the item size")
    return stride_bytes // itemsize


cdef inline int _check2(Py_ssize_t T, Py_ssize_t N, Py_ssize_t t2, Py_ssize_t n2,
                        Py_ssize_t inner, Py_ssize_t itemsize, str name) except -1:
    if t2 != T or n2 != N:
        raise ValueError(f"{name}: shape ({t2}, {n2}) != ({T}, {N})")
    if N > 1 and inner != itemsize:
        raise ValueError(f"{name}: axis 1 must be unit-stride")
    return 0


cdef inline int _check_out_rows(Py_ssize_t T, Py_ssize_t N, Py_ssize_t row_stride, str name) except -1:
    # Output rows must not overlap each other (row t+1 is read while row t is
    # written through a restrict pointer).
    if T > 1 and N > 0 and (row_stride if row_stride >= 0 else -row_stride) < N:
        raise ValueError(f"{name}: rows overlap (row stride {row_stride} < N = {N} items)")
    return 0


def gae_kernel(
    const floating[:, :] rewards,
    const floating[:, :] values,
    const floating[:, :] next_values,
    const flag_t[:, :] terminated,
    const flag_t[:, :] truncated,
    double gamma,
    double lam,
    floating[:, :] adv,
    floating[:, :] ret,
):
    """Fill ``adv`` and ``ret`` in place (see the module docstring for layout).

    ``delta = r + gamma * (term ? 0 : nv) - v``;
    ``A[t] = delta + (term or trunc ? 0 : gamma * lam * A[t + 1])``, ``A[T] = 0``;
    ``ret = A + v``. Flags are uint8, nonzero means set. ``adv`` and ``ret``
    must not overlap each other or any input (not checked here: overlap gives
    wrong numbers, never an out-of-bounds access).
    """
    cdef Py_ssize_t T = values.shape[0], N = values.shape[1]
    cdef Py_ssize_t isz = sizeof(floating)
    _check2(T, N, rewards.shape[0], rewards.shape[1], rewards.strides[1], isz, "rewards")
    _check2(T, N, next_values.shape[0], next_values.shape[1], next_values.strides[1], isz, "next_values")
    _check2(T, N, terminated.shape[0], terminated.shape[1], terminated.strides[1], 1, "terminated")
    _check2(T, N, truncated.shape[0], truncated.shape[1], truncated.strides[1], 1, "truncated")
    _check2(T, N, adv.shape[0], adv.shape[1], adv.strides[1], isz, "adv")
    _check2(T, N, ret.shape[0], ret.shape[1], ret.strides[1], isz, "ret")
    _check2(T, N, T, N, values.strides[1], isz, "values")
    if T == 0 or N == 0:
        return
    cdef Py_ssize_t sr = _rstride(rewards.strides[0], isz, "rewards")
    cdef Py_ssize_t sv = _rstride(values.strides[0], isz, "values")
    cdef Py_ssize_t snv = _rstride(next_values.strides[0], isz, "next_values")
    cdef Py_ssize_t sa = _rstride(adv.strides[0], isz, "adv")
    cdef Py_ssize_t sret = _rstride(ret.strides[0], isz, "ret")
    _check_out_rows(T, N, sa, "adv")
    _check_out_rows(T, N, sret, "ret")
    cdef floating coef[2]
    coef[0] = <floating>gamma
    coef[1] = <floating>(gamma * lam)
    with nogil:
        if floating is float:
            _loop_f32(T, N, False,
                  <f32_rp>&rewards[0, 0], sr, <f32_rp>&values[0, 0], sv,
                  <f32_rp>&next_values[0, 0], snv,
                  &terminated[0, 0], terminated.strides[0], &truncated[0, 0], truncated.strides[0],
                  NULL, NULL, <f32_rp>&adv[0, 0], sa, <f32_rp>&ret[0, 0], sret, <f32_rp>coef)
        else:
            _loop_f64(T, N, False,
                  <f64_rp>&rewards[0, 0], sr, <f64_rp>&values[0, 0], sv,
                  <f64_rp>&next_values[0, 0], snv,
                  &terminated[0, 0], terminated.strides[0], &truncated[0, 0], truncated.strides[0],
                  NULL, NULL, <f64_rp>&adv[0, 0], sa, <f64_rp>&ret[0, 0], sret, <f64_rp>coef)


def gae_dones_kernel(
    const floating[:, :] rewards,
    const floating[:, :] values,
    const flag_t[:, :] dones,
    const floating[:] last_value,
    const flag_t[:] last_done,
    double gamma,
    double lam,
    floating[:, :] adv,
    floating[:, :] ret,
):
    """CleanRL convention on the same row loop.

    Row t uses ``next_values = values[t + 1]`` and ``terminated = dones[t + 1]``
    (``last_value`` / ``last_done`` at ``t = T - 1``), no truncation flags.
    Same output rules as :func:`gae_kernel`.
    """
    cdef Py_ssize_t T = values.shape[0], N = values.shape[1]
    cdef Py_ssize_t isz = sizeof(floating)
    _check2(T, N, rewards.shape[0], rewards.shape[1], rewards.strides[1], isz, "rewards")
    _check2(T, N, dones.shape[0], dones.shape[1], dones.strides[1], 1, "dones")
    _check2(T, N, adv.shape[0], adv.shape[1], adv.strides[1], isz, "adv")
    _check2(T, N, ret.shape[0], ret.shape[1], ret.strides[1], isz, "ret")
    _check2(T, N, T, N, values.strides[1], isz, "values")
    _check2(T, N, T, last_value.shape[0], last_value.strides[0], isz, "last_value")
    _check2(T, N, T, last_done.shape[0], last_done.strides[0], 1, "last_done")
    if T == 0 or N == 0:
        return
    cdef Py_ssize_t sr = _rstride(rewards.strides[0], isz, "rewards")
    cdef Py_ssize_t sv = _rstride(values.strides[0], isz, "values")
    cdef Py_ssize_t sa = _rstride(adv.strides[0], isz, "adv")
    cdef Py_ssize_t sret = _rstride(ret.strides[0], isz, "ret")
    _check_out_rows(T, N, sa, "adv")
    _check_out_rows(T, N, sret, "ret")
    cdef floating coef[2]
    coef[0] = <floating>gamma
    coef[1] = <floating>(gamma * lam)
    with nogil:
        if floating is float:
            _loop_f32(T, N, True,
                  <f32_rp>&rewards[0, 0], sr, <f32_rp>&values[0, 0], sv, NULL, 0,
                  &dones[0, 0], dones.strides[0], NULL, 0,
                  <f32_rp>&last_value[0], &last_done[0],
                  <f32_rp>&adv[0, 0], sa, <f32_rp>&ret[0, 0], sret, <f32_rp>coef)
        else:
            _loop_f64(T, N, True,
                  <f64_rp>&rewards[0, 0], sr, <f64_rp>&values[0, 0], sv, NULL, 0,
                  &dones[0, 0], dones.strides[0], NULL, 0,
                  <f64_rp>&last_value[0], &last_done[0],
                  <f64_rp>&adv[0, 0], sa, <f64_rp>&ret[0, 0], sret, <f64_rp>coef)


# --------------------------------------------------------------------------- #
# V-trace (importance-clipped targets)
# --------------------------------------------------------------------------- #
cdef inline void _vrow(
    const floating* r, const floating* v, const floating* nv,
    const flag_t* term, const flag_t* trunc, const floating* lr,
    floating* w, floating* corr, const floating* ret_next,
    floating* a, floating* ret, Py_ssize_t N, const floating* k, bint gae_adv,
) noexcept nogil:
    """One row ``t`` of the V-trace recursion, ``n`` = 0..N-1 (unit stride).

    ``corr`` holds ``v[t + 1] - V[t + 1]`` on entry and ``v[t] - V[t]`` on
    exit (one scratch row, so the correction is carried exactly rather than
    recovered as ``ret - values``, which would round). ``ret_next`` is row
    t+1 of the targets, or NULL for t = T-1 (nothing to carry, the policy
    gradient bootstraps from ``next_values``). ``w`` is scratch for the
    ratios. ``k = [gamma, gamma * lam, rho_bar, c_bar, pg_rho_bar]``.

    With ``rho = c = 1`` every operation matches :func:`_row`'s (``1 * x``
    and ``gl * 1`` are exact), so on-policy targets are GAE's returns to the
    bit on a machine that does not fuse multiply-adds.
    """
    cdef Py_ssize_t n
    cdef flag_t te, tt
    cdef floating g = k[0], gl = k[1], rb = k[2], cb = k[3], pb = k[4]
    cdef floating vn, wn, x, y, q, z, rho, cc, p, c
    # exp apart, in its own pass: libm's exp has no vector form without
    # -ffast-math (which would break the NaN rules), and keeping the call out
    # of the main loops lets them vectorise. Those loops load every operand
    # unconditionally and select afterwards (gcc if-converts selects, not
    # conditional loads) and do not branch on the mode (a loop-invariant
    # branch there is not if-converted either): they always write IMPALA's
    # advantages, overwritten by the correction in the "gae" mode.
    for n in range(N):
        if floating is float:
            w[n] = expf(lr[n])
        else:
            w[n] = exp(lr[n])
    if ret_next == NULL:  # t = T-1: nothing carried, q = x
        for n in range(N):
            vn = v[n]
            wn = w[n]
            x = nv[n]
            if term[n] != 0:
                x = 0
            rho = wn
            if rho > rb:  # a NaN ratio stays NaN (the comparison is false)
                rho = rb
            p = wn
            if p > pb:
                p = pb
            c = rho * (r[n] + g * x - vn)
            corr[n] = c
            ret[n] = c + vn
            a[n] = p * (r[n] + g * x - vn)
    else:
        for n in range(N):
            vn = v[n]
            wn = w[n]
            x = nv[n]
            y = corr[n]
            q = ret_next[n]
            te = term[n]
            tt = te | trunc[n]
            if te != 0:
                x = 0
            rho = wn
            if rho > rb:
                rho = rb
            cc = wn
            if cc > cb:
                cc = cb
            p = wn
            if p > pb:
                p = pb
            # At an episode end both factors of the carried term are zeroed by
            # selects, not multiplied by (1 - done), so an inf ratio or a NaN in
            # the next episode cannot leak across the boundary. (Selecting the
            # product instead would stop the loop vectorising: gcc would move
            # the multiplication under the branch.)
            if tt != 0:
                y = 0
                cc = 0
                q = x
            z = (gl * cc) * y
            c = rho * (r[n] + g * x - vn) + z
            corr[n] = c
            ret[n] = c + vn
            a[n] = p * (r[n] + g * q - vn)
    if gae_adv:  # the advantages are the correction itself
        memcpy(a, corr, N * sizeof(floating))


cdef void _vloop(
    Py_ssize_t T, Py_ssize_t N, bint gae_adv,
    real_rp pr, Py_ssize_t sr, real_rp pv, Py_ssize_t sv,
    real_rp pnv, Py_ssize_t snv, flag_rp pte, Py_ssize_t ste,
    flag_rp ptu, Py_ssize_t stu, real_rp plr, Py_ssize_t slr, real_rp pw, real_rp pc,
    real_rp pa, Py_ssize_t sa, real_rp pret, Py_ssize_t sret, real_rp coef,
) noexcept nogil:
    """Backward loop over t (outer), rows inner; ``pw`` / ``pc``: scratch rows."""
    cdef Py_ssize_t t = T - 1
    _vrow(pr + t * sr, pv + t * sv, pnv + t * snv, pte + t * ste, ptu + t * stu, plr + t * slr,
          pw, pc, NULL, pa + t * sa, pret + t * sret, N, coef, gae_adv)
    for t in range(T - 2, -1, -1):
        _vrow(pr + t * sr, pv + t * sv, pnv + t * snv, pte + t * ste, ptu + t * stu, plr + t * slr,
              pw, pc, pret + (t + 1) * sret, pa + t * sa, pret + t * sret, N, coef, gae_adv)


# Called through pointers for the same reason as ``_loop`` (restrict kept).
ctypedef void (*vloop_f32_t)(
    Py_ssize_t, Py_ssize_t, bint, f32_rp, Py_ssize_t, f32_rp, Py_ssize_t,
    f32_rp, Py_ssize_t, flag_rp, Py_ssize_t, flag_rp, Py_ssize_t, f32_rp, Py_ssize_t, f32_rp, f32_rp,
    f32_rp, Py_ssize_t, f32_rp, Py_ssize_t, f32_rp) noexcept nogil
ctypedef void (*vloop_f64_t)(
    Py_ssize_t, Py_ssize_t, bint, f64_rp, Py_ssize_t, f64_rp, Py_ssize_t,
    f64_rp, Py_ssize_t, flag_rp, Py_ssize_t, flag_rp, Py_ssize_t, f64_rp, Py_ssize_t, f64_rp, f64_rp,
    f64_rp, Py_ssize_t, f64_rp, Py_ssize_t, f64_rp) noexcept nogil
cdef vloop_f32_t _vloop_f32 = _vloop[f32_rp]
cdef vloop_f64_t _vloop_f64 = _vloop[f64_rp]


def vtrace_kernel(
    const floating[:, :] rewards,
    const floating[:, :] values,
    const floating[:, :] next_values,
    const flag_t[:, :] terminated,
    const flag_t[:, :] truncated,
    const floating[:, :] log_rhos,
    double gamma,
    double lam,
    double rho_bar,
    double c_bar,
    double pg_rho_bar,
    bint gae_advantages,
    floating[:, :] adv,
    floating[:, :] ret,
):
    """Fill ``adv`` (advantages) and ``ret`` (value targets) in place.

    With ``w = exp(log_rhos)``, ``rho = min(rho_bar, w)``, ``c = min(c_bar, w)``,
    ``x = term ? 0 : nv``, ``done = term or trunc``:
    ``corr[t] = rho * (r + gamma * x - v) + (done or t = T-1 ? 0 : gamma * lam * c * corr[t + 1])``,
    ``ret = corr + v``; ``adv = corr`` when ``gae_advantages``, else
    ``min(pg_rho_bar, w) * (r + gamma * q - v)`` with ``q = ret[t + 1]``, or
    ``x`` at an episode end or t = T-1. Same layout and overlap rules as
    :func:`gae_kernel`.
    """
    cdef Py_ssize_t T = values.shape[0], N = values.shape[1]
    cdef Py_ssize_t isz = sizeof(floating)
    _check2(T, N, rewards.shape[0], rewards.shape[1], rewards.strides[1], isz, "rewards")
    _check2(T, N, next_values.shape[0], next_values.shape[1], next_values.strides[1], isz, "next_values")
    _check2(T, N, terminated.shape[0], terminated.shape[1], terminated.strides[1], 1, "terminated")
    _check2(T, N, truncated.shape[0], truncated.shape[1], truncated.strides[1], 1, "truncated")
    _check2(T, N, log_rhos.shape[0], log_rhos.shape[1], log_rhos.strides[1], isz, "log_rhos")
    _check2(T, N, adv.shape[0], adv.shape[1], adv.strides[1], isz, "adv")
    _check2(T, N, ret.shape[0], ret.shape[1], ret.strides[1], isz, "ret")
    _check2(T, N, T, N, values.strides[1], isz, "values")
    if T == 0 or N == 0:
        return
    cdef Py_ssize_t sr = _rstride(rewards.strides[0], isz, "rewards")
    cdef Py_ssize_t sv = _rstride(values.strides[0], isz, "values")
    cdef Py_ssize_t snv = _rstride(next_values.strides[0], isz, "next_values")
    cdef Py_ssize_t slr = _rstride(log_rhos.strides[0], isz, "log_rhos")
    cdef Py_ssize_t sa = _rstride(adv.strides[0], isz, "adv")
    cdef Py_ssize_t sret = _rstride(ret.strides[0], isz, "ret")
    _check_out_rows(T, N, sa, "adv")
    _check_out_rows(T, N, sret, "ret")
    cdef floating coef[5]
    coef[0] = <floating>gamma
    coef[1] = <floating>(gamma * lam)
    coef[2] = <floating>rho_bar
    coef[3] = <floating>c_bar
    coef[4] = <floating>pg_rho_bar
    cdef floating* scratch = <floating*>malloc(2 * N * isz)  # ratios, carried correction
    if scratch == NULL:
        raise MemoryError()
    try:
        with nogil:
            if floating is float:
                _vloop_f32(T, N, gae_advantages,
                      <f32_rp>&rewards[0, 0], sr, <f32_rp>&values[0, 0], sv,
                      <f32_rp>&next_values[0, 0], snv,
                      &terminated[0, 0], terminated.strides[0], &truncated[0, 0], truncated.strides[0],
                      <f32_rp>&log_rhos[0, 0], slr, <f32_rp>scratch, <f32_rp>(scratch + N),
                      <f32_rp>&adv[0, 0], sa, <f32_rp>&ret[0, 0], sret, <f32_rp>coef)
            else:
                _vloop_f64(T, N, gae_advantages,
                      <f64_rp>&rewards[0, 0], sr, <f64_rp>&values[0, 0], sv,
                      <f64_rp>&next_values[0, 0], snv,
                      &terminated[0, 0], terminated.strides[0], &truncated[0, 0], truncated.strides[0],
                      <f64_rp>&log_rhos[0, 0], slr, <f64_rp>scratch, <f64_rp>(scratch + N),
                      <f64_rp>&adv[0, 0], sa, <f64_rp>&ret[0, 0], sret, <f64_rp>coef)
    finally:
        free(scratch)
