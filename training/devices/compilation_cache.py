"""JAX's persistent compilation cache: the machine's, never a run's.

An entry is a compiled program, machine code, and JAX runs whatever the file under a program's key holds: whoever can
write the folder chooses what a later run executes. So the folder comes from the environment alone (JAX's own
``JAX_COMPILATION_CACHE_DIR``, else DEFAULT; ``JAX_ENABLE_COMPILATION_CACHE=false`` for none), never from a config,
which a run folder hands on with itself. And it is used only where it is as safe as SSH asks ``~/.ssh`` to be: it and
every folder above it owned by this user or root and writable by no one else (a sticky folder such as /tmp above it
excepted), holding only regular files of this user's, each within MAX_ENTRY_BYTES (JAX reads an entry whole: a FIFO
would block that read forever, a link to /dev/zero fill the memory). Otherwise the cache is off for the run, with one
warning that says why.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("train")

DEFAULT = "~/.cache/jax-training-template/compiled"
WHERE = f"$JAX_COMPILATION_CACHE_DIR, else {DEFAULT}; JAX_ENABLE_COMPILATION_CACHE=false for none"
# The largest compiled program kept is tens of MB (a GPT-2 step on a GPU); an entry past this is not one of JAX's.
MAX_ENTRY_BYTES = 2**30


def use() -> Path | None:
    """Turns the cache on in the machine's folder, made if missing, and returns it; None where it is off (switched
    off, or a folder that is not safe or not writable: one warning). Before the process's first compilation: JAX
    reads the setting once. Every program is kept, however quick to compile (a run compiles a few; their sum is the
    start-up). An entry of another JAX, XLA, device or program is never read (each is keyed by all of them), so stale
    entries cost only disk space (remove the folder to reclaim it)."""
    import jax  # here: the config's check names WHERE without loading JAX

    jax.config.update("jax_compilation_cache_dir", None)
    if not jax.config.jax_enable_compilation_cache:
        return None
    path = Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT).expanduser()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = unsafe(path.resolve())
    except OSError as error:
        problem = error.strerror or str(error)
    if problem:
        log.warning(f"compilation cache off: {path}: {problem}")
        return None
    if not _LISTENING:
        jax.monitoring.register_event_listener(_heard)  # once: which compilations the cache answered (``origin``)
        _LISTENING.append(_heard)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: any size (0 asks for a minimum)
    return path


_LISTENING: list = []  # the listener, once registered with JAX (a process-wide registration)
_seen = threading.local()  # what this thread's compilation asked of the cache and got: JAX records it there


def _heard(event: str, **_) -> None:
    if event == "/jax/compilation_cache/compile_requests_use_cache":
        _seen.asked = True
    elif event == "/jax/compilation_cache/cache_hits":
        _seen.hit = True


def origin(compile_fn: Callable):
    """``compile_fn()`` (one compilation, in this thread) and where its program came from, as the log says it:
    " (from the compilation cache)", " (compiled; kept in the compilation cache)", or "" with the cache off."""
    _seen.asked = _seen.hit = False
    result = compile_fn()
    if _seen.hit:
        return result, " (from the compilation cache)"
    return result, " (compiled; kept in the compilation cache)" if _seen.asked else ""


def folder() -> Path | None:
    """The folder in use, or None."""
    import jax

    return Path(jax.config.jax_compilation_cache_dir) if jax.config.jax_compilation_cache_dir else None


def unsafe(cache: Path) -> str | None:
    """Why the `cache` folder (resolved: no links left in it) cannot be trusted with programs to run, or None."""
    me = os.getuid()
    for place in (cache, *cache.parents):
        info = os.stat(place)
        if info.st_uid not in (me, 0):
            return f"{place} belongs to another user (uid {info.st_uid}), who could plant programs in it"
        sticky = info.st_mode & stat.S_ISVTX and place != cache  # others may add files there, not replace ours
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky:
            return f"{place} is writable by others (mode {stat.filemode(info.st_mode)}), who could plant programs in it"
    if not os.access(cache, os.W_OK | os.X_OK):
        return "not writable"  # JAX would warn at every compilation, and compile every program anyway
    odd = []
    with os.scandir(cache) as entries:
        for entry in entries:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                odd.append(f"{entry.name} is a {kind_of(info.st_mode)}")
            elif info.st_uid != me:
                odd.append(f"{entry.name} belongs to another user (uid {info.st_uid})")
            elif info.st_size > MAX_ENTRY_BYTES:
                odd.append(f"{entry.name} holds {info.st_size} bytes, past {MAX_ENTRY_BYTES}")
    if odd:
        return f"{len(odd)} entr{'y' if len(odd) == 1 else 'ies'} JAX never writes ({odd[0]}): remove them"
    return None


def kind_of(mode: int) -> str:
    kinds = {stat.S_ISLNK: "link", stat.S_ISFIFO: "FIFO", stat.S_ISDIR: "folder", stat.S_ISSOCK: "socket"}
    return next((name for test, name in kinds.items() if test(mode)), "device")
