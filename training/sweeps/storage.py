"""Where a sweep's study lives, as a worker shows and opens it: a database URL shown without its password."""

from __future__ import annotations

import re
from urllib.parse import unquote

HIDDEN = "***"  # what SQLAlchemy's render_as_string(hide_password=True) shows instead of a password
# a password given as a query parameter (libpq's conninfo keywords; MySQL drivers' "passwd")
QUERY_PASSWORD = re.compile(r"(?i)([?&](?:password|passwd)=)[^&]*")


def masked_url(url: str) -> str:
    """``url`` with its password shown as ***, wherever it was given: ``user:PASSWORD@host`` and a ``password=``
    query parameter. Messages, logs and files name a --storage only through this: they end up in SLURM logs and CI
    output. Where the URL is malformed more is hidden, never less: the user part runs to the last '@' before the
    query (SQLAlchemy takes the first; a password with an unquoted '@' is hidden whole either way)."""
    scheme, sep, rest = url.partition("://")
    if not sep:  # not a URL (refused as such), but it may still hold user:password@host
        scheme, rest = "", url
    path_start = rest.find("?") if "?" in rest else len(rest)
    at = rest.rfind("@", 0, path_start)
    if at >= 0 and ":" in rest[:at]:
        user = rest[: rest.index(":")]
        rest = f"{user}:{HIDDEN}{rest[at:]}"
    rest = QUERY_PASSWORD.sub(lambda m: m.group(1) + HIDDEN, rest)
    return f"{scheme}{sep}{rest}"


def secrets_of(url: str) -> list[str]:
    """The password texts a URL holds, as given and percent-decoded (a driver's message may quote either)."""
    scheme, sep, rest = url.partition("://")
    rest = rest if sep else url
    found = []
    at = rest.rfind("@", 0, rest.find("?") if "?" in rest else len(rest))
    if at >= 0 and ":" in rest[:at]:
        found.append(rest[rest.index(":") + 1 : at])
    found += [m.group(0).split("=", 1)[1] for m in QUERY_PASSWORD.finditer(rest)]
    return sorted({s for raw in found for s in (raw, unquote(raw)) if s}, key=len, reverse=True)


def masked(text: str, url: str | None) -> str:
    """``text`` (a driver's or SQLAlchemy's error) with the URL masked and its password nowhere: an error may quote
    the URL, or the password alone."""
    if not url:
        return text
    text = text.replace(url, masked_url(url))
    for secret in secrets_of(url):
        text = text.replace(secret, HIDDEN)
    return text
