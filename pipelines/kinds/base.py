"""The interface of a mechanism kind (``mechanism.kind``): one object per kind, every hook
with its default here.

Each kind module in this package ends with its kind object, ``KIND = Gaussian()``, an
instance of one of the three release shapes below (``pipelines.kinds.get`` returns it).
The spec loader, the schema, the plan, the ledger's zCDP record and the release wiring ask
that object, never the module: what a kind may do is what this class lists.

How a kind releases (``releases_from``; exactly one, each with its one required method):

- :class:`CountsKind` (gaussian, laplace, sample_and_threshold, weighted_sampling,
  weighted_gaussian): the shared wiring reads, bounds each user to C keys and sums the
  per-key user counts; the kind's :meth:`CountsKind.release` turns those counts into
  released rows.
- :class:`UsersKind` (adaptive): the shared wiring shuffles whole users (and draws C when
  it is automatic); :meth:`UsersKind.release_users` does the rest.
- :class:`StagesKind` (heavy_hitters, quantiles): :meth:`StagesKind.release_stages` builds
  every stage from the prepared records.

``parse`` and ``calibrate`` are required of every kind; a class lacking a required method
cannot be instantiated (``abc``), and tests/pipelines/kinds/test_kind_interface.py checks every kind
against this interface.

Import rule: this module imports no Beam, no ``transforms`` and no ``accounting`` at its
top (``thresher plan``, ``validate`` and ``schema`` load kinds without Beam); hooks that
need them import inside.
"""
import abc
import sys

# The plan's stage of the kind's release (``pipelines.planning.plan.RELEASE_STAGE``).
RELEASE_STAGE = "release"
# Defaults of the automatic bound (bounding.max_keys_per_user: auto) for a kind that sets
# none: the largest default candidate and the share of privacy.epsilon spent choosing C.
DEFAULT_AUTO_MAX_BOUND = 128
DEFAULT_AUTO_EPSILON_FRACTION = 0.1

COUNTS, USERS, RECORDS = "counts", "users", "records"
# The noise laws a kind names in PUBLIC_DOMAIN_NOISE and AGGREGATE_NOISE (the names
# ``accounting.known_domain`` and ``pipelines.specs.aggregates`` calibrate by); modules
# outside the kinds compare with these, never with a literal (a kind of the same name).
GAUSSIAN_NOISE, LAPLACE_NOISE = "gaussian", "laplace"


class Kind(abc.ABC):
    """One release mechanism kind. Subclass one of :class:`CountsKind`,
    :class:`UsersKind`, :class:`StagesKind`; set the class attributes and override the
    hooks the kind needs (the defaults below are what a kind that says nothing gets)."""

    # ---- what it is and what it reports ------------------------------------------------
    #: ``mechanism.kind``: the name of the kind's module in pipelines/kinds/.
    name = None
    #: {field name: declaration} of the ``mechanism`` section (``pipelines.common.declare``:
    #: a JSON Schema fragment checked before :meth:`parse`, or a description string alone,
    #: which accepts any value and leaves the check to :meth:`parse`).
    FIELDS = None
    #: Field names of FIELDS that must be given.
    REQUIRED = ()
    #: The frozen dataclass of the parsed section's fields read outside the kind module
    #: (:meth:`params`; ``pipelines.kinds._params``); None: the kind offers none yet.
    PARAMS = None
    #: ``input.keys`` may be left out (quantiles: one global release).
    KEYS_OPTIONAL = False
    #: {column: pyarrow type} the release writes beside the key columns.
    OUTPUT_COLUMNS = None
    #: The noise variants offered as ``mechanism.noise`` (gaussian: discrete_gaussian,
    #: correlated, auto); empty: the kind draws one noise and has no such field.
    NOISES = ()
    #: The V(C) score of the automatic bound (``accounting.contribution_bound.SCORE_MODELS``)
    #: when it is not the kind's name (adaptive scores as weighted_gaussian); see :meth:`score`.
    SCORE = None

    #: The confidence interval published beside the released value
    #: (``pipelines.dataio.intervals``): "noisy_count" (the ``count`` by its noise law,
    #: truncated at the threshold or over public keys), "count_stage" (the ``count`` of a
    #: count stage independent of the selection, noise ``count_sigma``),
    #: "sampled_estimate" (the ``estimate`` of a sampled count, binomial) or None.
    INTERVAL = None
    def interval_notes(self, mechanism):
        """{name: sentence} added to the report's description of the ``count`` interval
        (``intervals.columns.count``) of a thresholded release, from the parsed section
        (gaussian: its correlated noise's errors are correlated). Default none."""
        return {}

    #: The released value column (the report names it when it has no interval).
    VALUE_COLUMN = "count"
    #: Why the released value has no interval (INTERVAL None; in the report).
    NO_INTERVAL = "no interval derived"

    #: The noise law of the kind's release over ``input.public_keys`` (every listed key
    #: released, no threshold; paper 002 Sec. 4): "gaussian" or "laplace", the name
    #: ``accounting.known_domain`` calibrates and chooses a bound by (Thm 4.3 / Lemma 4.2);
    #: the kind then takes ``pipelines.dataio.public_keys.MECHANISM_FIELDS``. None: no such
    #: release.
    PUBLIC_DOMAIN_NOISE = None
    #: The kind reads ``input.public_keys`` itself (quantiles' public cells, checked by its
    #: :meth:`check_public_domain`), without PUBLIC_DOMAIN_NOISE's release.
    OWN_PUBLIC_KEYS = False
    #: The noise law of the ``aggregates`` sum columns calibrated jointly with the count
    #: (``pipelines.specs.aggregates``): "gaussian" (sum noise at the count's sigma ratio)
    #: or "laplace" (privacy.epsilon split evenly); None: the kind takes no aggregates.
    AGGREGATE_NOISE = None
    #: Output columns (of OUTPUT_COLUMNS) that may hold null: the Beam YAML transform
    #: declares them Optional in its row type (quantiles: a value where every cell was
    #: suppressed; weighted_sampling: token and estimate with ``report: keys``).
    NULLABLE_COLUMNS = ()
    #: The kind may be released continually (``continual``: distinct-user counts per key,
    #: tree-aggregated discrete Gaussian noise; ``pipelines.continual``), with no field of
    #: its own set.
    CONTINUAL = False
    #: The kind sanitizes an existing weighted sample given as ``input.sample`` (paper 001's
    #: post-processing use): :meth:`parse_sample` reads that section and
    #: :meth:`for_sample` the mechanism section for it.
    SAMPLE_INPUT = False
    #: Figures of the released rows the HTML report draws beside its own
    #: (``pipelines.reports.html_report.FIGURES``): "quantile_curves" (a ``rank``, ``value``
    #: curve per key).
    FIGURES = ()
    #: A note on how the kind's own stages compose inside its release stage, appended to
    #: the plan's accounting line (adaptive: its rounds and count by f-DP); None: none.
    COMPOSITION_NOTE = None

    # ---- bounds ------------------------------------------------------------------------
    #: The largest default candidate of ``max_keys_per_user: auto`` (bounding.auto.max_bound).
    AUTO_MAX_BOUND = DEFAULT_AUTO_MAX_BOUND
    #: The smallest default candidate (1: the whole sqrt(2) grid).
    AUTO_MIN_BOUND = 1
    #: The default share of privacy.epsilon spent choosing C (bounding.auto.epsilon).
    AUTO_EPSILON_FRACTION = DEFAULT_AUTO_EPSILON_FRACTION

    #: The largest bound C the kind's calibration is planned for (the planning limit,
    #: ``pipelines.common.limits``; the O(C) calibrations allow DEFAULT_MAX_KEYS there).
    MAX_KEYS = 100_000

    # ---- releases (report notes) -------------------------------------------------------
    #: The kind's pipeline computes report figures: ``release_stages`` is given a
    #: ``notes_sink``, the run stores the note under NOTES_FILE and the report goes
    #: through :meth:`apply_notes`.
    WRITES_NOTES = False
    NOTES_FILE = None
    #: ``release_stages`` takes ``spill_dir``, the in-process runner's shuffle spill
    #: folder (``pipelines.running.release``; heavy_hitters' adaptive rounds, issue 43).
    TAKES_SPILL_DIR = False

    # ---- calibrates (optional hooks: None when the kind has none) ----------------------
    #: ``verify_calibration(params, mech, *, epsilon, delta, max_keys_per_user, model)``:
    #: the cheap forward check of a cached calibration (``pipelines.common.calibration_cache``);
    #: True only if ``params`` meets the budget. None: the kind's calibrations are never
    #: cached (computed every time).
    verify_calibration = None
    #: ``check_key_types({key column: pyarrow type})``: refuse, from the input's schema
    #: before any row is read, key columns of a type the kind cannot release (raises
    #: SpecError naming ``input.keys[i]``). None: the input's schema is not read for it.
    check_key_types = None

    @property
    @abc.abstractmethod
    def releases_from(self):
        """COUNTS, USERS or RECORDS: which of the release wirings the kind uses (set by
        :class:`CountsKind`, :class:`UsersKind`, :class:`StagesKind`)."""

    @property
    def description(self):
        """One line for the schema: the first line of the kind module's docstring."""
        doc = sys.modules[type(self).__module__].__doc__ or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    # ---- reads -------------------------------------------------------------------------
    @abc.abstractmethod
    def parse(self, section):
        """The ``mechanism`` section (without ``kind``; the schema has checked FIELDS) ->
        the parsed fields (a dict): defaults filled, rules across fields checked (raises
        SpecError naming the field)."""

    def params(self, mechanism):
        """The parsed section ``mechanism`` (a dict: :meth:`parse`'s, as the spec holds
        it) as the kind's frozen PARAMS, its fields checked (TypeError naming the field).
        The dict stays the wire format; this is the typed view to read it by."""
        if self.PARAMS is None:
            raise TypeError(f"kind {self.name!r} declares no PARAMS")
        from thresher.pipelines.kinds._params import build  # heavy: start-up of thresher schema
        return build(self.PARAMS, mechanism)

    def check_spec(self, mechanism, input_spec, bounding, privacy):
        """Checks of the kind against the other sections, after :meth:`parse` (raises
        SpecError naming the field). May fill fields of ``mechanism`` the plan needs, and
        may return a replacement ``input_spec``; None keeps it."""
        return None

    def parse_sample(self, section):
        """``input.sample`` (SAMPLE_INPUT; the schema has checked its fields) -> the parsed
        sample {frequency, scheme, threshold} (raises SpecError naming the field)."""
        raise NotImplementedError(f"{self.name} takes no input.sample")

    def for_sample(self, mechanism, sample, bounding):
        """The parsed section for a release of the existing sample ``sample``
        (SAMPLE_INPUT): the sample's declared scheme replaces the kind's own sampling
        (raises SpecError naming the field)."""
        raise NotImplementedError(f"{self.name} takes no input.sample")

    def read_spec(self, spec):
        """The input as the release reads it (``pipelines.dataio.io.ReadRecords``): the
        spec's own ``input`` section unless the kind reads more columns (quantiles reads
        its value column like a key column)."""
        return spec.input

    # ---- bounds ------------------------------------------------------------------------
    def score(self, model):
        """The name of the automatic bound's V(C) score for ``bounding.model`` ``model``:
        SCORE, else the kind's name."""
        return self.SCORE or self.name

    def for_auto_bound(self, mechanism):
        """The parsed section used to calibrate the candidates of an automatic bound (every
        candidate is calibrated before the run: a kind may pick a cheaper default there, or
        refuse naming the field). Default: the section as is."""
        return mechanism

    @property
    def plain_l0_bound(self):
        """True when every user is bounded by the shared ``PerUserBound`` with no options,
        the one bounding that may drop a user's extra rows before the shuffle
        (``transforms.bounding.prereduce``) and score an automatic bound in the bounding pass
        (``transforms.bounding.scored_bound``). False unless a counts kind keeps the default
        :meth:`CountsKind.per_user_bound` and :meth:`CountsKind.bound_options`."""
        return False

    # ---- planning limits (pipelines.common.limits) -----------------------------------
    def check_limits(self, mechanism):
        """Refuse, from the parsed section alone (before the budget split), fields beyond
        the kind's planning limits (raises SpecError naming the field; the limits and their
        checks are ``pipelines.common.limits``'). Default: none."""
        return None

    def check_release_limits(self, spec, epsilon, delta, max_keys_per_user, field):
        """Refuse a release stage's (epsilon, delta) and the largest bound C =
        ``max_keys_per_user`` the plan calibrates (already within MAX_KEYS) that the kind
        cannot calibrate within its planning limits (raises SpecError naming the field;
        ``field`` is the spec field setting C). Default: none."""
        return None

    # ---- calibrates --------------------------------------------------------------------
    @abc.abstractmethod
    def calibrate(self, mech, *, epsilon, delta, max_keys_per_user, model):
        """The parsed section -> the calibrated parameters (a dict of plain values: the
        report's ``mechanism`` section and what the release reads) meeting (epsilon,
        delta) at bound C = ``max_keys_per_user`` in ``model`` (l0 or l1). Raises
        CalibrationError when the budget cannot be met, SpecError for a field that
        cannot apply."""

    def check_aggregates(self, mechanism):
        """Refuse, once ``aggregates`` are given (the kind's AGGREGATE_NOISE is set), a
        parsed section whose noise the joint calibration of the sum columns does not
        analyse (raises SpecError naming the field). Default: none."""
        return None

    def stage_budget(self, budget, mechanism, *, public_domain=False):
        """Record the kind's stages in the plan's ``accounting.budget.Budget`` (what is
        left after the bound and clip choices) and return the stage whose (epsilon,
        delta) :meth:`calibrate` receives. Default: one stage, ``release``, with the rest
        of the budget. ``public_domain``: the release is over ``input.public_keys``."""
        return budget.spend_rest(RELEASE_STAGE)

    def level_structure(self, mechanism):
        """(levels, contributions of one user per level per unit of C) of a kind built on
        several sample-and-threshold histograms (``pipelines.common.limits`` reads it);
        (1, 1) for one histogram."""
        return 1, 1

    def check_public_domain(self, mechanism, domain_size):
        """Refuse, once ``input.public_keys`` is loaded (its number of keys known), a spec
        whose release over it would exceed a planning limit (raises SpecError)."""
        return None

    def noise(self, mechanism):
        """The noise variant of a parsed or calibrated section (one of NOISES; None for a
        kind with one noise)."""
        if not self.NOISES:
            return None
        return mechanism.get("noise", self.NOISES[0])

    # ---- what the ledger charges -------------------------------------------------------
    def privacy_record(self, mechanism, stages, max_keys_per_user):
        """The kind's approximate-zCDP record, an ``accounting.zcdp.Record(rho, delta0)``,
        for the ledger's ``zcdp`` composition (``pipelines.ledgers.records``):
        ``mechanism`` is the calibrated section for ONE bound C = ``max_keys_per_user``
        (plain JSON values), ``stages`` the plan's stages the kind spends as ``(name,
        epsilon, delta)`` tuples. The record must bound the worst neighbour of the noise
        actually drawn (docs/accounting.md, "Approximate zCDP records"). Default: every
        stage charged from its (epsilon, delta) claim (``accounting.zcdp.stage_records``),
        sound for any kind."""
        from thresher.accounting import zcdp  # heavy: numpy
        return zcdp.stage_records(stages)

    # ---- report and plan words (pipelines.reports.summary, .plan_text) ---------------
    #: The plan's text may compute the release point (:meth:`release_probability` at
    #: growing counts) cheaply; False where that needs tables the plan does not build
    #: (weighted_sampling's release tables).
    CHEAP_RELEASE_POINT = True
    #: :meth:`value_lines` describes the released rows (the report reads them for it).
    DESCRIBES_ROWS = False

    def release_probability(self, report, counts):
        """P[a key with n users (after bounding) is released] for each n of ``counts``
        (an int64 array), from the report's calibrated ``mechanism`` alone (a float64
        array; the caller has left out public keys and automatic bounds). None: no such
        curve (the report then names no release point)."""
        return None

    def release_ceiling(self, report):
        """(M, p_M) when no count reaches release probability 1 (the table stops at M
        below saturation); None otherwise."""
        return None

    def bounded_data_words(self, held, key):
        """The sentence saying the released values are of the bounded data (``held``: what
        the bound did to a user; ``key``: the key's name); None: the counts' sentence."""
        return None

    def noise_words(self, report, key, unit):
        """(lines, unit): the sentences saying what noise or sampling each ``key``'s value
        got and which keys came out (``unit``: what a count counts), and the unit the
        release point is then stated in. Default: no sentence, the unit unchanged."""
        return [], unit

    def public_noise_words(self, mechanism):
        """The noise every key's count gets in a release over ``input.public_keys``
        (PUBLIC_DOMAIN_NOISE), from the calibrated section ("discrete Gaussian noise
        (sigma 3.1)"); None for a kind with no such release."""
        return None

    def expected_error_words(self, params):
        """The plan's line(s) on the expected absolute error of a released value from its
        noise alone (``params``: the calibrated section). Default none."""
        return []

    def value_lines(self, report, table, keys):
        """Lines about the released rows ``table`` themselves (DESCRIBES_ROWS; ``keys``:
        the key columns). Default none."""
        return []

    # ---- releases ----------------------------------------------------------------------
    def apply_notes(self, report, note):
        """The report with the figures the kind's pipeline wrote (WRITES_NOTES; ``note``
        is the parsed JSON line). Default: the report unchanged."""
        return report


class CountsKind(Kind):
    """A kind released from per-key user counts after the shared bounding (module
    docstring)."""
    releases_from = COUNTS

    @abc.abstractmethod
    def release(self, counts, params, key_columns, rng_factory=None):
        """PCollection[Table(key columns, count)] of bounded per-key user counts ->
        PCollection[Table(key columns, OUTPUT_COLUMNS)] of released rows. ``params``: the
        calibrated dict, or a side input of it after an automatic bound; ``rng_factory``:
        the release's draws (``keyed_random.KeyedDraws``), from which each stage that
        draws takes its own child (``keyed_random.child(rng_factory, label)``)."""

    def per_user_bound(self):
        """The PTransform class bounding each user to C keys in the l0 model, called as
        ``cls(keys, bound, rng_factory=draws.child(...), **bound_options(mechanism))``. Default
        ``transforms.bounding.per_user_bound.PerUserBound`` (imported here: Beam)."""
        from thresher.transforms.bounding.per_user_bound import PerUserBound  # heavy: apache_beam
        return PerUserBound

    def bound_options(self, mechanism):
        """Keyword arguments of :meth:`per_user_bound` beyond the bound (default none)."""
        return {}

    @property
    def plain_l0_bound(self):
        cls = type(self)
        return (cls.per_user_bound is CountsKind.per_user_bound
                and cls.bound_options is CountsKind.bound_options)


class UsersKind(Kind):
    """A kind released from whole-user shards (module docstring)."""
    releases_from = USERS

    @abc.abstractmethod
    def release_users(self, users, params, max_keys_per_user, key_columns, num_shards,
                      mechanism, rng_factory=None, spill_dir=None):
        """PCollection of whole-user tables (``transforms.bounding.user_shards.ShardByUser``) ->
        released rows. ``max_keys_per_user``: the bound (an int, or a side input after an
        automatic bound); ``params``: the calibrated dict (or side input); ``mechanism``:
        the parsed section; ``spill_dir``: the per-key shuffles' spill folder;
        ``rng_factory``: the release's draws (as for ``CountsKind.release``)."""


class StagesKind(Kind):
    """A kind that builds its own stages from the prepared records (module docstring)."""
    releases_from = RECORDS

    @abc.abstractmethod
    def release_stages(self, records, plan, num_shards, rng_factory=None, notes_sink=None):
        """PCollection of prepared record tables (``pipelines.dataio.io.prepare_batch``)
        -> released rows. ``notes_sink`` is passed only to a kind that WRITES_NOTES;
        ``rng_factory``: the release's draws (as for ``CountsKind.release``).
        Every consumer holding all of a user's rows takes :func:`whole_user_limit`."""


def whole_user_setting(kind):
    """(spec field, remedy) that a stages kind's user shuffle names when a user has more
    than ``transforms.bounding.user_shards.MAX_USER_ROWS`` rows (issue 34)."""
    return ("mechanism.kind", f"{kind} bounds a user where all of its rows meet "
            "(no bounding before the shuffle); leave such users out of the input, or "
            "cap each user's rows before the release")


def whole_user_limit(plan):
    """``ShardByUser``'s keyword arguments for a kind whose consumers hold all of a user's
    rows (a :class:`StagesKind`): refuse a user above ``MAX_USER_ROWS``, naming
    :func:`whole_user_setting`."""
    from thresher.transforms.bounding.user_shards import MAX_USER_ROWS  # heavy: apache_beam
    return {"max_user_rows": MAX_USER_ROWS, "setting": whole_user_setting(plan.spec.kind)}
