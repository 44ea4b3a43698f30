"""``input.sample`` (weighted_sampling's post-processing path): its fields, declared for
``pipelines.schema`` apart from the kind's module, so that reading a spec of another kind
loads neither Beam nor scipy for it. ``SCHEMES`` is ``accounting.pws.SAMPLING_SCHEMES``
(a test checks they agree)."""
from thresher.pipelines.common import declare

SCHEMES = ("none", "ppswor", "priority")

# input.sample of a spec whose input is an existing non-private sample (post-processing).
SAMPLE_FIELDS = {
    "frequency": declare.string(description="the column holding each sampled key's frequency "
                                            "(an integer >= 1)"),
    "scheme": declare.choice(SCHEMES, description=(
        "how the sample was drawn: none (every key), ppswor or priority")),
    "threshold": declare.number(low=0, low_open=True, description=(
        "the sampling threshold t the sample was drawn with (ppswor and priority)")),
}

