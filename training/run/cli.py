"""What every command-line entry point shares: one `error:` line and exit status 2 for bad input (argparse's too),
how a command ends (``command``: Ctrl-C, a closed pipe, a platform JAX cannot start), and the logging set up from
logger_config.json.
"""

from __future__ import annotations

import argparse
import logging
import logging.config
import logging.handlers
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from files.reads import read_json
from files.writes import open_append
from signals import stops
from training.config.file import ConfigError, closest

INTERRUPTED = 128 + signal.SIGINT  # the shell's status for a command Ctrl-C ended
CLOSED_PIPE = 128 + signal.SIGPIPE  # the shell's status for a writer whose reader went away (`| head -1`)

# The project's own logging setup: beside train.py, whatever the working folder (a config's paths are the user's,
# relative to where the command runs; this one belongs to the code).
LOGGER_CONFIG = Path(__file__).resolve().parents[2] / "logger_config.json"


class EachLine(logging.Formatter):
    """A record of several lines (the loop logs the step lines of one read of the logs together) formatted as that
    many records would be: each line with the format's prefix and suffix, so train.log keeps one timestamped line per
    step. A traceback is formatted as usual."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if "\n" not in message or record.exc_info or record.stack_info:
            return super().format(record)
        around = super().format(logging.makeLogRecord({**record.__dict__, "msg": "\0", "args": None}))
        before, after = around.split("\0", 1)
        return "\n".join(before + line + after for line in message.split("\n"))


class _NoFollow:
    """A log file opened to append, never through a link planted at its name (files.open_append)."""

    def _open(self):
        return open_append(self.baseFilename, encoding=self.encoding, errors=self.errors)


class FileHandler(_NoFollow, logging.FileHandler):
    pass


class RotatingFileHandler(_NoFollow, logging.handlers.RotatingFileHandler):
    pass  # a rollover renames the files (a rename moves a link, it never writes through one), then opens anew


NOFOLLOW_HANDLERS = {
    "logging.FileHandler": f"{__name__}.FileHandler",
    "logging.handlers.RotatingFileHandler": f"{__name__}.RotatingFileHandler",
}


def log_files(config_path: str | Path = LOGGER_CONFIG) -> list[str]:
    """The names of the files the logging setup writes in a run folder (``train.log``)."""
    handlers = logger_config(config_path).get("handlers", {}).values()
    return [h["filename"] for h in handlers if "filename" in h]


def logger_config(config_path: str | Path) -> dict:
    """logger_config.json, held to the JSON bounds of every file the template reads (files/reads.py): one past
    them, or not JSON, is a ConfigError (one line, exit status 2), not a RecursionError."""
    try:
        return read_json(config_path, "logger config")
    except ValueError as error:
        raise ConfigError(str(error)) from None


def setup_logging(run_dir: Path | None, config_path: str | Path = LOGGER_CONFIG, verbose: bool = True) -> None:
    """Console + rotating file (`train.log` in the run folder) from logger_config.json. A link or a pipe planted
    at the log file's name raises files.UnsafeFile (an OSError)."""
    spec = logger_config(config_path)
    for handler in spec.get("handlers", {}).values():
        if "filename" in handler:
            handler["class"] = NOFOLLOW_HANDLERS.get(handler.get("class"), handler.get("class"))
            if run_dir is None:
                handler["class"], handler["filename"] = "logging.NullHandler", None
                handler.pop("filename"), handler.pop("maxBytes", None), handler.pop("backupCount", None)
                handler.pop("encoding", None)
            else:
                handler["filename"] = str(Path(run_dir) / handler["filename"])
    try:
        logging.config.dictConfig(spec)
    except ValueError as error:  # dictConfig wraps a handler's error: the file's own error is the one to report
        if isinstance(error.__cause__, OSError):
            raise error.__cause__ from None
        raise


class ArgumentParser(argparse.ArgumentParser):
    """argparse as the project's commands use it: no prefix matching (``--epoch 3`` is not ``--epochs 3``), and a bad
    flag or flag value is one `error:` line (exit status 2) like every other bad input, not a usage block."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        unknown = message.partition("unrecognized arguments: ")[2].split()
        hint = (
            closest(unknown[0].split("=")[0], [o for o in self._option_string_actions if o.startswith("--")])
            if unknown
            else ""
        )
        fail(f"{message}.{hint} See {self.prog} --help")


def add_run(parser: argparse.ArgumentParser, help: str, required: bool = False) -> None:
    """``--run RUN``, the run folder that test.py, sample.py and the export read. It has no ``-r``: that is train.py's
    resume, so ``-r`` or ``--resume`` here is refused with ``--run`` named instead of read as something else."""
    parser.add_argument("--run", required=required, metavar="RUN", help=help)
    parser.add_argument("-r", "--resume", action=_TrainOnly, nargs="?", help=argparse.SUPPRESS)


class _TrainOnly(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        raise argparse.ArgumentError(
            None,
            f"{option_string}: give the run folder as --run RUN (-r and --resume are train.py's, to resume training)",
        )


def command(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Runs an entry point's ``main`` and returns its exit status, ending the ways every command ends alike:
    Ctrl-C (KeyboardInterrupt) is one line and status 130, another stop signal raised as ``stops.Interrupted`` one
    line and 128 + its number; a closed pipe (``test.py ... | head -1``) ends quietly with
    141, the status a shell shows for a writer SIGPIPE ended; a ConfigError the command did not catch is one line
    and 2; so is an error raised because JAX cannot start the platform ``JAX_PLATFORMS`` names (``fail`` says
    that instead of what the command made of the error). Text the terminal's
    encoding cannot show (class names under an ASCII locale) is printed escaped, never an error. Standard output or
    error closed at the start (``>&-``) is one line and 2; standard output that cannot be written (``> /dev/full``)
    one line at the end and a nonzero status (``Output``)."""
    closed = closed_streams()
    if closed:
        print(f"error: {closed}", file=sys.stderr if sys.stderr is not None else sys.stdout)
        return 2
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    out = sys.stdout = Output(sys.stdout)
    try:
        status = ended(main, argv)
    except SystemExit as exit_info:  # fail() and argparse's --help: their status, unless the output was lost
        if out.error is None:
            raise
        status = exit_info.code if isinstance(exit_info.code, int) else 2
    finally:
        sys.stdout = out.stream
    if out.error is not None:
        reason = out.error.strerror or out.error
        print(f"error: cannot write to standard output ({reason}); what the command printed is lost", file=sys.stderr)
        return status or 1
    return status


def closed_streams() -> str | None:
    """What is wrong when the command was started with stdout or stderr closed (``>&-``, ``2>&-``), or None. Refused:
    the first file the command opened would take the closed descriptor's number, and what the command, JAX or XLA
    print there would land in that file (a checkpoint, a log)."""
    closed = [name for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)) if stream is None]
    if not closed:
        return None
    return f"{' and '.join(closed)} closed (>&-): give it a file or /dev/null (>/dev/null) instead"


class Output:
    """sys.stdout while ``command`` runs an entry point: a write that fails (a full disk, ``> /dev/full``) does not
    raise from whatever printed (a log handler would print a traceback for each line, a command would blame its own
    files): it is kept, the rest of the output is discarded, and the command ends with one line naming it and a
    nonzero status. A closed pipe still raises BrokenPipeError, which ends the command quietly."""

    def __init__(self, stream):
        self.stream, self.error = stream, None

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                raise
            except OSError as error:
                self.lost(error)
        return len(text)

    def flush(self) -> None:
        if self.error is None:
            try:
                self.stream.flush()
            except BrokenPipeError:
                raise
            except OSError as error:
                self.lost(error)

    def lost(self, error: OSError) -> None:
        self.error = error
        try:  # what is still buffered would fail again at exit: the descriptor now writes to /dev/null
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
        except (OSError, ValueError):  # no descriptor (a capture in a test): nothing is flushed at exit
            pass

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def ended(main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """``main(argv)``'s status, or the status of how it ended (see ``command``)."""
    try:
        try:
            return main(argv)
        finally:
            sys.stdout.flush()  # here, where a closed pipe is caught, not at exit (argparse's --help exits too)
    except KeyboardInterrupt:
        print(f"error: {stops.stop_line(signal.SIGINT)}", file=sys.stderr)
        return INTERRUPTED
    except stops.Interrupted as stop:  # a stop signal a safe point raised (signals.stops.safe_point)
        print(f"error: {stops.stop_line(stop.signum)}", file=sys.stderr)
        return 128 + stop.signum
    except BrokenPipeError:
        # what is still buffered cannot be written either: stdout goes to /dev/null so that the flush at exit does
        # not raise (and print) the same error again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED_PIPE
    except ConfigError as error:
        fail(str(error))
    except Exception:
        problem = platform_problem()
        if problem:
            fail(problem)
        raise


def platform_problem() -> str | None:
    """Why JAX cannot start the platform ``JAX_PLATFORMS`` names (a GPU asked for where there is none or its plugin
    is missing), or None. Asked only once something failed: JAX raises that from its first use, wherever it is."""
    wanted = os.environ.get("JAX_PLATFORMS", "").strip()
    if not set(wanted.lower().split(",")) - {"cpu", ""} or "jax" not in sys.modules:
        return None  # the CPU is always there; a JAX not imported yet has not failed to start anything
    import jax

    try:
        jax.devices()
    except Exception as error:  # JAX's own error: a RuntimeError, or an AssertionError without a message
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else "no such device or plugin"
        return (
            f"JAX_PLATFORMS={wanted}: JAX cannot start it here ({reason}); unset JAX_PLATFORMS to use what this "
            "machine has, or install that platform's JAX plugin"
        )
    return None


def fail(message: str, status: int = 2) -> None:
    # a platform JAX cannot start makes any first use of JAX fail, and a command's message would blame that use
    message = platform_problem() or message
    # one line whatever the message quotes: a newline or escape code from a file name or a value is shown escaped
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message))
    print(f"error: {text}", file=sys.stderr)
    raise SystemExit(status)
