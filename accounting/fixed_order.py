"""Dot products, matrix-vector products and convolutions in one fixed order of operations.

Why this module exists: numpy hands float64 ``np.dot``, ``@`` / ``np.matmul``, ``np.inner``
and ``np.convolve`` / ``np.correlate`` (which numpy computes with the BLAS ``ddot``) to the
BLAS it was built with -- OpenBLAS bundled in numpy's wheel -- and OpenBLAS picks its kernel
per CPU when it loads (``OPENBLAS_CORETYPE`` overrides the pick). Each kernel blocks and
orders the additions its own way, so the last bits of a result differ from one machine to
the next. A calibration that bisects on such a delta then lands on another sampling rate,
and a published ``delta_achieved`` shows other digits (issue 42: the heavy-hitters example
published other bytes under the Haswell and Prescott kernels than under SkylakeX).

The functions here use only elementwise IEEE operations (each correctly rounded, the same
on every CPU: numpy never fuses a separate multiply and add into one FMA) and numpy's own
``add.reduce``, whose pairwise summation is a fixed sequence of additions written in C
(eight running sums over blocks of 128, combined in a fixed tree): its order depends on the
array's length and layout only, never on the CPU or its SIMD width. The results are those
of a fixed formula, so every privacy calibration and published number built on them is a
function of its inputs alone.

Error bounds: a pairwise sum of n terms has relative error at most about
(ceil(log2(n / 8)) + 8) u on non-negative terms, and a sequential one at most (n - 1) u
(Higham 2002, Sec. 4.2): both are below the ``n u`` allowances the callers already carry.
"""
import numpy as np


def dot(a, b):
    """sum_i a_i b_i of two 1-D float arrays, as a Python float (products rounded each,
    summed pairwise by numpy's add.reduce)."""
    return float(np.add.reduce(np.multiply(np.asarray(a, dtype=np.float64),
                                           np.asarray(b, dtype=np.float64))))


def matvec(m, v):
    """m @ v for a 2-D ``m`` and a 1-D ``v``: each row's products summed pairwise, in the
    row's order (a float64 array of len(m))."""
    m = np.ascontiguousarray(m, dtype=np.float64)
    return np.add.reduce(m * np.asarray(v, dtype=np.float64)[None, :], axis=1)


def vecmat(v, m):
    """v @ m for a 1-D ``v`` and a 2-D ``m``: :func:`matvec` of the transpose."""
    return matvec(np.asarray(m, dtype=np.float64).T, v)


def convolve(a, b):
    """The full discrete convolution of two 1-D float arrays (what ``np.convolve(a, b)``
    computes), len(a) + len(b) - 1 long: out[k] = sum_j a[k - j] b[j], the terms of each
    output added one after another in increasing j over the non-zero entries of ``b`` (a
    zero entry adds nothing: skipping it leaves every sum unchanged for finite inputs).

    One vector operation per non-zero entry of the shorter side. When ``a`` has fewer
    non-zero entries than ``b``, the loop runs over i = k - j of ``a`` in decreasing order,
    adding a[i] b (b's whole length) to out[i:]: each output still receives its terms in
    increasing j, each term the same correctly rounded product, so the bits are those of
    the loop over ``b`` (an added zero product leaves a sum that started at +0.0 as it was;
    with an infinite or NaN entry the loop over ``b`` is kept, as 0 times inf is NaN)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if len(a) == 0 or len(b) == 0:
        raise ValueError("convolve: empty input")
    out = np.zeros(len(a) + len(b) - 1)
    b_terms = np.flatnonzero(b)
    a_terms = np.flatnonzero(a)
    if len(a_terms) < len(b_terms) and np.isfinite(a).all() and np.isfinite(b).all():
        _add_shifted(out, b, a, a_terms[::-1])      # i decreasing: j = k - i increasing
    else:
        _add_shifted(out, a, b, b_terms)
    return out


def _add_shifted(out, long, short, positions):
    """out[p:p + len(long)] += long * short[p] for each p of ``positions`` in turn."""
    n = len(long)
    scratch = np.empty(n)
    for p in positions:
        np.multiply(long, short[p], out=scratch)
        window = out[p:p + n]
        np.add(window, scratch, out=window)


# -- elementwise exponentials and logarithms, the same bits on every x86-64 CPU -------------
#
# numpy's float64 exp, log, expm1 and log1p take their own AVX-512 code on CPUs that have
# it (numpy's dispatch; NPY_DISABLE_CPU_FEATURES turns it off) and the C library's
# elsewhere, and the two disagree in the last bit of a few per cent of the values (measured
# on 2e6 points: exp 92,720 differ, expm1 31,561, log1p 98,867). The PLD bound turns such
# bits into other hull vertices and so other deltas (issue 42). These evaluate in extended
# precision (numpy's long double: the C library's expl, expm1l, logl, log1pl, which have no
# CPU-dependent variants) and round once to float64: within about half a unit in the last
# place, like the C library's double functions, and the same on every x86-64 machine.
# About 150-250 ns a value: for the accounting's small arrays, never for data.

def _extended(name):
    ufunc = getattr(np, name)

    def evaluate(x, out=None):
        x = np.asarray(x, dtype=np.float64)
        value = ufunc(x.astype(np.longdouble)).astype(np.float64)
        if out is not None:
            out[...] = value
            return out
        return value[()] if value.ndim == 0 else value
    evaluate.__name__ = name
    evaluate.__doc__ = f"np.{name} of float64 values through long double (see above)."
    return evaluate


exp = _extended("exp")
expm1 = _extended("expm1")
log = _extended("log")
log1p = _extended("log1p")
