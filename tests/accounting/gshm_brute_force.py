"""An independent oracle for GSHM's delta with discrete Gaussian noise (paper 004 Thm 5.4),
in mpmath at 40 digits, by brute force: no Lemma A, no tail bounds, no code shared with
``accounting.gshm`` / ``accounting.plain_gshm``.

delta_+(n, e) is the hockey-stick divergence between n i.i.d. N_Z(0, sigma^2) coordinates
and the same shifted by one each. The privacy loss depends only on S = v_1 + ... + v_n,
L(S) = (2 S + n) / (2 sigma^2) (up to the sign of S, which the symmetric law of S does not
see), so delta_+(n, e) = sum_s P[S = s] max(0, 1 - exp(e - L(s))), with the law of S by
explicit convolution of the one-coordinate pmf. Each coordinate is cut to |v| <= K,
K = ceil(16 sigma) + 4: the dropped mass is below exp(-128) per coordinate, so every
value here is within ~1e-50 of the untruncated one, far below the double precision it is
compared with.

    delta = max( 1 - beta^C,  max_{a=0..C-1} 1 - beta^a + beta^a delta_+(C - a, eps - a ln beta),
                 max_{a=0..C-1} delta_+(C - a, eps + a ln beta) ),   beta = P[v <= g - 1],

g = ceil(gap). For small C and sigma only (the convolutions are quadratic)."""
import math

import mpmath



class GshmBruteForce:
    """Thm 5.4's terms at one (sigma, gap, C): ``terms(eps)`` gives each a_eq's pair
    (middle term, last term) and ``delta(eps)`` their max with 1 - beta^C, as mpf."""

    def __init__(self, sigma, gap, c, dps=40):
        self.dps = dps
        with mpmath.workdps(dps):
            s = mpmath.mpf(sigma)
            self.two_s2 = 2 * s * s
            g = math.ceil(gap)
            k = max(int(math.ceil(16 * sigma)) + 4, abs(g) + 1)
            weights = [mpmath.exp(-mpmath.mpf(v * v) / self.two_s2) for v in range(-k, k + 1)]
            z = mpmath.fsum(weights)
            pmf = [w / z for w in weights]
            self.c = int(c)
            self.beta = mpmath.fsum(p for v, p in zip(range(-k, k + 1), pmf) if v <= g - 1)
            self.log_beta = mpmath.log(self.beta)
            # laws[n] = (lowest value of S, pmf of S) for n = 1..C
            self.laws = {1: (-k, pmf)}
            for n in range(2, self.c + 1):
                lo, prev = self.laws[n - 1]
                out = [mpmath.mpf(0)] * (len(prev) + len(pmf) - 1)
                for i, p in enumerate(prev):
                    for j, q in enumerate(pmf):
                        out[i + j] += p * q
                self.laws[n] = (lo - k, out)

    def shift_delta(self, n, e):
        with mpmath.workdps(self.dps):
            lo, law = self.laws[n]
            e = mpmath.mpf(e)
            total = []
            for i, p in enumerate(law):
                w = 1 - mpmath.exp(e - (2 * (lo + i) + n) / self.two_s2)
                if w > 0:
                    total.append(p * w)
            return mpmath.fsum(total)

    def terms(self, eps):
        """[(middle, last) for a_eq = 0..C-1]."""
        with mpmath.workdps(self.dps):
            out = []
            for a in range(self.c):
                x = a * self.log_beta
                middle = 1 - mpmath.exp(x) + mpmath.exp(x) * self.shift_delta(self.c - a, eps - x)
                out.append((middle, self.shift_delta(self.c - a, eps + x)))
            return out

    def delta(self, eps):
        with mpmath.workdps(self.dps):
            first = 1 - self.beta ** self.c
            return max([first] + [max(t) for t in self.terms(eps)])
