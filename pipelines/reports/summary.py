"""A release as people read it: the lines ``thresher run`` ends with, ``thresher show``'s
table of top keys, and the numbers behind ``thresher report --html`` (pipelines/reports/html_report.py).

Everything here is computed from the published files (``release_report.json`` and the
released Parquet) or from the calibrated parameters alone; nothing reads the input.
"""
import json
import os

import numpy as np

from thresher.pipelines.errors import SpecError

REPORT_FILE = "release_report.json"


# ---- reading a published release -------------------------------------------------------

def load_report(output):
    path = os.path.join(output, REPORT_FILE)
    if not os.path.isfile(path):
        raise SpecError("", f"{output!r} ({os.path.abspath(output)}) holds no release: "
                            f"{REPORT_FILE} is missing")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def released_files(output, report):
    """The released Parquet files, as listed in the report (absolute or relative to the
    output folder) or, failing that, found in the folder."""
    files = []
    for name in report.get("outputs", []):
        for candidate in (name, os.path.join(output, name), os.path.join(output, os.path.basename(name))):
            if os.path.isfile(candidate):
                files.append(candidate)
                break
    if not files:
        files = sorted(os.path.join(output, f) for f in os.listdir(output)
                       if f.startswith("released") and f.endswith(".parquet"))
    return files


def load_released(output, report):
    import pyarrow as pa
    import pyarrow.parquet as pq
    files = released_files(output, report)
    if not files:
        raise SpecError("", f"{output!r} holds no released Parquet file")
    return pa.concat_tables([pq.read_table(f) for f in files])


def value_column(table, report):
    """The released column people sort by: the noisy count, else the estimate."""
    for name in ("count", "estimate", "token"):
        if name in table.column_names and table.column(name).null_count < table.num_rows:
            return name
    return None


def top_rows(table, report, top):
    """The ``top`` rows with the largest released value (ties by key, for a stable table)."""
    column = value_column(table, report)
    keys = [c for c in table.column_names if c not in ("count", "estimate", "token", "debiased")]
    order = [(column, "descending")] if column else []
    order += [(k, "ascending") for k in keys]
    if order:
        table = table.sort_by(order)
    return table.slice(0, top)


def format_table(table):
    """A plain-text table: a header, a rule, right-aligned numbers."""
    names = table.column_names
    columns = [[_cell(v) for v in table.column(n).to_pylist()] for n in names]
    numeric = [all(_is_number(v) for v in table.column(n).to_pylist() if v is not None)
               for n in names]
    widths = [max([len(n)] + [len(c) for c in col]) for n, col in zip(names, columns)]

    def line(cells):
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, widths, numeric)).rstrip()
    out = [line(names), line(["-" * w for w in widths])]
    out += [line([col[i] for col in columns]) for i in range(table.num_rows)]
    return "\n".join(out)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _cell(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.6g}" if abs(v) < 1e15 else f"{v:.6g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


# ---- the probability that a key is released -----------------------------------------------

def release_probability(report, counts):
    """P(a key held by n users is released), n in ``counts``, from the calibrated
    parameters alone (report["mechanism"]); None when every key is released regardless
    (public keys) or the kind has no such curve.

    - gaussian (paper 004 Alg. 1): n >= pre_threshold and n + Z >= threshold, Z discrete
      Gaussian(sigma): ``accounting.discrete_gaussian.sf``;
    - laplace (paper 002 Alg. 3): n >= pre_threshold and n + Z >= threshold, Z discrete
      Laplace(scale): ``accounting.laplace_threshold.log_suppress``;
    - sample_and_threshold (paper 003 Sec. 3.1): Binomial(n, p) >= threshold;
    - weighted_sampling (paper 001 Alg. 3): pi_n, the end-to-end reporting probability.
    A user bounded to fewer keys than they had counts once in each kept key, so n is the
    key's count after bounding.
    """
    mech = report["mechanism"]
    kind = mech.get("kind")
    n = np.asarray(counts, dtype=np.int64)
    if mech.get("public_keys") or "by_max_keys_per_user" in mech:
        return None
    if kind == "gaussian":
        from thresher.accounting.discrete_gaussian import sf
        p = np.asarray(sf(mech["threshold"] - n, mech["sigma"]), dtype=np.float64)
        return np.where(n >= mech.get("pre_threshold", 1), p, 0.0)
    if kind == "laplace":
        from thresher.accounting.laplace_threshold import log_suppress
        p = -np.expm1(log_suppress(mech["scale"], mech["threshold"] - n, mech.get("noise", "discrete_laplace")))
        return np.where(n >= mech.get("pre_threshold", 1), p, 0.0)
    if kind == "sample_and_threshold":
        from scipy import stats
        return stats.binom.sf(mech["threshold"] - 1, n, mech["sampling_rate"])
    if kind == "weighted_gaussian":
        # n users that each kept max_keys_per_user keys (the lightest weight, q_C): the
        # curve of the heaviest users; lighter users need fewer co-holders
        from thresher.accounting.weighted_gaussian import grid_weight, sf_upper
        q = grid_weight(int(report["bounding"]["max_keys_per_user"]), mech["scale"])
        sd = mech["sigma"] * mech["scale"]
        return np.asarray([sf_upper(mech["threshold_grid"] - int(k) * q, sd) if k > 0 else 0.0
                           for k in n], dtype=np.float64)
    if kind == "weighted_sampling":
        keep = weighted_sampling_keep(mech)
        # The release reads row min(n, M) of the table it used (transforms.sanitize_sample:
        # counts above max_frequency M are treated as M, whether M saturates at pi = 1 or
        # was clipped by an explicit max_frequency), so the curve does too.
        return keep[np.minimum(n, len(keep) - 1)]
    return None


def weighted_sampling_keep(mech):
    """pi_0..pi_M: the keep table the weighted_sampling release draws with
    (``accounting.pws.release_tables`` of the report's parameters, as the release builds it)."""
    from thresher.accounting import pws
    from thresher.transforms.sanitize_sample import _as_parameters
    return np.asarray(pws.release_tables(_as_parameters(mech)).keep, dtype=np.float64)


def release_ceiling(report):
    """(M, pi_M) when no count of users reaches release probability 1 because the table
    stops at an explicit max_frequency M below saturation (weighted_sampling); else None."""
    mech = report["mechanism"]
    if mech.get("kind") != "weighted_sampling" or "by_max_keys_per_user" in mech:
        return None
    keep = weighted_sampling_keep(mech)
    if keep[-1] >= 1.0:
        return None
    return len(keep) - 1, float(keep[-1])


def users_at(report, probability, limit=10**7):
    """The smallest n whose release probability reaches ``probability`` (None if none)."""
    lo, hi = 0, 1
    while hi <= limit:
        p = release_probability(report, [hi])
        if p is None:
            return None
        if p[0] >= probability:
            break
        lo, hi = hi, hi * 2
    else:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if release_probability(report, [mid])[0] >= probability:
            hi = mid
        else:
            lo = mid
    return hi


# ---- words -----------------------------------------------------------------------------------

def _g(x):
    return f"{x:.4g}" if isinstance(x, float) else f"{x}"


def noise_in_words(report, keys):
    """One or two sentences: what was added to each key's count and which keys came out."""
    mech = report["mechanism"]
    kind = mech.get("kind")
    bounding = report["bounding"]
    c = bounding["max_keys_per_user"]
    unit = "records" if bounding.get("model") == "l1" else "distinct users"
    each = (f"each user counted in at most {c} keys"
            if bounding.get("model") != "l1" else f"each user contributing at most {c} records")
    how = "chosen privately" if bounding.get("chosen_by") == "exponential_mechanism" else "from the spec"
    key = " and ".join(keys) if keys else "key"
    out = [f"bound: {each} ({how})"]
    if mech.get("public_keys"):
        noise = (f"discrete Gaussian noise (sigma {_g(mech['sigma'])})" if kind == "gaussian"
                 else f"discrete Laplace noise (scale {_g(mech['scale'])})")
        out.append(f"noise: every public {key} is released with its count of {unit} plus "
                   f"{noise}; no threshold")
        return out
    if kind in ("gaussian", "laplace"):
        noise = (f"discrete Gaussian noise with sigma {_g(mech['sigma'])}" if kind == "gaussian"
                 else f"discrete Laplace noise with scale {_g(mech['scale'])}")
        out.append(f"noise: each {key}'s count of {unit} gets {noise}; a {key} is released "
                   f"when its count is at least {mech.get('pre_threshold', 1)} and its noisy "
                   f"count at least {_g(mech['threshold'])}")
    elif kind == "sample_and_threshold":
        out.append(f"sampling: each user's contribution to a {key} is kept with probability "
                   f"{_g(mech['sampling_rate'])} (no noise); a {key} is released when its "
                   f"sampled count is at least {mech['threshold']}")
    elif kind == "weighted_gaussian":
        out.append(f"selection: each user gives each of their t kept keys the weight "
                   f"1/sqrt(t); a {key} is released when its total weight plus discrete "
                   f"Gaussian noise (sigma {_g(mech['sigma'])}) reaches {_g(mech['threshold'])}; "
                   f"its count of {unit} gets discrete Gaussian noise with sigma "
                   f"{_g(mech['count_sigma'])}")
        unit = f"{unit} with {c} keys each"
    elif kind == "adaptive":
        rounds = mech["rounds"]
        out.append(f"selection: {len(rounds)} rounds; in each, every user gives each of "
                   f"their t kept keys not released before the weight 1/sqrt(t), and a {key} "
                   f"is released when its total weight plus discrete Gaussian noise reaches "
                   f"the round's threshold (" + ", ".join(
                       f"sigma {_g(r['sigma'])}, threshold {_g(r['threshold'])}"
                       for r in rounds) + f"); its count of {unit} gets discrete Gaussian "
                   f"noise with sigma {_g(mech['count_sigma'])}")
    elif kind == "heavy_hitters":
        how = ("whole keys selected by adaptive weighted Gaussian rounds, ranked by their "
               "noisy counts" if mech.get("method") == "adaptive" else
               f"TrieHH++ over prefix levels {mech.get('prefix_lengths')}")
        out.append(f"heavy hitters: {how}; release point about {mech['release_point']:,.0f} "
                   f"{unit} for a {key} whose users hold {c} keys each")
        got, top_k = report.get("released_keys"), mech.get("top_k")
        if got is not None and top_k is not None and got < top_k:
            out.append(f"{got:,} of top_k {top_k:,} came back: {mech['fewer_than_top_k']}")
    elif kind == "quantiles" and "support_floor" in mech:
        out.append(f"quantiles per {key}: every bucket of every selected {key} gets discrete "
                   f"Gaussian noise (sigma {_g(mech['sigma'])}), no threshold; values are "
                   f"monotone in rank; a {key} gets null values only when "
                   f"{mech['null_values'].partition('null: ')[2]}")
    elif kind == "weighted_sampling":
        out.append(f"sampling: each {key} is reported with a probability that grows with its "
                   f"count of users (private weighted sampling); released frequencies are "
                   f"sanitized")
    ceiling = release_ceiling(report)
    half, sure = users_at(report, 0.5), users_at(report, 0.99)
    if half is not None and sure is not None:
        out.append(f"a {key} of {half:,} {unit} is released at least half the time; of "
                   f"{sure:,}, at least 99% of the time")
    elif ceiling is not None:
        m, top = ceiling
        reach = (f"a {key} of {half:,} {unit} is released at least half the time; "
                 if half is not None else "")
        out.append(f"{reach}counts above max_frequency {m} are treated as {m}, so a {key} of "
                   f"any size is released with probability at most {top:.3g} (pi_{m}); "
                   f"leave max_frequency to auto for a table that reaches 1")
    return out


def run_lines(report, output, keys, ledger_line=None):
    """What ``thresher run`` prints at the end."""
    # The report names its files relative to the output folder (local or a URL).
    base = output.rstrip("/")
    files = [f"{base}/{name}" for name in report.get("outputs", [])] + [f"{base}/{REPORT_FILE}"]
    privacy = report["privacy"]
    delta = privacy.get("delta_spent", privacy["delta"])
    lines = ["wrote " + ", ".join(files),
             f"released {report['released_keys']:,} keys; spent epsilon={privacy['epsilon']:g}, "
             f"delta={delta:g} (user-level: {privacy['neighbouring']}); "
             f"max_keys_per_user={report['bounding']['max_keys_per_user']}"]
    if ledger_line:
        lines.append(ledger_line)
    lines += noise_in_words(report, keys)
    lines.append(f"look at it: thresher show {output}   |   thresher report {output} --html")
    return lines
