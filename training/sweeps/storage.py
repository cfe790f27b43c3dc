"""Where a sweep's study lives, as a worker shows and opens it: a database URL shown without its password, and
the journal file checked, and a torn last line cut off, before anything is appended to it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

from files.reads import FileRefused, open_regular, size_text
from files.writes import open_nofollow

HIDDEN = "***"  # what SQLAlchemy's render_as_string(hide_password=True) shows instead of a password
# a password given as a query parameter (libpq's conninfo keywords; MySQL drivers' "passwd")
QUERY_PASSWORD = re.compile(r"(?i)([?&](?:password|passwd)=)[^&]*")


def masked_url(url: str) -> str:
    """``url`` with its password shown as ***, wherever it was given: ``user:PASSWORD@host`` and a ``password=``
    query parameter. Messages, logs and files name a --storage only through this: they end up in SLURM logs and CI
    output. Where the URL is malformed more is hidden, never less: the user part runs to the last '@' before the
    query (SQLAlchemy takes the first; a password with an unquoted '@' is hidden whole either way)."""
    scheme, rest, span = parts(url)
    if span:
        rest = f"{rest[: span[0]]}{HIDDEN}{rest[span[1] :]}"
    return f"{scheme}{QUERY_PASSWORD.sub(lambda m: m.group(1) + HIDDEN, rest)}"


def secrets_of(url: str) -> list[str]:
    """The password texts a URL holds, as given and percent-decoded (a driver's message may quote either)."""
    _, rest, span = parts(url)
    found = [rest[span[0] : span[1]]] if span else []
    found += [m.group(0).split("=", 1)[1] for m in QUERY_PASSWORD.finditer(rest)]
    return sorted({s for raw in found for s in (raw, unquote(raw)) if s}, key=len, reverse=True)


def parts(url: str) -> tuple[str, str, tuple[int, int] | None]:
    """(the scheme with its "://", or "" where there is none; the rest; where the user part's password is in the
    rest, or None): the user part runs to the last '@' before the query, its password from its first ':'."""
    scheme, sep, rest = url.partition("://")
    if not sep:  # not a URL (refused as such), but it may still hold user:password@host
        return "", url, password_span(url)
    return scheme + sep, rest, password_span(rest)


def password_span(rest: str) -> tuple[int, int] | None:
    at = rest.rfind("@", 0, rest.find("?") if "?" in rest else len(rest))
    return (rest.index(":") + 1, at) if at >= 0 and ":" in rest[:at] else None


def masked(text: str, url: str | None) -> str:
    """``text`` (a driver's or SQLAlchemy's error) with the URL masked and its password nowhere: an error may quote
    the URL, or the password alone."""
    if not url:
        return text
    text = text.replace(url, masked_url(url))
    for secret in secrets_of(url):
        text = text.replace(secret, HIDDEN)
    return text


# ------------------------------------------------------------------------------------------------- a database
# How long a worker waits, from the first refused connection, for a database that stopped answering mid-sweep (a
# restart, a failover) before it stops in one line: its trial keeps its checkpoints, and the same command goes on.
DATABASE_WAIT_SECONDS = 60
BACKOFF_SECONDS = (0.5, 5)  # the first wait between tries, doubled up to the second
GOES_ON = "the trials keep their checkpoints: the same command goes on once it is back"


def error_text(error: BaseException, url: str | None) -> str:
    """A driver's error in one line: its type and first line, the URL's password nowhere."""
    return masked(f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}", url)


class DatabaseLost(Exception):
    """A database that did not answer for sweep.py's --database-wait: one line naming it, its password masked."""


def wait_for_database(engine, url: str, seconds: float = DATABASE_WAIT_SECONDS) -> None:
    """Every new connection of `engine` (a SQLAlchemy engine made with pool_pre_ping, so a pooled connection the
    server dropped is replaced by a new one) tried again with backoff while the server refuses it, until `seconds`
    after the first refusal; then DatabaseLost. The time counts from the first refusal of
    any call, so a worker whose calls each wait in turn still stops within the bound."""
    from sqlalchemy import event

    down_since = []

    def connect(dialect, record, cargs, cparams):
        wait = BACKOFF_SECONDS[0]
        while True:
            try:
                connection = dialect.connect(*cargs, **cparams)
            except dialect.dbapi.OperationalError as error:  # the driver's: refused, shutting down, starting up
                down_since[:] = down_since or [time.monotonic()]
                left = seconds - (time.monotonic() - down_since[0])
                if left <= 0:
                    raise DatabaseLost(
                        f"--storage {masked_url(url)}: the database did not answer for {seconds:g} s "
                        f"({error_text(error, url)}); {GOES_ON}"
                    ) from None
                time.sleep(min(wait, left))
                wait = min(2 * wait, BACKOFF_SECONDS[1])
                continue
            down_since.clear()
            return connection

    event.listen(engine, "do_connect", connect)


# ---------------------------------------------------------------------------------------------- the journal file
# A journal is a line per operation on the study, a few hundred bytes each (a study's definition holds its config:
# kilobytes): a week of 8 workers' heartbeats is under 100 MB. Optuna replays the whole file into memory in every
# worker, so a larger one is not a sweep's, and is refused before it is read.
MAX_JOURNAL_BYTES = 1 << 30
MAX_JOURNAL_LINE = 64 << 20  # a config (16 MB at most) quoted as JSON text, with room to spare
LINE_START = b'{"op_code":'  # how Optuna writes every line (json.dumps of {"op_code": ..., "worker_id": ..., ...})
OPERATIONS = range(11)  # optuna.storages.journal._storage.JournalOperation's values
BACK = 1 << 16  # how far back at a time the last line end is looked for


class JournalRefused(ValueError):
    """A journal file that is not Optuna's, or not whole: one line, nothing appended to it."""


def check_journal(path: Path, lock) -> str | None:
    """The journal ready to be appended to, or JournalRefused. Optuna reads a line without its end as one being
    written, and appends the next operation right after it: the fused line is not JSON, and from then on every
    reading of the study fails. So a torn last line (a full disk, a power loss, a cut copy) is cut off here, under
    the journal's lock (every append holds it: no append is in progress), and said in the line returned: the one
    operation it held is lost (a trial it finished looks unfinished, and is taken up again from its checkpoint).
    Every whole line must be one of Optuna's operations: garbage, random bytes or someone else's JSON are refused,
    and nothing is cut or appended. `lock`: the journal's JournalFileOpenLock."""
    try:
        with open_regular(path, MAX_JOURNAL_BYTES, "sweep's journal"):
            pass
    except FileNotFoundError:
        return None
    except FileRefused as error:
        raise JournalRefused(str(error)) from None
    fd = open_nofollow(path, os.O_RDWR)
    try:
        with held(lock):
            size = os.fstat(fd).st_size
            start = after_last_line(fd, size)
            head = os.pread(fd, len(LINE_START), start)
        if start < size and not (LINE_START.startswith(head) or head == LINE_START):
            raise JournalRefused(
                f"{path}: ends in {size_text(size - start)} that are not a line of Optuna's journal (from byte "
                f"{start} on); {REFUSED}"
            )
        check_lines(path, start)  # without the lock: a long read would hold up every worker's appends
        if start == size:
            return None
        with held(lock):
            if os.fstat(fd).st_size != size:  # appended to meanwhile, by a worker that did not look first
                raise JournalRefused(f"{path}: changed while it was checked; run the command again")
            os.ftruncate(fd, start)
            os.fsync(fd)
    finally:
        os.close(fd)
    return (
        f"{path}: its last line was cut off ({size_text(size - start)} of an append that never ended: a full disk, "
        "a power loss or a cut copy); removed, and the operation it held is done again"
    )


@contextmanager
def held(lock):
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def after_last_line(fd: int, size: int) -> int:
    """Where the text after the file's last line end starts (`size` when it ends with one; 0 when it has none)."""
    end = size
    while end > 0:
        chunk = os.pread(fd, min(BACK, end), end - min(BACK, end))
        if b"\n" in chunk:
            return end - len(chunk) + chunk.rfind(b"\n") + 1
        end -= len(chunk)
    return 0


REFUSED = "not a sweep's study journal, or damaged: move it away to start the study again, or restore it from a copy"


def check_lines(path: Path, size: int) -> None:
    """Each of the first `size` bytes' lines one of Optuna's operations (a JSON object with a known op_code); read
    a line at a time, each held to MAX_JOURNAL_LINE. Lines appended after `size` (other workers') are theirs."""
    with open_regular(path, MAX_JOURNAL_BYTES, "sweep's journal") as f:
        for number in itertools.count(1):
            left = size - f.tell()
            if left <= 0:
                return
            line = f.readline(min(left, MAX_JOURNAL_LINE + 1))
            why = None
            if len(line) > MAX_JOURNAL_LINE:
                why = f"longer than the {size_text(MAX_JOURNAL_LINE)} a line may have"
            else:
                try:
                    log = json.loads(line)
                    operation = log.get("op_code") if type(log) is dict and "worker_id" in log else None
                    if type(operation) is not int or operation not in OPERATIONS:
                        why = "JSON, but not one of Optuna's operations"
                except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                    why = "not JSON"
            if why:
                raise JournalRefused(f"{path}: line {number} is {why}; {REFUSED}")
