"""What every entry point shares: logging, Prefect set-up, and one-line errors."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from core.errors import SkaldError


def setup_logging(verbose: bool = False) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)-7s %(name)s | %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "httpcore", "neo4j", "openai", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def configure_prefect(project_dir: Path) -> None:
    """Point Prefect's result storage at the project and forward our loggers to the UI.

    Must run before `prefect` is imported: Prefect reads these settings at import.
    """
    results = (project_dir / ".saga" / "prefect-results").resolve()
    results.mkdir(parents=True, exist_ok=True)
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(results)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "skald")
    # Prefect's own console handler prints flow/task logs; keep its level at INFO.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")


def one_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return f"invalid {exc.title} field {loc}: {first['msg']}"
    return " ".join(str(exc).split()) or type(exc).__name__


def run_main(main: Callable[[Sequence[str] | None], int], prog: str, argv: Sequence[str] | None = None) -> NoReturn:
    """Run `main`, turning known failures into one line on stderr and a non-zero exit."""
    try:
        code = main(argv)
    except SkaldError as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        code = exc.exit_code
    except ValidationError as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; finished steps are kept, run the same command again to resume", file=sys.stderr)
        code = 130
    sys.exit(code)
