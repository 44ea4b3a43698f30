"""``thresher report OUTPUT --html``: one self-contained HTML page about a published
release — the guarantee, the parameters in words, the top keys, and matplotlib plots
embedded as PNG data URIs (no scripts, no external files):

1. released values by rank, on log scales;
2. the probability that a key held by n users is released, from the calibrated
   parameters alone (``pipelines.summary.release_probability``);
3. with ``max_keys_per_user: auto``, the candidate bounds and the one chosen;
4. with ``<column>_low / _high`` interval columns (issue 27), the top keys' intervals as
   error bars, one panel per value column, each relative to its value (issue 36 D4).

Beside the plots: how accurate a typical count, sum and mean is, in words (the median
half-width of the published intervals), the top keys' values as ``v [low, high]``, and
flags per statistic (issue 36 D5): a count, sum or mean whose interval includes 0, a
variance or stddev clamped at 0 (or at its largest possible value), any value whose
interval's half-width exceeds it (noise dominates). Every text is drawn as written:
matplotlib's math text is off (issue 36 D2), and the log axes' tick labels, which
matplotlib writes as math text, are rewritten as plain text (issue 42). Keys are cut to
60 characters in the table and 40 in the plots, and drawn in matplotlib's bundled DejaVu
Sans with each character it has no glyph for escaped (no "Glyph missing" warnings).

matplotlib is the optional ``report`` extra (``pip install 'thresher[report]'``).
"""
import base64
import errno
import functools
import html
import io as _io
import re

import numpy as np

from thresher.pipelines.reports import look, summary
from thresher.pipelines.errors import SpecError, ThresherError

TOP_KEYS = 20
LOW, HIGH = "_low", "_high"
ERROR_BAR_COLOUR = "#2e8b57"


class MissingDependency(ThresherError):
    """An optional library the command needs is not installed."""


def _pyplot():
    try:
        import matplotlib  # heavy: matplotlib
    except ImportError:
        raise MissingDependency("thresher report --html needs matplotlib; install it with "
                                "pip install 'thresher[report]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib
    return plt


def _literal_text():
    """matplotlib settings under which every text is drawn as written: keys, column names
    and any other data-derived label are never parsed as math text (issue 36 D2: a key
    ``$\\frac{$`` was an internal error, ``a$b$c`` was drawn as italics without its
    dollars), and never handed to TeX."""
    return {"text.parse_math": False, "text.usetex": False}


def _settings():
    """Everything the page's plots are drawn under: literal text, and matplotlib's own
    DejaVu Sans (bundled with it, so present on every machine whatever matplotlibrc
    says), whose glyphs :func:`_label` checks every data-derived label against."""
    return {**_literal_text(), "font.family": "sans-serif", "font.sans-serif": [FONT],
            # log-axis ticks below 1,000 as plain numbers (500, not 5x10^2)
            "axes.formatter.min_exponent": 3}


FONT = "DejaVu Sans"
PLOT_LABEL_WIDTH = 40       # characters of a key drawn as a plot label


@functools.lru_cache(maxsize=1)
def _glyphs():
    """The code points FONT has a glyph for (its character map)."""
    from matplotlib import font_manager, ft2font  # heavy: matplotlib
    path = font_manager.findfont(font_manager.FontProperties(family=FONT),
                                 fallback_to_default=True)
    return frozenset(ft2font.FT2Font(path).get_charmap())


def _label(text, width=PLOT_LABEL_WIDTH):
    """A data-derived text (a key, a column name) as a plot draws it: cut to ``width``
    characters, and each character the font has no glyph for (CJK, most emoji) written as
    its escape, ``\\u4e2d``, as ``show`` writes control characters. Issue 42: such keys
    were drawn as empty boxes and matplotlib printed a "Glyph ... missing" warning per
    character on stderr."""
    glyphs = _glyphs()
    text = summary.cut(text, width)
    if all(ord(ch) in glyphs for ch in text):
        return text
    return "".join(ch if ord(ch) in glyphs else summary._escaped(ch) for ch in text)


def _superscript(match):
    return match.group(1).translate(SUPERSCRIPT)


SUPERSCRIPT = str.maketrans("0123456789-.", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b\u00b7")
_MATH = re.compile(r"^\$\\mathdefault\{(.*)\}\$$")
_POWER = re.compile(r"\^\{([-0-9.]+)\}")


def plain_tick(text):
    """A log axis's tick label, which matplotlib writes as math text
    (``$\\mathdefault{10^{4}}$``, ``$\\mathdefault{2\\times10^{3}}$``), as plain text
    (``10\u2074``, ``2\u00d710\u00b3``): with math text off for the data's sake (issue 36 D2) the
    markup was printed as it is (issue 42)."""
    match = _MATH.match(text)
    if not match:
        return text
    inner = _POWER.sub(_superscript, match.group(1))
    return inner.replace("\\times", "\u00d7").replace("-", "\u2212")


@functools.lru_cache(maxsize=1)
def _plain_ticks_formatter():
    """The class of a tick formatter that writes what the formatter it wraps writes, as
    plain text (:func:`plain_tick`); made on first use, matplotlib being optional."""
    from matplotlib.ticker import Formatter  # heavy: matplotlib

    class PlainTicks(Formatter):
        def __init__(self, inner):
            self.inner = inner

        def set_axis(self, axis):
            super().set_axis(axis)
            self.inner.set_axis(axis)

        def set_locs(self, locs):
            self.inner.set_locs(locs)

        def __call__(self, x, pos=None):
            return plain_tick(self.inner(x, pos))

        def format_ticks(self, values):
            return [plain_tick(t) for t in self.inner.format_ticks(values)]

        def format_data(self, value):
            return plain_tick(self.inner.format_data(value))

        def format_data_short(self, value):
            return plain_tick(self.inner.format_data_short(value))

    return PlainTicks


def _plain_ticks(fig):
    """Every axis of ``fig`` whose tick labels are math text (log and symlog scales)
    gets them as plain text."""
    from matplotlib.ticker import LogFormatterMathtext  # heavy: matplotlib
    plain = _plain_ticks_formatter()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for get, put in ((axis.get_major_formatter, axis.set_major_formatter),
                             (axis.get_minor_formatter, axis.set_minor_formatter)):
                if isinstance(get(), LogFormatterMathtext):
                    put(plain(get()))


def _png(fig, plt):
    _plain_ticks(fig)
    buf = _io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _counts_figure(plt, values, column):
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    values = np.sort(np.asarray([v for v in values if v is not None], dtype=np.float64))[::-1]
    if len(values):
        ranks = np.arange(1, len(values) + 1)
        ax.plot(ranks, values, marker="." if len(values) < 200 else None, lw=1.5, color="#1f5f8b")
        ax.set_xscale("log")
        ax.set_yscale("log" if values.min() > 0 else "symlog")
    else:
        ax.text(0.5, 0.5, "no key was released", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("rank of the released key")
    ax.set_ylabel(_label(f"released {column}"))
    ax.set_title("Released values, largest first (log scales)")
    ax.grid(True, which="both", alpha=0.3)
    return fig


def _probability_figure(plt, report, unit):
    sure = summary.users_at(report, 0.999) or 100
    n = np.arange(0, int(sure * 1.3) + 2)
    p = summary.release_probability(report, n)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(n, p, color="#b5523b", lw=2)
    half = summary.users_at(report, 0.5)
    if half is not None:
        ax.axvline(half, color="grey", ls="--", lw=1)
        ax.annotate(f"50% at n = {half:,}", (half, 0.5), xytext=(8, -4), textcoords="offset points")
    ax.set_xlabel(f"n: the key's count of {unit}")
    ax.set_ylabel("P(key is released)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Probability that a key of n users is released (from the plan)")
    ax.grid(True, alpha=0.3)
    return fig


def _bound_figure(plt, bounding):
    """The candidate bounds and the chosen one, with what is public about the choice: the
    exponential mechanism's epsilon, its score and the score's sensitivity. The scores
    V(C) and the selection probabilities are computed from the data and are not private
    (docs/contribution_bound.md, "Only the chosen C is public"): they are never drawn."""
    candidates = bounding["candidates"]
    chosen = bounding["max_keys_per_user"]
    excluded = {int(c) for c in bounding.get("excluded_candidates", {})}
    fig, ax = plt.subplots(figsize=(6.4, 2.3))
    kept = [c for c in candidates if c not in excluded]
    ax.scatter(kept, [0] * len(kept), s=40, color="#9aa5b1", label="candidate", zorder=2)
    if excluded:
        ax.scatter(sorted(excluded), [0] * len(excluded), s=40, marker="x", color="black",
                   label="excluded (cannot meet the budget)", zorder=2)
    ax.scatter([chosen], [0], s=160, color="#d1495b", label=f"chosen: {chosen}", zorder=3)
    ax.annotate(f"C = {chosen}", (chosen, 0), xytext=(0, 12), textcoords="offset points",
                ha="center", color="#d1495b")
    ax.set_xscale("log", base=2)
    ax.set_xticks(candidates)
    ax.set_xticklabels([str(c) for c in candidates])
    ax.set_yticks([])
    ax.set_ylim(-1, 1.4)
    ax.set_xlabel("max_keys_per_user (C)")
    ax.set_title("Contribution bound chosen by the exponential mechanism")
    sel = bounding.get("selection") or {}
    facts = []
    if "epsilon" in sel:
        facts.append(f"epsilon = {sel['epsilon']:g}")
    if "score" in sel:
        facts.append(f"score: {sel['score']}" + (f" ({sel['objective']})" if "objective" in sel else ""))
    if "sensitivity" in sel:
        facts.append(f"score sensitivity = {sel['sensitivity']:.4g}")
    if facts:
        ax.text(0.5, 0.86, ";  ".join(facts), ha="center", va="center", transform=ax.transAxes,
                fontsize=9, color="#444")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, frameon=False)
    return fig


def bound_caption(bounding):
    """The words under the contribution-bound plot: what the choice spent, and why the
    candidates' scores and probabilities are not shown."""
    sel = bounding.get("selection") or {}
    spent = (f"It spent epsilon {sel['epsilon']:g} of the budget: each candidate C has "
             f"probability proportional to exp(epsilon &middot; V(C) / sensitivity)"
             + (f", with sensitivity {sel['sensitivity']:.4g}" if "sensitivity" in sel else "")
             + ". " if "epsilon" in sel else "")
    return (f"The bound C = {bounding['max_keys_per_user']} was drawn from "
            f"{len(bounding['candidates'])} candidates by the exponential mechanism. {spent}"
            "The scores V(C) and the probabilities they give are computed from the data and "
            "are not differentially private, so they are not published: only the chosen C is "
            "(docs/contribution_bound.md).")


def _quantiles_figure(plt, table, keys):
    """Each key's released quantiles: value against rank."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    groups = {}
    columns = {n: table.column(n).to_pylist() for n in keys + ["rank", "value"]}
    for i in range(table.num_rows):
        label = _label(", ".join(summary._cell(columns[k][i], None) for k in keys) or "all rows")
        groups.setdefault(label, []).append((columns["rank"][i], columns["value"][i]))
    for label, points in list(groups.items())[:10]:
        points = sorted(p for p in points if p[0] is not None and p[1] is not None)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", lw=1.5,
                label=label)
    if not groups:
        ax.text(0.5, 0.5, "no quantile was released", ha="center", va="center",
                transform=ax.transAxes)
    elif len(groups) > 1:
        ax.legend(fontsize=8, title=f"first {min(10, len(groups))} of {len(groups)} keys"
                  if len(groups) > 10 else None)
    ax.set_xlabel("rank")
    ax.set_ylabel("released value")
    ax.set_xlim(0, 1)
    ax.set_title("Released quantiles")
    ax.grid(True, alpha=0.3)
    return fig


# The figures a kind asks for by its FIGURES (pipelines.kinds.base.Kind): name -> (title,
# draw(plt, table, key columns), the released columns it draws; drawn when present).
FIGURES = {
    "quantile_curves": ("Released quantiles", _quantiles_figure, ("rank", "value")),
}


def interval_columns(table):
    """Value columns with published ``_low`` / ``_high`` intervals, in table order."""
    names = set(table.column_names)
    return [c for c in table.column_names if c + LOW in names and c + HIGH in names]


SPREAD = ("variance", "stddev")


def statistics(report):
    """{released column: its statistic}: ``count`` for the kind's counts and estimates,
    the aggregates' own (``sum``, ``mean``, ``variance``, ``stddev``)."""
    out = {c: "count" for c in summary.VALUE_COLUMNS}
    for a in report.get("mechanism", {}).get("aggregates", []) or []:
        if isinstance(a, dict) and isinstance(a.get("output"), str):
            out[a["output"]] = a.get("statistic")
    return out


def _spread_ceiling(report, column):
    """The largest value a variance / stddev column can take (its release clamps to the
    Popoviciu bound of the clip, ((high - low) / 2)**2), or None."""
    for a in report.get("mechanism", {}).get("aggregates", []) or []:
        if isinstance(a, dict) and a.get("output") == column and a.get("statistic") in SPREAD:
            clip = a.get("clip")
            if not (isinstance(clip, (list, tuple)) and len(clip) == 2):
                return None
            ceiling = ((float(clip[1]) - float(clip[0])) / 2.0) ** 2
            return ceiling if a["statistic"] == "variance" else ceiling ** 0.5
    return None


def _flags(value, low, high, statistic=None, ceiling=None):
    """Why a value with interval [low, high] needs care, per statistic (empty: it does
    not; issue 36 D5). A variance or stddev is never below 0, so "interval includes 0"
    says nothing about it: its release is clamped to [0, ceiling] instead, and a value at
    either end is flagged as clamped. Counts, sums and means: the interval includes 0 (the
    sign, or for a public key's count whether anyone holds it, is not known). Any value
    whose interval's half-width exceeds it: noise dominates."""
    if value is None:
        return []
    out = []
    if statistic in SPREAD:
        if value <= 0:
            out.append("clamped at 0")
        elif ceiling is not None and value >= ceiling:
            out.append("clamped at its largest possible value")
    if low is None or high is None:
        return out
    if statistic not in SPREAD and low <= 0 <= high:
        out.append("interval includes 0")
    if (high - low) / 2.0 > abs(value):
        out.append("noise dominates")
    return out


def accuracy_in_words(table, report):
    """Sentences: per column with an interval, the median half-width over released keys,
    absolute and relative to the value, and how many values are flagged; per column
    without one, what the report says instead."""
    info = report.get("intervals", {})
    conf = info.get("confidence")
    stats = statistics(report)
    out = []
    for column in interval_columns(table):
        v = np.asarray(table.column(column).to_pylist(), dtype=object)
        lo = np.asarray(table.column(column + LOW).to_pylist(), dtype=object)
        hi = np.asarray(table.column(column + HIGH).to_pylist(), dtype=object)
        ok = np.array([a is not None and b is not None and c is not None
                       for a, b, c in zip(v, lo, hi)], dtype=bool)
        if not ok.any():
            continue
        value = v[ok].astype(np.float64)
        half = (hi[ok].astype(np.float64) - lo[ok].astype(np.float64)) / 2.0
        typical = float(np.median(half))
        rel = half / np.maximum(np.abs(value), 1e-300)
        spread = stats.get(column) in SPREAD
        zero = 0 if spread else int(sum(1 for a, b in zip(lo[ok], hi[ok]) if a <= 0 <= b))
        clamped = int(np.sum(value <= 0)) if spread else 0
        noisy = int(np.sum(half > np.abs(value)))
        target = info.get("columns", {}).get(column, {}).get("target")
        text = (f"{column}: a typical released value is within +/- {typical:,.3g} "
                f"of its target (median half-width of the {conf:g} intervals; "
                f"{float(np.median(rel)) * 100:.3g}% of the value)")
        if target:
            text += f"; the target is {target}"
        if spread and (clamped or noisy):
            text += (f". {clamped} of {int(ok.sum())} values are clamped at 0 and {noisy} have "
                     f"an interval wider than the value (noise dominates)")
        elif zero or noisy:
            text += (f". {zero} of {int(ok.sum())} intervals include 0 and {noisy} are wider "
                     f"than the value (noise dominates)")
        out.append(text)
    for column, why in info.get("without_interval", {}).items():
        out.append(f"{column}: {why}")
    return out


def _interval_figure(plt, top_table, keys, columns):
    """Error bars of the top keys, one panel per value column with an interval (issue 36
    D4: only the first column was drawn, the count, whose +/- 28 hid behind its marker on a
    0-10,000 axis). Each panel shows the interval relative to the value, (low - v) / |v|
    and (high - v) / |v| in percent, so a +/- 0.3% count and a +/- 50% mean are both
    visible; a value of 0 has no relative interval and is marked at 0 with its label."""
    labels = [_label(" / ".join(summary._cell(r[k], None) for k in keys) or "(all rows)")
              for r in top_table.to_pylist()]
    n = max(len(labels), 3)
    fig, axes = plt.subplots(1, len(columns), figsize=(3.4 * len(columns) + 1.6, 0.32 * n + 1.4),
                             sharey=True, squeeze=False)
    y = np.arange(len(labels))[::-1]
    for ax, column in zip(axes[0], columns):
        v, lo, hi = (np.array([np.nan if x is None else x for x in top_table.column(c).to_pylist()],
                              float) for c in (column, column + LOW, column + HIGH))
        scale = np.where(np.abs(v) > 0, np.abs(v), np.nan)
        below = np.maximum(v - lo, 0) / scale * 100.0
        above = np.maximum(hi - v, 0) / scale * 100.0
        drawn = np.isfinite(below) & np.isfinite(above)
        ax.errorbar(np.zeros(int(drawn.sum())), y[drawn],
                    xerr=[below[drawn], above[drawn]], fmt="o", color=ERROR_BAR_COLOUR,
                    ecolor=ERROR_BAR_COLOUR, elinewidth=3, capsize=4, markersize=4)
        for yy in y[~drawn & np.isfinite(v)]:
            ax.annotate("value 0", (0, yy), xytext=(4, -3), textcoords="offset points",
                        fontsize=7, color="#666")
        widest = float(np.nanmax(np.concatenate([below[drawn], above[drawn]]))) \
            if drawn.any() else 1.0
        ax.set_xlim(-1.15 * widest, 1.15 * widest)
        ax.axvline(0, color="#999", lw=0.8)
        ax.set_xlabel("interval around the value, % of |value|")
        ax.set_title(_label(column), fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0][0].set_yticks(y)
    axes[0][0].set_yticklabels(labels, fontsize=8)
    fig.suptitle("Top keys: each value's confidence interval, relative to the value", fontsize=10)
    return fig


def _cells(row, columns, with_interval, stats=None, ceilings=None):
    """A top-table row's cells: values with intervals as 'v [low, high]' plus flags."""
    stats, ceilings = stats or {}, ceilings or {}
    cells = []
    for name in columns:
        v = row[name]
        text = summary._cell(v)
        flags = []
        if name in with_interval:
            lo, hi = row[name + LOW], row[name + HIGH]
            if lo is not None and hi is not None:
                text += f" [{summary._cell(lo)}, {summary._cell(hi)}]"
            flags = _flags(v, lo, hi, stats.get(name), ceilings.get(name))
        cls = "num" if summary._is_number(v) else "text"
        if flags:
            cls += " flagged"
            text += " (" + "; ".join(flags) + ")"
        cells.append(f'<td class="{cls}">{html.escape(text)}</td>')
    return "".join(cells)


def build(output, top=TOP_KEYS):
    """The HTML page (a string) for the release published in ``output``."""
    plt = _pyplot()
    with plt.rc_context(_settings()):
        return _build(plt, output, top)


def _build(plt, output, top):
    report = summary.load_report(output)
    table = summary.load_released(output, report)
    column = summary.value_column(table, report)
    keys = summary.key_columns(table.column_names, report)
    unit = "records" if report["bounding"].get("model") == "l1" else "distinct users"
    privacy = report["privacy"]
    delta = privacy.get("delta_spent", privacy["delta"])
    figures = []
    if column:
        figures.append(("Released values", _png(_counts_figure(plt, table.column(column).to_pylist(),
                                                               column), plt)))
    if summary.release_probability(report, [1]) is not None:
        figures.append(("Release probability", _png(_probability_figure(plt, report, unit), plt)))
    kind = summary._kind(report)
    for figure in kind.FIGURES if kind is not None else ():
        title, draw, columns = FIGURES[figure]
        if set(columns) <= set(table.column_names):
            figures.append((title, _png(draw(plt, table, [k for k in keys if k not in columns]),
                                        plt)))
    bounding = report["bounding"]
    if bounding.get("chosen_by") == "exponential_mechanism" and "candidates" in bounding:
        figures.append(("Contribution bound", _png(_bound_figure(plt, bounding), plt),
                        bound_caption(bounding)))
    top_table = summary.top_rows(table, report, top)
    with_interval = interval_columns(table)
    if with_interval and top_table.num_rows:
        figures.append((f"Top keys with intervals ({', '.join(with_interval)})", _png(
            _interval_figure(plt, top_table, keys, with_interval), plt)))
    shown = [c for c in top_table.column_names
             if not any(c == w + LOW or c == w + HIGH for w in with_interval)]
    stats = statistics(report)
    ceilings = {c: _spread_ceiling(report, c) for c in with_interval}
    rows = "".join("<tr>" + _cells(row, shown, set(with_interval), stats, ceilings) + "</tr>"
                   for row in top_table.to_pylist())
    head = "".join(f"<th>{html.escape(n)}" + (" [low, high]" if n in with_interval else "")
                   + "</th>" for n in shown)
    accuracy = "".join(f"<li>{html.escape(line)}</li>" for line in accuracy_in_words(table, report))
    conf = report.get("intervals", {}).get("confidence")
    accuracy_section = (f"<h2>Accuracy ({conf:g} confidence intervals)</h2><ul>{accuracy}</ul>"
                        if accuracy and conf is not None else "")
    words = "".join(f"<li>{html.escape(line)}</li>" for line in
                    summary.quantile_lines(report, table) + summary.noise_in_words(report, keys))
    stages = "".join(f"<li>{html.escape(s['name'])}: epsilon {s['epsilon']:g}, delta {s['delta']:g}</li>"
                     for s in privacy.get("stages", []))
    figs = "".join(f'<figure><img alt="{html.escape(f[0])}" src="data:image/png;base64,{f[1]}">'
                   f"<figcaption>{html.escape(f[0])}"
                   + (f"<p>{f[2]}</p>" if len(f) > 2 else "") + "</figcaption></figure>"
                   for f in figures)
    plots = f"<h2>Plots</h2>{figs}" if figures else ""
    if top_table.num_rows:
        # the notes but the first, the bounded-data line: the words above have it
        notes = "".join(f"<p>{html.escape(line)}</p>" for line in
                        look.table_notes(report, top_table, output, keys)[1:])
        top_section = (f"<h2>Top {top_table.num_rows} keys</h2>\n<table><thead><tr>{head}</tr>"
                       f"</thead><tbody>{rows}</tbody></table>{notes}")
    else:
        top_section = ("<h2>Released keys</h2>\n<p>No key was released: the released "
                       "table is empty.</p>")
    name = html.escape(str(report.get("name", "release")))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>thresher release {name}</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; max-width: 60em; color: #222; background: #fff; }}
h1 {{ font-size: 1.6em; border-bottom: 3px solid #1f5f8b; padding-bottom: .2em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: .2em .6em; }}
th {{ background: #e8eef3; }} td.num {{ text-align: right; }} td.text {{ text-align: left; }}
td.flagged {{ background: #fdecea; }} td, th {{ overflow-wrap: anywhere; }}
figure {{ margin: 1em 0; }} img {{ max-width: 100%; }}
.guarantee {{ background: #f3f6f8; padding: .6em 1em; border-left: 4px solid #1f5f8b; }}
</style></head><body>
<h1>Release {name}</h1>
<p class="guarantee">{report['released_keys']:,} keys released with user-level
(&epsilon; = {privacy['epsilon']:g}, &delta; = {delta:g})-differential privacy
({html.escape(privacy['neighbouring'])}); {html.escape(report['mechanism'].get('kind', ''))} mechanism,
at most {report['bounding']['max_keys_per_user']} keys per user.</p>
<ul>{words}</ul>
<h2>Budget stages</h2><ul>{stages}</ul>
{accuracy_section}
{top_section}
{plots}
<p><small>Made by thresher {html.escape(str(report.get('thresher_version', '')))} from
release_report.json and the released file only; config sha256
{html.escape(str(report.get('config_sha256', ''))[:16])}&hellip;</small></p>
</body></html>
"""


def write(output, dest, top=TOP_KEYS):
    """Write the page to ``dest``. A reader that goes away before the page is written
    (``--html /dev/stdout | head``) ends the command as it ends ``show``: quietly
    (raises ``look.PipeClosed``)."""
    page = build(output, top)
    try:
        with open(dest, "w", encoding="utf-8") as handle:
            handle.write(page)
    except BrokenPipeError:
        raise look.PipeClosed() from None
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            raise look.PipeClosed() from None
        raise SpecError("--html", f"cannot write {dest!r}: {exc.strerror or exc}") from None
    return dest
