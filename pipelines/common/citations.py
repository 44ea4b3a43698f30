"""The papers thresher implements, cited as people cite them (authors and title) in what a
user reads: the release report, ``thresher plan``. Inside the code the papers keep their
short numbers (``paper 004``); ``cite`` turns those into references.
"""
import re

PAPERS = {
    "000": ('Bharadwaj & Cormode, "Sample-and-threshold differential privacy: histograms and '
            'applications" (workshop version)'),
    "001": 'Cohen, Geri, Sarlos & Stemmer, "Differentially Private Weighted Sampling" (AISTATS 2021)',
    "002": ('Liu, Suresh, Zhu, Kairouz & Gruteser, "Algorithms for bounding contribution for '
            'histogram estimation under user-level privacy" (ICML 2023)'),
    "003": ('Bharadwaj & Cormode, "Sample and Threshold Differential Privacy: Histograms and '
            'applications" (AISTATS)'),
    "004": ('Karrer, Kifer, Wilkins & Zhang, "Exact privacy analysis of the Gaussian sparse '
            'histogram mechanism"'),
    # not among the project's numbered papers (the accounting text cites it in full)
    "LR25": ('Lebeda & Retschmeier, "The Correlated Gaussian Sparse Histogram Mechanism" '
             '(FORC 2025)'),
}
_BOTH_SAMPLE_AND_THRESHOLD = ('Bharadwaj & Cormode, "Sample and Threshold Differential Privacy: '
                              'Histograms and applications" (workshop and AISTATS versions)')
_REF = re.compile(r"\bpapers? (\d{3}(?:/\d{3})*)('s)?( (?=[A-Z]|eq\.|C_alpha|l0|Sec\.))?")


def _replace(match):
    numbers = match.group(1).split("/")
    if sorted(numbers) == ["000", "003"]:
        text = _BOTH_SAMPLE_AND_THRESHOLD
    else:
        text = "; ".join(PAPERS.get(n, f"paper {n}") for n in numbers)
    if match.group(2):          # "paper 002's V" -> "... (ICML 2023), its V"
        return text + ", its" + (" " if match.group(3) else "")
    if match.group(3):          # "paper 004 Thm 5.4" -> "..., Thm 5.4"
        text += ", "
    return text


def cite(text):
    """``text`` with every "paper 00N" (and "papers 000/003") replaced by authors and title."""
    return _REF.sub(_replace, text)


def cite_all(value):
    """A copy of a JSON-like value (dicts, lists, strings) with ``cite`` applied to every
    string value (keys are left alone)."""
    if isinstance(value, str):
        return cite(value)
    if isinstance(value, dict):
        return {k: cite_all(v) for k, v in value.items()}
    if isinstance(value, list):
        return [cite_all(v) for v in value]
    if isinstance(value, tuple):
        return tuple(cite_all(v) for v in value)
    return value
