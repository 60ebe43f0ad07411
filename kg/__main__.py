"""`python -m kg`: maintain the story graph of a project.

Every command reads the same settings as the flows (`--project-dir`, `--config`, env,
`.env`, `skald.toml`): NEO4J_URI selects a Neo4j server, otherwise the project's embedded
ArcadeDB is used (started on demand, or the one another process already runs).

`serve` runs that embedded ArcadeDB in the foreground as a process of its own, so that it
outlives the processes that use it (the workers and flow runs of a regression batch): an
embedded graph otherwise lives inside the first process that opened it and goes with it.

Kept by hand on purpose: the command line is argparse (the standard library's parser, which
every Skald CLI uses, with core.cli's one-line errors), and `stats` prints its two aligned
columns with format specs: a table library would change the output the README shows.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

from core.cli import run_main, setup_logging
from core.errors import InvalidInputError
from core.graph_server import GraphEndpoint, serve_embedded
from core.project_lock import project_writer
from core.settings import Settings, load_settings, require_project, require_project_dir
from kg.codex import CODEX_FILE, CodexPage, build_dialogue_codex, build_novel_codex, write_codex
from kg.facts import entity_facts, format_facts
from kg.store import GraphStore
from kg.transfer import write_export
from kg.vault import VAULT_DIR, vault_notes, write_vault


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # Accepted before or after the command; SUPPRESS keeps a sub-command default from
    # overwriting a value given before the command.
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--project-dir",
        type=Path,
        default=Path(".") if top else argparse.SUPPRESS,
        help="project directory (default: the current directory)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=default,
        help="TOML settings file (default <project-dir>/skald.toml)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="debug logging",
    )


def _as_of(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--as-of-chapter",
        type=int,
        default=None,
        metavar="N",
        help="the world as of chapter N (default: the latest chapter; 0: the story bible); "
        "without --out it goes beside the project's own, named by N (codex-chapter-00N.html, "
        "vault-chapter-00N/)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kg",
        description="Maintain the project's knowledge graph: schema, statistics, export/import, the facts about an "
        "entity with their evidence, the codex page of the world, an Obsidian vault of it, chapter rollback.",
    )
    _common(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _graph_data_commands(commands)
    _codex_command(commands)
    _vault_command(commands)
    _serve_command(commands)
    _rollback_command(commands)
    return parser


def _graph_data_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """migrate, stats, export, import, facts: the schema and the graph's data."""
    sub = commands.add_parser("migrate", help="apply pending schema migrations (idempotent)")
    _common(sub, top=False)

    sub = commands.add_parser(
        "stats", help="node counts per label and relationship counts per type"
    )
    _common(sub, top=False)
    sub.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sub = commands.add_parser(
        "export", help="write every node and relationship as deterministic JSON"
    )
    _common(sub, top=False)
    sub.add_argument("--out", type=Path, required=True, help="output file")

    sub = commands.add_parser(
        "import", help="load an export file (into an empty graph unless --merge)"
    )
    _common(sub, top=False)
    sub.add_argument("file", type=Path, help="a file written by `python -m kg export`")
    sub.add_argument(
        "--merge", action="store_true", help="merge nodes by id into a non-empty graph"
    )

    sub = commands.add_parser(
        "facts", help="every fact about an entity, with its chapter, scene and quote"
    )
    _common(sub, top=False)
    sub.add_argument("--entity", required=True, help="the entity's name or one of its aliases")
    sub.add_argument("--json", action="store_true", help="print JSON instead of text")


def _codex_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """codex: the world (or a sidecar conversation) as one HTML page."""
    sub = commands.add_parser(
        "codex",
        help="write the world as one HTML page: cards, the relationship graph, the timeline, quality",
        description="Write the codex: one self-contained HTML file (opens from disk, no network) with every "
        "character, place and item, the relationships as an interactive graph, a timeline of the chapters, each "
        "fact's evidence, the chapter quality chart and the latest QA findings. With --conversation-id, the same "
        "page for a sidecar conversation: its entities, relations with their event history, milestones.",
    )
    _common(sub, top=False)
    _as_of(sub)
    sub.add_argument(
        "--conversation-id",
        default=None,
        metavar="ID",
        help="a sidecar conversation's codex instead of the book's",
    )
    sub.add_argument(
        "--out",
        type=Path,
        default=None,
        help="file to write (default: <project-dir>/exports/codex.html, or "
        "exports/codex-<conversation>.html)",
    )


def _vault_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """vault: the world as an Obsidian vault."""
    sub = commands.add_parser(
        "vault",
        help="write the world as an Obsidian vault: a note per character, place, chapter and scene",
        description="Write the world as an Obsidian vault: one Markdown note per character, place, item and other "
        "entry, per chapter and per scene, with YAML front matter (type, status, first chapter, aliases), a "
        "[[link]] for every relationship with its chapter range, and every fact with its quote and chapter. A "
        "later export rewrites only the notes Skald wrote and nobody changed since (their SHA-256 is kept in "
        "<vault>/.skald/written.json); notes you edited or added are left alone, and a Skald note whose entry "
        "left the world is removed only while unchanged.",
    )
    _common(sub, top=False)
    _as_of(sub)
    sub.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the vault folder (default: <project-dir>/exports/vault); may be an existing vault",
    )


def _serve_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """serve: the embedded graph as a process of its own."""
    sub = commands.add_parser(
        "serve",
        help="run the project's embedded graph in the foreground, for many processes, until Ctrl-C/SIGTERM",
        description="Run the project's embedded ArcadeDB (Bolt) as a process of its own until Ctrl-C or SIGTERM, "
        "so that it outlives the processes using it. Processes given the same --project-dir find it by "
        "themselves (.saga/graph/server.json); others take the NEO4J_* settings from .saga/graph/neo4j.env.",
    )
    _common(sub, top=False)
    sub.add_argument(
        "--bolt-port", type=int, default=None, help="Bolt port on 127.0.0.1 (default: a free one)"
    )
    sub.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="ArcadeDB Studio/HTTP port (default: a free one)",
    )


def _rollback_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """rollback: the graph as it was before a chapter's commit."""
    sub = commands.add_parser(
        "rollback", help="restore the exact graph state from before a chapter's commit"
    )
    _common(sub, top=False)
    sub.add_argument(
        "--chapter",
        type=int,
        required=True,
        help="chapter number; story-bible syncs are -1, -2, ... (see `stats`)",
    )
    sub.add_argument(
        "--cascade",
        action="store_true",
        help="also roll back chapters committed after it (newest first)",
    )


def _print_stats(store: GraphStore, as_json: bool) -> None:
    stats = store.stats()
    if as_json:
        print(json.dumps(stats.model_dump(), indent=1, sort_keys=True))
        return
    print(f"graph: {store.endpoint.label} (schema version {stats.schema_version})")
    print(f"nodes: {stats.nodes}")
    for label, count in stats.labels.items():
        print(f"  {label:<20} {count:>8}")
    print(f"relationships: {stats.relationships}")
    for rel_type, count in stats.relationship_types.items():
        print(f"  {rel_type:<20} {count:>8}")
    chapters = ", ".join(str(c) for c in stats.committed_chapters) or "none"
    print(f"committed chapters: {chapters}")


def _check_book_args(args: argparse.Namespace) -> None:
    """Refuse a codex or vault request for a chapter before the first (main has refused a
    project directory that does not exist)."""
    if args.as_of_chapter is not None and args.as_of_chapter < 0:
        raise InvalidInputError(f"--as-of-chapter must be 0 or more (got {args.as_of_chapter})")


def _check_codex_args(args: argparse.Namespace) -> None:
    """Refuse a bad codex request before the graph is opened."""
    _check_book_args(args)
    if args.conversation_id is not None:
        if args.as_of_chapter is not None:
            raise InvalidInputError(
                "--as-of-chapter is for a book; a conversation's codex shows all its turns"
            )
        if not args.conversation_id.strip():
            raise InvalidInputError("--conversation-id must not be empty")
    if args.out is not None and args.out.is_dir():
        raise InvalidInputError(
            f"--out {args.out} is a directory", hint="give the file to write, e.g. codex.html"
        )


def _check_vault_args(args: argparse.Namespace) -> None:
    """Refuse a bad vault request before the graph is opened."""
    _check_book_args(args)
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise InvalidInputError(f"--out {args.out} is a file", hint="give the vault's folder")


def _novel_page(store: GraphStore, settings: Settings, as_of: int | None) -> CodexPage:
    page = build_novel_codex(
        store, settings.saga_dir, as_of, project_name=settings.project_dir.name
    )
    if not page.stats.entities and not page.stats.chapters:
        raise InvalidInputError(
            f"the graph of {settings.project_dir} holds no story yet",
            hint="write a chapter first: python -m flows.novel --project-dir ...",
        )
    return page


def _as_of_words(page: CodexPage) -> str:
    return "the story bible" if page.as_of == 0 else f"chapter {page.as_of}"


def _as_of_default(settings: Settings, current: Path, page: CodexPage, asked: int | None) -> Path:
    """Where a view goes without --out: the project's own file (which every run keeps at the
    latest chapter), or, for a view as of a chapter asked for, one beside it named by that
    chapter (`codex-chapter-002.html`), so asking for the past never replaces the present."""
    if asked is None:
        return settings.project_dir / current
    return settings.project_dir / current.with_name(
        f"{current.stem}-chapter-{page.as_of:03d}{current.suffix}"
    )


def _vault(store: GraphStore, settings: Settings, args: argparse.Namespace) -> None:
    page = _novel_page(store, settings, args.as_of_chapter)
    out = args.out or _as_of_default(settings, VAULT_DIR, page, args.as_of_chapter)
    try:
        report = write_vault(vault_notes(page), out)
    except OSError as exc:
        raise InvalidInputError(f"cannot write the vault in {out}: {exc.strerror or exc}") from None
    print(
        f"vault of {page.title!r} as of {_as_of_words(page)} in {out}: {report.notes} notes, {report.links} links; "
        f"{len(report.written)} written, {len(report.unchanged)} unchanged, {len(report.kept)} kept as yours, "
        f"{len(report.removed)} stale removed, {len(report.released)} stale left as yours"
    )
    for rel in report.kept:
        print(f"  kept (you changed it): {rel}")
    for rel in report.released:
        print(f"  no longer in the world, kept (you changed it): {rel}")


def _codex(store: GraphStore, settings: Settings, args: argparse.Namespace) -> None:
    if args.conversation_id is not None:
        page = build_dialogue_codex(store, args.conversation_id)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.conversation_id).strip("-.") or "conversation"
        default = settings.project_dir / "exports" / f"codex-{slug}.html"
        what = f"{page.title}: {page.stats.chapters} committed turns"
    else:
        page = _novel_page(store, settings, args.as_of_chapter)
        default = _as_of_default(settings, CODEX_FILE, page, args.as_of_chapter)
        what = f"{page.title!r} as of {_as_of_words(page)}"
    out = args.out if args.out is not None else default
    try:
        write_codex(page, out)
    except OSError as exc:
        raise InvalidInputError(f"cannot write --out {out}: {exc.strerror or exc}") from None
    size = out.stat().st_size
    print(
        f"codex of {what} ({page.stats.entities} entities, {page.stats.relationships} relationships) "
        f"written to {out} ({size / 1024:.0f} KiB)"
    )


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    for name in ("bolt_port", "http_port"):
        port = getattr(args, name)
        if port is not None and not 0 < port < 65536:
            raise InvalidInputError(
                f"--{name.replace('_', '-')} must be a port number 1-65535 (got {port})"
            )

    def ready(endpoint: GraphEndpoint, env_file: Path) -> None:
        # The schema is migrated once here, not raced by the first clients.
        with GraphStore(endpoint) as store:
            store.migrate()
        print(
            f"graph: serving {endpoint.label} for {settings.project_dir} (stop with Ctrl-C or SIGTERM)"
        )
        print(
            f"clients with --project-dir {settings.project_dir} find it by themselves; any other: "
            f"set -a; . {env_file}; set +a"
        )
        print(
            f"NEO4J_URI={endpoint.uri} NEO4J_USERNAME={endpoint.username} NEO4J_DATABASE={endpoint.database} "
            f"(NEO4J_PASSWORD in {env_file})",
            flush=True,
        )

    serve_embedded(settings, bolt_port=args.bolt_port, http_port=args.http_port, ready=ready)
    print("graph: stopped", flush=True)
    # The database is closed. The JVM's own exit would wait for the Bolt threads of clients
    # still connected (workers between runs), so the process leaves now.
    logging.shutdown()
    os._exit(0)


#: Commands that may be the first to touch a project (its graph is created then): the rest read
#: or change what it holds, and a missing project directory is an error for them.
_MAY_START_A_PROJECT = frozenset({"migrate", "import", "serve"})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if args.command not in _MAY_START_A_PROJECT:
        require_project_dir(args.project_dir)
    if args.command == "import" and not args.file.is_file():
        raise InvalidInputError(f"import file {args.file} does not exist")
    if args.command == "codex":
        _check_codex_args(args)
    if args.command == "vault":
        _check_vault_args(args)
    settings = load_settings(args.project_dir, args.config)
    if args.command not in _MAY_START_A_PROJECT:
        require_project(settings)
    if args.command == "serve":
        return _serve(settings, args)
    # A migration, import or rollback while a run writes the book would change the graph under
    # it: these refuse while another process holds the project (core.project_lock).
    writes = args.command in ("migrate", "import", "rollback")
    with (
        project_writer(settings.project_dir, f"python -m kg {args.command}")
        if writes
        else nullcontext()
    ):
        return _run_command(settings, args)


def _run_command(settings: Settings, args: argparse.Namespace) -> int:
    store = GraphStore.open(settings, migrate=args.command != "migrate")
    try:
        if args.command == "migrate":
            applied = store.migrate()
            version = store.schema_version()
            print(
                f"applied {', '.join(applied)}; schema version {version}"
                if applied
                else f"schema up to date (version {version})"
            )
        elif args.command == "stats":
            _print_stats(store, args.json)
        elif args.command == "export":
            data = store.export_data()
            path = write_export(data, args.out)
            print(
                f"exported {len(data['nodes'])} nodes and {len(data['relationships'])} relationships to {path}"
            )
        elif args.command == "import":
            counts = store.import_json(args.file, merge=args.merge)
            print(
                f"imported {counts['nodes']} nodes and {counts['relationships']} relationships from {args.file}"
            )
        elif args.command == "facts":
            found = entity_facts(store, args.entity)
            if not found:
                raise InvalidInputError(
                    f"no entity is named or aliased {args.entity!r} in the graph",
                    hint="names are matched whole, case and accents aside; see the bible files",
                )
            if args.json:
                print(
                    json.dumps(
                        [f.model_dump(mode="json") for f in found], indent=1, ensure_ascii=False
                    )
                )
            else:
                print(format_facts(found))
        elif args.command == "codex":
            _codex(store, settings, args)
        elif args.command == "vault":
            _vault(store, settings, args)
        elif args.command == "rollback":
            result = store.rollback_chapter(args.chapter, cascade=args.cascade)
            print(
                f"rolled back chapter(s) {', '.join(str(c) for c in result.chapters)}: "
                f"{result.deleted_nodes} nodes and {result.deleted_relationships} relationships removed, "
                f"{result.restored_nodes} nodes and {result.restored_relationships} relationships restored "
                f"({result.seconds:.2f}s)"
            )
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    run_main(main, "kg", sys.argv[1:])
