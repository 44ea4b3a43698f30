"""Privacy accounting and calibration: pure numpy/scipy, no Beam, no I/O.

Every function here maps mechanism parameters to an (epsilon, delta) guarantee, or a
target guarantee to the smallest parameter that meets it. See docs/accounting.md.
"""
