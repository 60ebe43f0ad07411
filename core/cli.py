"""What every entry point shares: logging, Prefect set-up, the settings options, and one-line
errors. Command lines are parsed with the standard library's argparse (no extra dependency)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from core.children import stop_prefect_temporary_server
from core.errors import SkaldError, disk_full, disk_full_line, first_error
from core.interrupt import end_by_signal_at_exit, tell_threads_on_sigint


def add_settings_options(parser: argparse.ArgumentParser) -> None:
    """The options every project command takes after its own: --config and -v."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML settings file (default <project-dir>/skald.toml)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def setup_logging(verbose: bool = False) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)-7s %(name)s | %(message)s", datefmt="%H:%M:%S"
    )
    for noisy in (
        "httpx",
        "httpx2",
        "httpcore",
        "httpcore2",
        "neo4j",
        "openai",
        "urllib3",
        "asyncio",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def configure_prefect(project_dir: Path) -> None:
    """Environment defaults for Prefect in processes that have not imported it yet."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "skald")
    # Local-first: no usage telemetry (it also logs an error on offline machines).
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def prefect_results_dir(project_dir: Path) -> Path:
    """Where a project's task results (the resume cache) are persisted.

    Flows pass it as `result_storage` to their sub-flows: Prefect fixes a flow's result
    store when the flow starts, and tasks inherit it, so setting it from inside a running
    flow (or via the environment after import) would not apply.
    """
    path = (project_dir / ".saga" / "prefect-results").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def project_prefect_settings(project_dir: Path) -> Iterator[None]:
    """Default result storage for flows *started* inside this block (wrap the flow call)."""
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    with temporary_settings(
        updates={PREFECT_LOCAL_STORAGE_PATH: str(prefect_results_dir(project_dir))}
    ):
        yield


class _DropKnownTracebacks(logging.Filter):
    """Our own errors already say what happened and what to do: log them without a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, SkaldError):
            record.exc_info = None
            record.exc_text = None
        return True


_drop_known_tracebacks = _DropKnownTracebacks()


def quiet_known_failures() -> None:
    """Attach the traceback filter to every handler Prefect has configured."""
    names = ["prefect", *(n for n in logging.root.manager.loggerDict if n.startswith("prefect"))]
    for name in names:
        for handler in logging.getLogger(name).handlers:
            if _drop_known_tracebacks not in handler.filters:
                handler.addFilter(_drop_known_tracebacks)


def one_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        loc, message = first_error(exc, "")
        return f"invalid {exc.title} field {loc}: {message}"
    return " ".join(str(exc).split()) or type(exc).__name__


def _before_the_last_line() -> None:
    """The line that says what happened and what to do stays the terminal's last: Prefect's
    own shutdown messages are silenced and its temporary API server is stopped before it."""
    logging.getLogger("prefect").setLevel(logging.WARNING)
    stop_prefect_temporary_server()


def run_main(
    main: Callable[[Sequence[str] | None], int], prog: str, argv: Sequence[str] | None = None
) -> NoReturn:
    """Run `main`, turning known failures into one line on stderr and a non-zero exit."""
    quiet_known_failures()
    restore_sigint = tell_threads_on_sigint()
    try:
        code = main(argv)
    except SkaldError as exc:
        _before_the_last_line()
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        code = exc.exit_code
    except ValidationError as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        _before_the_last_line()
        print(
            f"{prog}: interrupted; finished steps are kept, run the same command again to resume",
            file=sys.stderr,
        )
        # 130 to whoever catches the SystemExit; the process itself ends by SIGINT, so that a
        # shell script running this command stops too (core.interrupt).
        end_by_signal_at_exit(signal.SIGINT)
        code = 130
    except Exception as exc:
        full = disk_full(exc)
        if full is None:
            raise
        _before_the_last_line()
        print(f"{prog}: error: {disk_full_line(full)}", file=sys.stderr)
        code = 1
    finally:
        restore_sigint()
    sys.exit(code)
