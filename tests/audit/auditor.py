"""Empirical privacy auditor: a statistically valid lower bound on epsilon at a claimed delta.

A mechanism M is (epsilon, delta)-DP only if, for every pair of neighbouring inputs
(D, D') and every output event S,

    P[M(D) in S] <= e^epsilon P[M(D') in S] + delta      (and with D, D' swapped).

So for any fixed S, epsilon >= ln((P[M(D) in S] - delta) / P[M(D') in S]). The auditor
runs the mechanism's vectorised kernel many times on D and on D' (at inflated
parameters where the relevant probabilities are around delta ~ 1e-3 and so measurable),
and turns counts into a bound that holds with probability >= ``confidence``:

1. Split the trials of each side in two halves. On the *selection* half choose the event
   S: either the prefix of outcomes sorted by their empirical likelihood ratio
   ("likelihood"), or a threshold event {x >= t} / {x <= t} on an ordered statistic
   ("threshold"), maximising the bound computed on that half.
2. On the *held-out* half count S under D and D' and take one-sided Clopper-Pearson
   bounds: p_lo <= P[M(D) in S], q_hi >= P[M(D') in S] (Clopper & Pearson 1934).
   Then epsilon_lb = ln((p_lo - delta) / q_hi).

Both directions (D, D') and (D', D) are audited; the four Clopper-Pearson bounds share
the error budget 1 - confidence (union bound), so the maximum over directions is a valid
lower bound with probability >= confidence. Choosing S on data independent of the
held-out half keeps the bound valid however S was found (the approach of Jagielski,
Ullman & Oprea 2020 and Nasr et al. 2021 for auditing DP training; Ding et al. 2018,
"Detecting violations of differential privacy", for the hypothesis-testing view).

A mechanism passes when epsilon_lb <= claimed epsilon; a deliberately broken mechanism
must give epsilon_lb > claimed epsilon (tests/audit/test_mutations.py).

A mechanism is handed to :func:`audit` as two samplers ``run_d(rng, n)`` and
``run_d_prime(rng, n)`` returning n integer outcome codes (one per independent trial):
whatever the release publishes, encoded as integers (``encode_release`` and
``combine_codes`` help).
"""
import dataclasses
import math

import numpy as np
from scipy import stats

ABSENT = np.iinfo(np.int64).min     # code of "key not released"
_COUNT_BITS = 40                    # released_count_and_sum: count * 2^40 + sum
_COUNT_UNIT = 1 << _COUNT_BITS
EVENT_FAMILIES = ("likelihood", "threshold", "both")


def clopper_pearson_lower(k, n, alpha):
    """One-sided (1 - alpha) lower confidence bound on a binomial proportion."""
    k = np.asarray(k, dtype=np.float64)
    out = np.zeros_like(k)
    pos = k > 0
    out[pos] = stats.beta.ppf(alpha, k[pos], n - k[pos] + 1)
    return out


def clopper_pearson_upper(k, n, alpha):
    """One-sided (1 - alpha) upper confidence bound on a binomial proportion."""
    k = np.asarray(k, dtype=np.float64)
    out = np.ones_like(k)
    below = k < n
    out[below] = stats.beta.ppf(1 - alpha, k[below] + 1, n - k[below])
    return out


def epsilon_bound(k_p, n_p, k_q, n_q, delta, alpha):
    """ln((p_lo - delta) / q_hi) from event counts k_p of n_p (under D) and k_q of n_q
    (under D'); -inf where p_lo <= delta. Vectorised over k_p, k_q."""
    p_lo = clopper_pearson_lower(k_p, n_p, alpha)
    q_hi = clopper_pearson_upper(k_q, n_q, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(p_lo > delta, np.log(np.maximum(p_lo - delta, 1e-300) / q_hi), -np.inf)
    return out


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """The outcome of one audit: the best held-out bound and the event that gave it."""

    epsilon_lower_bound: float
    claimed_epsilon: float
    claimed_delta: float
    direction: str            # "D vs D'" or "D' vs D"
    event: str                # description of S
    p_lower: float            # Clopper-Pearson lower bound of P[M(first) in S]
    q_upper: float            # Clopper-Pearson upper bound of P[M(second) in S]
    p_hat: float
    q_hat: float
    trials: int               # per side
    confidence: float

    @property
    def violated(self):
        """True when the data prove the mechanism is not (claimed_epsilon, claimed_delta)-DP
        (with probability >= confidence)."""
        return self.epsilon_lower_bound > self.claimed_epsilon

    def summary(self):
        eps = "-inf" if self.epsilon_lower_bound == -math.inf else f"{self.epsilon_lower_bound:.3f}"
        return (f"eps_lb={eps} (claimed eps={self.claimed_epsilon:g}, delta={self.claimed_delta:g}); "
                f"{self.direction}, S={self.event}: P={self.p_hat:.3g} (>= {self.p_lower:.3g}), "
                f"Q={self.q_hat:.3g} (<= {self.q_upper:.3g}), {self.trials} trials/side")


def _likelihood_events(codes_p, codes_q, n_p, n_q, delta, alpha):
    """Best prefix of outcomes sorted by empirical ratio: returns (bound, codes in S)."""
    values, inverse = np.unique(np.concatenate([codes_p, codes_q]), return_inverse=True)
    count_p = np.bincount(inverse[:codes_p.size], minlength=values.size)
    count_q = np.bincount(inverse[codes_p.size:], minlength=values.size)
    ratio = (count_p + 0.5) / n_p / ((count_q + 0.5) / n_q)
    order = np.lexsort((-count_p, -ratio))
    cum_p = np.cumsum(count_p[order])
    cum_q = np.cumsum(count_q[order])
    bounds = epsilon_bound(cum_p, n_p, cum_q, n_q, delta, alpha)
    j = int(np.argmax(bounds))
    return float(bounds[j]), values[order[:j + 1]]


def _threshold_events(codes_p, codes_q, n_p, n_q, delta, alpha):
    """Best {x >= t} or {x <= t}: returns (bound, (">=" or "<=", t))."""
    values = np.unique(np.concatenate([codes_p, codes_q]))
    sp, sq = np.sort(codes_p), np.sort(codes_q)
    best = (-math.inf, (">=", int(values[0])))   # everything: a valid (useless) event
    # {x >= t}: counts of codes >= t for every candidate t
    ge_p = n_p - np.searchsorted(sp, values, side="left")
    ge_q = n_q - np.searchsorted(sq, values, side="left")
    le_p = np.searchsorted(sp, values, side="right")
    le_q = np.searchsorted(sq, values, side="right")
    for op, kp, kq in ((">=", ge_p, ge_q), ("<=", le_p, le_q)):
        b = epsilon_bound(kp, n_p, kq, n_q, delta, alpha)
        j = int(np.argmax(b))
        if b[j] > best[0]:
            best = (float(b[j]), (op, int(values[j])))
    return best


def _in_event(codes, event, family):
    if family == "likelihood":
        return np.isin(codes, event)
    op, t = event
    return codes >= t if op == ">=" else codes <= t


def describe_code(code):
    """Readable form of a code: "absent", a value, or "k released, sum s" for codes made
    by :func:`released_count_and_sum`."""
    code = int(code)
    if code == ABSENT:
        return "absent"
    if abs(code) < _COUNT_UNIT // 2:
        return str(code)
    count = (code + _COUNT_UNIT // 2) >> _COUNT_BITS
    return f"({count} released, sum {code - count * _COUNT_UNIT})"


def _describe(event, family, decode):
    if family == "likelihood":
        shown = ", ".join(decode(v) for v in event[:4])
        more = f", ... ({len(event)} outcomes)" if len(event) > 4 else ""
        return "{" + shown + more + "}"
    op, t = event
    return f"x {op} {decode(t)}"


def audit(run_d, run_d_prime, *, claimed_epsilon, claimed_delta, trials=10**6, seed=0,
          events="both", confidence=0.999, chunk=10**6, decode=describe_code):
    """Audit one neighbouring pair; returns the larger :class:`AuditResult` of the two
    directions.

    Args:
      run_d, run_d_prime: f(rng, n) -> int64 array of n outcome codes, one independent
        run of the mechanism per trial on D (resp. D'). ``rng`` is a numpy Generator.
      claimed_epsilon, claimed_delta: the guarantee to test.
      trials: runs per side (half select the event, half estimate it).
      seed: seeds the numpy Generator (tests are reproducible).
      events: "likelihood", "threshold" (codes are an ordered statistic) or "both".
      confidence: probability that the reported bound is valid (the false-alarm rate of
        ``violated`` for a correct mechanism is at most 1 - confidence).
      decode: code -> text, for the description of the chosen event.
    """
    if events not in EVENT_FAMILIES:
        raise ValueError(f"events must be one of {EVENT_FAMILIES}, got {events!r}")
    rng = np.random.default_rng(seed)
    sides = []
    for run in (run_d, run_d_prime):
        parts = [np.asarray(run(rng, min(chunk, trials - i)), dtype=np.int64)
                 for i in range(0, trials, chunk)]
        codes = np.concatenate(parts)
        if codes.size != trials:
            raise ValueError(f"mechanism returned {codes.size} codes for {trials} trials")
        sides.append(codes)
    half = trials // 2
    n_eval = trials - half
    alpha = (1.0 - confidence) / 4.0
    families = ("likelihood", "threshold") if events == "both" else (events,)
    best = None
    for name, first, second in (("D vs D'", sides[0], sides[1]), ("D' vs D", sides[1], sides[0])):
        sel_p, sel_q = first[:half], second[:half]
        ev_p, ev_q = first[half:], second[half:]
        chosen = None
        for family in families:
            pick = (_likelihood_events if family == "likelihood" else _threshold_events)(
                sel_p, sel_q, half, half, claimed_delta, alpha)
            if chosen is None or pick[0] > chosen[0]:
                chosen = (pick[0], pick[1], family)
        _, event, family = chosen
        k_p = int(np.count_nonzero(_in_event(ev_p, event, family)))
        k_q = int(np.count_nonzero(_in_event(ev_q, event, family)))
        bound = float(epsilon_bound(k_p, n_eval, k_q, n_eval, claimed_delta, alpha))
        result = AuditResult(
            epsilon_lower_bound=bound, claimed_epsilon=float(claimed_epsilon),
            claimed_delta=float(claimed_delta), direction=name,
            event=_describe(event, family, decode),
            p_lower=float(clopper_pearson_lower(k_p, n_eval, alpha)),
            q_upper=float(clopper_pearson_upper(k_q, n_eval, alpha)),
            p_hat=k_p / n_eval, q_hat=k_q / n_eval, trials=trials, confidence=confidence)
        if best is None or result.epsilon_lower_bound > best.epsilon_lower_bound:
            best = result
    return best


# ---------------------------------------------------------------------------------------
# Encoding releases as integer outcome codes.

def encode_release(keep, values):
    """Per-key outcome code: the released value, or ABSENT."""
    return np.where(np.asarray(keep, dtype=bool), np.asarray(values, dtype=np.int64), ABSENT)


def combine_codes(*columns):
    """One code per trial from several per-trial columns (e.g. the C keys a user touches):
    distinct rows get distinct codes. Not ordered; use with events="likelihood"."""
    stacked = np.stack([np.asarray(c, dtype=np.int64) for c in columns], axis=1)
    _, inverse = np.unique(stacked, axis=0, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64)


def released_count_and_sum(keep, values):
    """Trials x keys arrays -> one ordered code per trial: the sum of released values,
    with trials releasing fewer keys coded below every trial releasing more (for
    threshold events on shifted counts when most keys are released)."""
    keep = np.asarray(keep, dtype=bool)
    n_released = keep.sum(axis=1)
    total = np.where(keep, values, 0).sum(axis=1)
    return n_released.astype(np.int64) * _COUNT_UNIT + total
