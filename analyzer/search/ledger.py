"""The points ledger: which process measures which point, and what every finished point measured.

Processes sharing an Optuna study (one storage URL and study name, on one host or many) share a
companion study, "<study name>:points", whose trials are measured points rather than sampler
suggestions, so nothing in it reaches the sampler. A trial there carries the point's key, the
process that claimed it, and once finished the outcome the search needs, the full measurement and
the config it was measured on -- which is how every process, and `model-analyzer report`, sees
the results of all of them.

Claims: a process creates a trial that carries the point's key from its creation (one storage
call), waiting until its first heartbeat and running from then on; the point belongs to the
lowest-numbered running trial holding its key. A waiting claim numbered before one's own, or a
running trial with no key (made by a version that set the key after creating the trial), is
waited for up to UNKEYED_WAIT_S; a claim that took over half that to run is given up and made
again, and GIVE_UPS of those in a row end the run (the storage is too slow to share). Running
claims send heartbeats (Optuna's RDB heartbeat); the claim of a process that died is failed
after the grace period and the point can be claimed again. A point that failed for a real reason
(the config does not load) keeps its error and is not retried.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.engine import make_url

from analyzer.errors import AnalyzerError
from analyzer.search.base import Outcome, SearchPoint

HEARTBEAT_S = 5
GRACE_S = 20
UNKEYED_WAIT_S = 10.0  # a trial created before ours sets its key within this time or never
POLL_S = 0.5
GIVE_UPS = 3  # claims in a row given up as too slow to run: the storage is too slow to share

# Heartbeats are used here with ask/tell, which Optuna supports but warns about.
warnings.filterwarnings("ignore", category=ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")


class StudyStorageError(AnalyzerError):
    """The study storage cannot be opened; the message names the URL."""


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """An RDB storage with heartbeats; SQLite waits for its lock instead of failing at once."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs = {"connect_args": {"timeout": 60}}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs,
                                          heartbeat_interval=HEARTBEAT_S,
                                          grace_period=GRACE_S)  # fmt: skip
    except ImportError as exc:
        cause = exc.__cause__ or exc  # optuna's own message does not name the module
        raise StudyStorageError(
            f"--storage '{redact_url(url)}' needs a database driver that is not installed "
            f"({scrub(str(cause), url_secrets(url))}); install it, or name an installed driver "
            "in the URL (e.g. postgresql+psycopg2://)"
        ) from None
    except Exception as exc:  # sqlalchemy's errors: bad URL, unreachable server, bad password
        raise StudyStorageError(
            f"--storage '{redact_url(url)}' cannot be opened: "
            + scrub(str(exc).splitlines()[0], url_secrets(url))
        ) from None


_PASSWORD_PARAM = re.compile(r"(?i)\b(password|passwd|pwd)=([^&\s;'\"]*)")
_USERINFO = re.compile(r"^([^:/\s]+://[^:/@\s]*):([^/\s]*)@")  # to the authority's last @


def redact_url(url: str) -> str:
    """The URL as it may be shown or stored: no password, neither in the user part nor as a
    `password=` query (or libpq-style) parameter. Used for every console line, message and file."""
    match = _USERINFO.match(url)
    try:
        if match and "@" in match.group(2):
            raise ValueError("an unquoted @ in the password: SQLAlchemy would split it wrong")
        text = make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: redact by pattern
        text = _USERINFO.sub(r"\1:***@", url)
    return _PASSWORD_PARAM.sub(r"\1=***", text)


def url_secrets(url: str | None) -> list[str]:
    """The password strings a storage URL holds (raw and decoded), longest first: they are
    scrubbed from any text shown, such as a database driver's error that echoes them."""
    if not url:
        return []
    found: set[str] = set()
    for match in _PASSWORD_PARAM.finditer(url):
        found.add(match.group(2))
    userinfo = _USERINFO.match(url)
    if userinfo:
        found.add(userinfo.group(2))
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - the patterns above found what a loose URL holds
        parsed = None
    if parsed is not None:
        found.add(parsed.password or "")
        for key, value in parsed.query.items():
            if key.lower() in ("password", "passwd", "pwd"):
                found.update([value] if isinstance(value, str) else value)
    found |= {unquote(s) for s in found} | {quote(s, safe="") for s in found}
    found.discard("***")
    return sorted((s for s in found if s), key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret replaced by ***."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _dead_here(owner: str) -> bool:
    """The claim's process ran on this host and is gone (no need to wait for its heartbeat)."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not (pid.isascii() and pid.isdigit()):
        return False
    if int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def study_point_id(trial: SearchPoint) -> str:
    return f"{trial.params_json}|{trial.load}={trial.value}|batch={trial.batch_size}"


@dataclass
class Claim:
    state: str  # "mine": measure it; "done": finished (by anyone); "busy": another process has it
    trial: optuna.Trial | None = None  # ours, when mine
    done: FrozenTrial | None = None


@dataclass
class SharedPoint:
    """A finished point from the ledger, as the profiler and the report merge it."""

    trial: SearchPoint
    measurement: dict[str, Any]
    config: dict[str, Any]
    host: str


def unmerged(points: Iterable[SharedPoint], results: Mapping[str, Any]) -> Iterator[SharedPoint]:
    """The points that `results` (params_json -> a result with .measurements, or None) lack,
    each once."""
    have = {(key, m.load, m.value, m.batch_size) for key, r in results.items()
            if r is not None for m in r.measurements}  # fmt: skip
    for point in points:
        t = point.trial
        key = (t.params_json, t.load, t.value, t.batch_size)
        if key not in have:
            have.add(key)
            yield point


class Ledger:
    def __init__(self, storage: optuna.storages.RDBStorage, study_name: str) -> None:
        self.storage = storage
        self.owner = owner_id()
        self.study = optuna.create_study(
            storage=storage, study_name=f"{study_name}:points", direction="maximize",
            sampler=optuna.samplers.RandomSampler(), load_if_exists=True,
        )  # fmt: skip
        self._beating: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeats, daemon=True,
                                        name="ledger-heartbeat")  # fmt: skip
        self._thread.start()

    # ---- claims -------------------------------------------------------------------------------
    def claim(self, trial: SearchPoint, wait: bool) -> Claim:
        """Claim the point, or learn that it is done; with `wait`, a point another process is
        measuring is waited for (its result, or its claim going stale) instead of answered busy."""
        key = study_point_id(trial)
        slow: list[float] = []  # seconds each claim given up in a row took to create and run
        while True:
            optuna.storages.fail_stale_trials(self.study)
            state, done = self._look(key, None)
            if state == "free":
                started = time.monotonic()
                ours = self._create(key, trial)
                if ours is None:  # given up before it ran: look again, but not for ever
                    slow.append(time.monotonic() - started)
                    if len(slow) >= GIVE_UPS:
                        raise StudyStorageError(self._too_slow(slow))
                    continue
                state, done = self._look(key, ours.number)
                if state == "free":
                    return Claim("mine", trial=ours)
                self._drop(ours)
            if state == "done":
                return Claim("done", done=done)
            if not wait:
                return Claim("busy")
            time.sleep(POLL_S)

    def _create(self, key: str, trial: SearchPoint) -> optuna.Trial | None:
        """A claim trial that carries its key, point and owner from its creation (one storage
        call), and runs -- counts as a claim -- only once it has a heartbeat; None if it could
        not run in time and was given up.

        Created running, a process killed before its first heartbeat left a claim that Optuna
        never fails (only trials with a heartbeat go stale), and a process on another host
        waiting for that point waited forever. (Set after `ask()`, attribute by attribute, a
        kill left a trial with no key that every later claim waited UNKEYED_WAIT_S for, twice.)
        So it is created waiting; others wait UNKEYED_WAIT_S for a waiting claim numbered before
        theirs, then fail it. A claim that took over half that long to run gives itself up, so
        that no process goes on with a claim that another has already failed or overtaken."""
        started = time.monotonic()
        template = optuna.trial.create_trial(state=TrialState.WAITING, user_attrs={
            "point": key, "host": self.owner,
            "trial": [trial.params_json, trial.load, trial.value, trial.batch_size],
        })  # fmt: skip
        trial_id = self.storage.create_new_trial(self.study._study_id, template_trial=template)
        self._beat(trial_id)
        try:
            running = self.storage.set_trial_state_values(trial_id, state=TrialState.RUNNING)
        except optuna.exceptions.UpdateFinishedTrialError:
            running = False  # another process failed it as abandoned
        if not running:
            self._unbeat(trial_id)
            return None
        ours = optuna.Trial(self.study, trial_id)
        if time.monotonic() - started > UNKEYED_WAIT_S / 2:
            self._drop(ours)
            return None
        return ours

    def _too_slow(self, took: list[float]) -> str:
        url = getattr(self.storage, "url", "")
        return (
            f"--storage '{redact_url(url)}' took "
            + ", ".join(f"{s:.1f}" for s in took)
            + f" s to register {len(took)} claims in a row, over the {UNKEYED_WAIT_S / 2:g} s "
            "that processes sharing a study allow (they take over a claim that has not started "
            f"within {UNKEYED_WAIT_S:g} s); use a storage this host reaches faster or one less "
            "loaded"
        )

    def _look(self, key: str, number: int | None) -> tuple[str, FrozenTrial | None]:
        """free / done / busy for `key`, from the point of view of our trial `number` (None: we
        hold none yet, so any running claim is another's)."""
        deadline = time.monotonic() + UNKEYED_WAIT_S
        while True:
            trials = self.study.get_trials(deepcopy=False)
            pending: list[FrozenTrial] = []  # claims before ours that may yet run
            busy = False
            for t in trials:
                if t.number == number:
                    continue
                before = number is None or t.number < number
                if t.user_attrs.get("point") != key:
                    if t.state == TrialState.RUNNING and "point" not in t.user_attrs and before:
                        pending.append(t)  # a claim by an older version, its key not yet set
                    continue
                if t.state == TrialState.COMPLETE or (
                    t.state == TrialState.FAIL and "error" in t.user_attrs
                ):
                    return "done", t
                if t.state in (TrialState.WAITING, TrialState.RUNNING) and before:
                    if _dead_here(t.user_attrs.get("host", "")):
                        self._fail_stale(t)
                    elif t.state == TrialState.WAITING:
                        pending.append(t)
                    else:
                        busy = True
            if busy:
                return "busy", None
            if not pending:
                return "free", None
            if time.monotonic() > deadline:
                for t in pending:
                    if t.state == TrialState.WAITING:
                        self._fail_stale(t)  # its process died before its first heartbeat
                return "free", None
            time.sleep(0.05)

    def _fail_stale(self, t: FrozenTrial) -> None:
        try:
            self.storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # finished or failed meanwhile

    def finish(self, claim: Claim, outcome: Outcome) -> None:
        """Store what the measurement of our claimed point gave, for every process."""
        ours = claim.trial
        assert ours is not None
        try:
            if outcome.ok:
                ours.set_user_attr("outcome", {
                    "throughput": outcome.throughput,
                    "breaks_latency_limit": outcome.breaks_latency_limit,
                    "satisfies_constraints": outcome.satisfies_constraints,
                    "score": outcome.objective,
                    "constraints": outcome.constraints,
                })  # fmt: skip
                if outcome.measurement is not None:  # (a search without a profiler has none)
                    ours.set_user_attr("measurement", outcome.measurement)
                    ours.set_user_attr("config", outcome.config or {})
                self.study.tell(ours, outcome.throughput)
            else:
                ours.set_user_attr("error", outcome.error or "failed")
                self.study.tell(ours, state=TrialState.FAIL)
        finally:
            self._unbeat(ours._trial_id)

    def _drop(self, ours: optuna.Trial) -> None:
        self._unbeat(ours._trial_id)
        try:
            self.study.tell(ours, state=TrialState.PRUNED)  # a claim that lost the race
        except ValueError:
            pass  # already failed by another process as abandoned

    def release(self, claim: Claim) -> None:
        """Give a claim back unmeasured (the run is ending): another process may take it."""
        if claim.trial is not None:
            self._unbeat(claim.trial._trial_id)
            self.study.tell(claim.trial, state=TrialState.FAIL)

    # ---- reading ------------------------------------------------------------------------------
    def points(self) -> list[SharedPoint]:
        return read_points(self.study)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    # ---- heartbeats ---------------------------------------------------------------------------
    def _beat(self, trial_id: int) -> None:
        self.storage.record_heartbeat(trial_id)
        with self._lock:
            self._beating.add(trial_id)

    def _unbeat(self, trial_id: int) -> None:
        with self._lock:
            self._beating.discard(trial_id)

    def _heartbeats(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                ids = list(self._beating)
            for trial_id in ids:
                try:
                    self.storage.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001 - a missed beat only risks a stale claim
                    pass


def outcome_of(frozen: FrozenTrial) -> Outcome:
    """The Outcome a search is told for a point another process (or an earlier run) finished."""
    if frozen.state != TrialState.COMPLETE:
        return Outcome(ok=False, error=str(frozen.user_attrs.get("error", "failed")))
    o = frozen.user_attrs["outcome"]
    m = frozen.user_attrs.get("measurement")
    return Outcome(ok=True, throughput=o["throughput"],
                   breaks_latency_limit=o["breaks_latency_limit"],
                   satisfies_constraints=o["satisfies_constraints"], score=o["score"],
                   constraints=o["constraints"], metrics=m["metrics"] if m else {},
                   measurement=m)  # fmt: skip


def read_points(study: optuna.Study) -> list[SharedPoint]:
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        attrs = t.user_attrs
        if "measurement" not in attrs or "trial" not in attrs:
            continue
        params_json, load, value, batch = attrs["trial"]
        out.append(SharedPoint(SearchPoint(params_json, load, int(value), int(batch)),
                               attrs["measurement"], attrs.get("config", {}),
                               attrs.get("host", "")))  # fmt: skip
    return out


def load_points(url: str, study_name: str) -> list[SharedPoint]:
    """Every finished point of a shared study, for the report."""
    storage = open_storage(url)
    try:
        study = optuna.load_study(study_name=f"{study_name}:points", storage=storage)
    except KeyError:
        raise StudyStorageError(
            f"study '{study_name}' has no points in '{redact_url(url)}'"
        ) from None
    return read_points(study)
