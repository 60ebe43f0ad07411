"""The notes of a vault, built from a codex page (kg.codex.novel): no read of its own.

One note per entity (in a folder per codex section: Characters, Places, Items, Other), per
chapter (Chapters/) and per scene (Scenes/), a note for the story bible when the book has
one, and an Index. Each note starts with YAML front matter (type, status, first chapter,
aliases, and what else the kind has) written by PyYAML, so a name with a colon, a quote or a
leading `-` stays one valid string; Obsidian reads `aliases` and resolves `[[alias]]` to the
note.

Links: every link Skald writes names a note of the vault by its file name (`[[Mara Quill]]`,
`[[Chapter 3 - Scene 1|Scene 1]]`), and a name that is no note (a scene's extra, a chapter
the graph does not hold) is written as plain text, so every `[[link]]` resolves. The
writer's own text in the notes (descriptions, quotes, summaries) is escaped so that it
cannot make a link, a tag, a heading or a formula of its own.

File names: the entity's name with the characters Obsidian or a file system refuses
(`\\ / : * ? " < > | # ^ [ ]`, control characters) replaced, NFC-normalised (macOS
stores names decomposed), at most 120 bytes. Names are claimed in a fixed order (the Index,
the story bible, chapters, scenes, then entities by first chapter and id) and compared
case-insensitively (the usual file systems of macOS and Windows are): the first claimant
keeps the plain name, a later one gets its kind added ("Gull Rock (Place)"), and then a
short hash of its id. An entity keeps its file as the book grows unless a rename or a
merge changes its name.

The Markdown is written line by line here: a note is a few headed lists, and a template
engine would add whitespace rules without any escaping Markdown needs (it has none a
library knows: the escaping below is Obsidian's).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable

import yaml
from pydantic import BaseModel, ConfigDict, Field

from kg import vocabulary as vocab
from kg.codex.models import (
    CodexPage,
    EntityCard,
    GraphEdge,
    GraphNode,
    SceneLine,
    StatusSpan,
    TimelineEntry,
)

INDEX_NOTE = "Index"
BIBLE_NOTE = "Story bible"
CHAPTERS_FOLDER = "Chapters"
SCENES_FOLDER = "Scenes"
#: Codex section anchor -> the vault folder of its entities.
ENTITY_FOLDERS = {
    "characters": "Characters",
    "places": "Places",
    "items": "Items",
    "other": "Other",
}
#: The `type` of an entity note, by graph label (other labels: the label in lower case).
ENTITY_TYPES = {"Character": "character", "Location": "place", "Item": "item"}
_MAX_STEM_BYTES = 120
_UNSAFE = re.compile(r'[\\/:*?"<>|#^\[\]\x00-\x1f\x7f]+')
_WINDOWS_RESERVED = frozenset(
    {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
)
# Markdown (and Obsidian: tags, comments, highlights, maths) characters escaped in free text.
_MARKUP = re.compile(r"([\\\[\]#<>`*$%=~|^])")


class VaultNote(BaseModel):
    """One Markdown file of the vault: `path` is relative to the vault, with `/`."""

    model_config = ConfigDict(frozen=True)

    path: str
    text: str
    links: list[str] = Field(
        default_factory=list, description="the note names its [[links]] point to"
    )


# --- text ---------------------------------------------------------------------------------------


def escape(text: str | None) -> str:
    """Free text on one line, unable to make Markdown or Obsidian syntax of its own."""
    return _MARKUP.sub(r"\\\1", " ".join(str(text or "").split()))


def quoted(text: str | None) -> str:
    return f"\u201c{escape(text)}\u201d" if text and text.strip() else ""


def safe_stem(name: str) -> str:
    """A file name (without `.md`) for `name` that every file system and Obsidian accept."""
    text = unicodedata.normalize("NFC", _UNSAFE.sub(" ", name))
    text = " ".join(text.split()).strip(" .")
    data = text.encode("utf-8")
    if len(data) > _MAX_STEM_BYTES:
        text = data[:_MAX_STEM_BYTES].decode("utf-8", "ignore").rstrip(" .")
    if not text:
        return "Unnamed"
    return f"{text} (note)" if text.split(".")[0].casefold() in _WINDOWS_RESERVED else text


def _no_link(value: object) -> object:
    """Obsidian reads `[[...]]` in a property as a link: a value from the story keeps its
    words but not the double brackets (a title such as "The [[Part]]")."""
    if isinstance(value, str):
        return value.replace("[[", "[").replace("]]", "]")
    if isinstance(value, list):
        return [_no_link(v) for v in value]
    return value


def linkable(alias: str) -> bool:
    """Whether `[[alias]]` can name a note: a link cannot hold `[ ] | # ^`."""
    return bool(alias.strip()) and not re.search(r"[\[\]|#^]", alias)


def front_matter(fields: dict[str, object]) -> str:
    """YAML front matter between `---` lines (keys in the given order)."""
    plain = {key: _no_link(value) for key, value in fields.items()}
    body = yaml.safe_dump(
        plain, sort_keys=False, allow_unicode=True, default_flow_style=False, width=10_000
    )
    return f"---\n{body}---\n"


# --- names --------------------------------------------------------------------------------------


class _Names:
    """Claims file names: unique case-insensitively across the whole vault."""

    def __init__(self) -> None:
        self.taken: set[str] = set()

    def claim(self, *candidates: str) -> str:
        for candidate in candidates:
            if candidate.casefold() not in self.taken:
                self.taken.add(candidate.casefold())
                return candidate
        raise ValueError(
            f"no free note name among {candidates}"
        )  # the last candidate is unique by construction


def entity_type(label: str) -> str:
    """The `type` of an entity note: character, place, item, or the label in lower case."""
    return ENTITY_TYPES.get(label, label.lower())


def _entity_stem(names: _Names, card: EntityCard) -> str:
    base = safe_stem(card.name)
    kind = entity_type(card.kind).capitalize()
    digest = hashlib.sha256(card.id.encode("utf-8", "surrogatepass")).hexdigest()
    return names.claim(
        base, f"{base} ({kind})", f"{base} ({kind} {digest[:8]})", f"{base} ({kind} {digest})"
    )


def scene_stem(chapter: int, scene: int) -> str:
    return f"Chapter {chapter} - Scene {scene}"


# --- the vault ----------------------------------------------------------------------------------


class _Vault:
    """The notes of one page: names first, then each note, with links only to notes that exist."""

    def __init__(self, page: CodexPage) -> None:
        self.page = page
        self.cards = [(section.anchor, card) for section in page.sections for card in section.cards]
        self.nodes: dict[str, GraphNode] = {n.id: n for n in page.graph.nodes}
        self.chapters = [e for e in page.timeline if e.at > 0]
        self.bible = next((e for e in page.timeline if e.at == 0), None)
        self.by_anchor = {card.anchor: card.id for _, card in self.cards}
        names = _Names()
        names.claim(INDEX_NOTE)
        if self.bible is not None:
            names.claim(BIBLE_NOTE)
        self.chapter_stems = {e.at: names.claim(f"Chapter {e.at}") for e in self.chapters}
        self.scene_stems: dict[tuple[int, int], str] = {}
        for entry in self.chapters:
            for scene in entry.scenes:
                base = scene_stem(entry.at, scene.index)
                self.scene_stems[(entry.at, scene.index)] = names.claim(
                    base, *(f"{base} ({n})" for n in range(2, 99))
                )
        order = sorted(self.cards, key=lambda item: (self.first(item[1].id) or 0, item[1].id))
        self.entity_stems = {card.id: _entity_stem(names, card) for _, card in order}
        self.entity_names = {card.id: card.name for _, card in self.cards}
        self.by_name: dict[str, list[EntityCard]] = defaultdict(list)
        for _, card in self.cards:
            for name in dict.fromkeys(vocab.normalize_name(n) for n in (card.name, *card.aliases)):
                self.by_name[name].append(card)
        self.links: list[str] = []

    def first(self, entity_id: str) -> int | None:
        node = self.nodes.get(entity_id)
        return node.first if node is not None else None

    # --- links (each one recorded, so the caller can count and check them) ---

    def link(self, stem: str, shown: str | None = None) -> str:
        self.links.append(stem)
        shown_text = " ".join(
            (shown or "").replace("|", "/").replace("[", "(").replace("]", ")").split()
        )
        return f"[[{stem}|{shown_text}]]" if shown_text and shown_text != stem else f"[[{stem}]]"

    def entity(self, entity_id: str) -> str:
        stem = self.entity_stems.get(entity_id)
        name = self.entity_names.get(entity_id, entity_id)
        return self.link(stem, name) if stem is not None else escape(name)

    def chapter(self, number: int | None, *, capital: bool = False) -> str:
        if not number:
            if self.bible is not None:
                return self.link(BIBLE_NOTE, "Story bible" if capital else "the story bible")
            return "Story bible" if capital else "the story bible"
        stem = self.chapter_stems.get(number)
        return self.link(stem) if stem is not None else f"chapter {number}"

    def named(self, name: str, prefer: str) -> str:
        """A link to the entity a scene names (`prefer`: the label to take among namesakes)."""
        found = self.by_name.get(vocab.normalize_name(name), [])
        card = next((c for c in found if c.kind == prefer), found[0] if found else None)
        return self.link(self.entity_stems[card.id], name) if card is not None else escape(name)

    # --- notes ---

    def note(
        self, folder: str, stem: str, fields: dict[str, object], lines: Iterable[str]
    ) -> VaultNote:
        body = "\n".join(lines).strip("\n")
        path = f"{folder}/{stem}.md" if folder else f"{stem}.md"
        note = VaultNote(path=path, text=f"{front_matter(fields)}\n{body}\n", links=self.links)
        self.links = []
        return note

    def notes(self) -> list[VaultNote]:
        notes = [self.index_note()]
        if self.bible is not None:
            notes.append(self.chapter_note(self.bible))
        for entry in self.chapters:
            notes.append(self.chapter_note(entry))
            notes.extend(self.scene_note(entry, scene) for scene in entry.scenes)
        notes.extend(self.entity_note(anchor, card) for anchor, card in self.cards)
        return sorted(notes, key=lambda n: n.path)

    def index_note(self) -> VaultNote:
        page = self.page
        lines = [f"# {escape(page.title)}", ""]
        if page.subtitle:
            lines += [escape(page.subtitle), ""]
        lines += [
            f"The world as of {self.chapter(page.as_of)}: {page.stats.entities} entries, "
            f"{page.stats.relationships} relationships, {page.stats.chapters} chapters.",
            "",
            "Skald rewrites a note here only while it holds exactly what Skald last wrote: edit one, "
            "or add notes of your own, and later exports leave them alone.",
            "",
        ]
        if self.bible is not None or self.chapters:
            lines += ["## Chapters", ""]
            if self.bible is not None:
                lines.append(f"- {self.chapter(0, capital=True)}")
            lines += [
                f"- {self.chapter(e.at)}" + (f": {escape(e.title)}" if e.title else "")
                for e in self.chapters
            ]
            lines.append("")
        for section in page.sections:
            lines += [f"## {escape(section.title)}", ""]
            lines += [f"- {self.entity(card.id)}" for card in section.cards]
            lines.append("")
        lines += [f"- {escape(note)}" for note in page.notes]
        return self.note(
            "",
            INDEX_NOTE,
            {"type": "index", "title": page.title, "as_of_chapter": page.as_of},
            lines,
        )

    def entity_note(self, anchor: str, card: EntityCard) -> VaultNote:
        first = self.first(card.id)
        aliases = [a for a in dict.fromkeys(card.aliases) if linkable(a)]
        stem = self.entity_stems[card.id]
        if stem != card.name and card.name not in aliases and linkable(card.name):
            aliases.insert(
                0, card.name
            )  # [[Name]] still finds the note whose file name had to change
        fields: dict[str, object] = {
            "type": entity_type(card.kind),
            "name": card.name,
            "status": card.statuses[-1].status if card.statuses else None,
            "first_chapter": first,
            "aliases": aliases,
            "skald_id": card.id,
        }
        if card.provisional:
            fields["provisional"] = True
        seen = self.place(first, card.first) if first is not None else escape(card.first)
        lines = [
            f"# {escape(card.name)}",
            "",
            escape(entity_type(card.kind).capitalize())
            + (f", first seen: {seen}" if seen else "")
            + (f" {quoted(card.first_quote)}" if card.first_quote else ""),
            "",
        ]
        if card.description:
            lines += [escape(card.description), ""]
        sheet = [f"- **{escape(k.capitalize())}:** {escape(v)}" for k, v in card.fields]
        if card.traits:
            sheet.append(f"- **Traits:** {escape(', '.join(card.traits))}")
        if sheet:
            lines += [*sheet, ""]
        if card.statuses:
            lines += ["## Status", "", *(self.status_line(span) for span in card.statuses), ""]
        relations = [
            self.relation_line(edge, card.id)
            for edge in self.page.graph.edges
            if card.id in (edge.source, edge.target)
        ]
        if relations:
            lines += ["## Relationships", "", *relations, ""]
        if card.facts:
            lines += ["## Facts", ""]
            for fact in card.facts:
                quote = quoted(fact.quote)
                lines.append(
                    f"- {self.place(fact.at, fact.where)}: {escape(fact.statement)}"
                    + (f" {quote}" if quote else "")
                )
            lines.append("")
        if card.appears_in:
            lines += [
                "## Appears in",
                "",
                " \u00b7 ".join(self.chapter(n) for n in card.appears_in),
                "",
            ]
        if card.findings:
            lines += ["## QA findings", "", *(f"- {escape(f)}" for f in card.findings), ""]
        return self.note(ENTITY_FOLDERS.get(anchor, "Other"), stem, fields, lines)

    def place(self, chapter: int | None, where: str) -> str:
        """'[[Chapter 2]], scene 1' for a chapter and the codex's 'ch 2 sc 1' (the story bible: its note)."""
        scene = re.search(r" sc (\d+)$", where)
        at = self.chapter(chapter or 0, capital=True)
        return f"{at}, scene {scene.group(1)}" if scene and chapter else at

    def status_line(self, span: StatusSpan) -> str:
        since = self.chapter(span.start)
        until = f" through {self.chapter(span.end)}" if span.end is not None else ""
        quote = quoted(span.quote)
        return f"- {escape(span.status)}: from {since}{until}" + (f" {quote}" if quote else "")

    def span_text(self, spans: list[tuple[int, int | None]]) -> str:
        parts = []
        for start, end in spans:
            since = f"from {self.chapter(start)}"
            parts.append(
                f"{since}, ended in {self.chapter(end)}" if end is not None else f"{since} on"
            )
        return "; ".join(parts)

    def relation_line(self, edge: GraphEdge, entity_id: str) -> str:
        outgoing = edge.source == entity_id
        other = edge.target if outgoing else edge.source
        arrow = "\u2192" if outgoing else "\u2190"
        ended = (
            f" (then {escape(edge.ended_by)})"
            if edge.ended_by and edge.spans[-1][1] is not None
            else ""
        )
        return f"- {escape(edge.label)} {arrow} {self.entity(other)}: {self.span_text(edge.spans)}{ended}"

    def chapter_note(self, entry: TimelineEntry) -> VaultNote:
        number = entry.at
        is_bible = number == 0
        flagged = bool(entry.flags or entry.findings)
        fields: dict[str, object] = {
            "type": "story bible" if is_bible else "chapter",
            "chapter": number,
            "title": entry.title or None,
            "status": None if is_bible else ("flagged" if flagged else "written"),
            "first_chapter": number,
            "aliases": [entry.title] if linkable(entry.title) and not is_bible else [],
        }
        heading = (
            BIBLE_NOTE
            if is_bible
            else f"Chapter {number}" + (f": {escape(entry.title)}" if entry.title else "")
        )
        lines = [f"# {heading}", ""]
        if is_bible:
            lines += [escape(entry.title), ""]
        else:
            before = [self.chapter(n) for n in (number - 1,) if n in self.chapter_stems or n == 0]
            after = [self.chapter(n) for n in (number + 1,) if n in self.chapter_stems]
            lines += [
                " \u00b7 ".join(
                    [*(f"\u2190 {b}" for b in before), *(f"{a} \u2192" for a in after)]
                ),
                "",
            ]
        if entry.summary:
            lines += [escape(entry.summary), ""]
        if entry.key_events:
            lines += ["## Key events", "", *(f"- {escape(e)}" for e in entry.key_events), ""]
        if entry.scenes:
            lines += ["## Scenes", ""]
            for scene in entry.scenes:
                stem = self.scene_stems[(number, scene.index)]
                title = f"Scene {scene.index}" + (f": {scene.title}" if scene.title else "")
                where = (
                    f" \u00b7 at {self.named(scene.location, 'Location')}" if scene.location else ""
                )
                lines.append(f"{scene.index}. {self.link(stem, title)}{where}")
            lines.append("")
        groups = (("Characters", entry.appears), ("Mentioned", entry.mentioned))
        for title, items in groups:
            linked = [
                self.entity(eid) for item in items if (eid := self.by_anchor.get(item.anchor or ""))
            ]
            if linked:
                lines += [f"## {title}", "", " \u00b7 ".join(linked), ""]
        new = [
            f"- {self.entity(card.id)} ({escape(entity_type(card.kind))})"
            + (f" {quoted(card.first_quote)}" if card.first_quote else "")
            for _, card in self.cards
            if self.first(card.id) == number
        ]
        if new:
            lines += ["## New here" if not is_bible else "## Entries", "", *new, ""]
        changes = [
            f"- {self.entity(card.id)}: {escape(span.status)}"
            + (f" {quoted(span.quote)}" if span.quote else "")
            for _, card in self.cards
            for span in card.statuses
            if span.start == number and number > 0
        ]
        if changes:
            lines += ["## Status changes", "", *changes, ""]
        begun, ended = self.chapter_relations(number)
        if begun:
            lines += ["## Relationships begun", "", *begun, ""]
        if ended:
            lines += ["## Relationships ended", "", *ended, ""]
        problems = [*entry.flags, *entry.findings]
        if problems:
            lines += ["## Flags and QA findings", "", *(f"- {escape(p)}" for p in problems), ""]
        stem = BIBLE_NOTE if is_bible else self.chapter_stems[number]
        return self.note("" if is_bible else CHAPTERS_FOLDER, stem, fields, lines)

    def chapter_relations(self, number: int) -> tuple[list[str], list[str]]:
        """The relationships that began and ended in chapter `number`, with their links."""
        begun, ended = [], []
        for edge in self.page.graph.edges:
            for start, end in edge.spans:
                if number not in (start, end):
                    continue
                pair = f"{self.entity(edge.source)} {escape(edge.label)} {self.entity(edge.target)}"
                if start == number:
                    quote = next(
                        (e.quote for e in edge.events if (e.at or 0) == number and e.quote), None
                    )
                    begun.append(f"- {pair}" + (f" {quoted(quote)}" if quote else ""))
                else:  # what ended it is known for its last span only
                    last = edge.ended_by and end == edge.spans[-1][1]
                    ended.append(f"- {pair}" + (f" (then {escape(edge.ended_by)})" if last else ""))
        return begun, ended

    def scene_note(self, entry: TimelineEntry, scene: SceneLine) -> VaultNote:
        stem = self.scene_stems[(entry.at, scene.index)]
        fields: dict[str, object] = {
            "type": "scene",
            "chapter": entry.at,
            "scene": scene.index,
            "title": scene.title or None,
            "location": scene.location or None,
            "characters": list(scene.characters),
            "aliases": [],
        }
        title = f"Chapter {entry.at}, scene {scene.index}" + (
            f": {escape(scene.title)}" if scene.title else ""
        )
        lines = [
            f"# {title}",
            "",
            f"In {self.chapter(entry.at)}"
            + (f" \u00b7 at {self.named(scene.location, 'Location')}" if scene.location else ""),
            "",
        ]
        if scene.characters:
            lines += [
                "**Characters:** "
                + " \u00b7 ".join(self.named(c, "Character") for c in scene.characters),
                "",
            ]
        if scene.summary:
            lines += [escape(scene.summary), ""]
        return self.note(SCENES_FOLDER, stem, fields, lines)


def vault_notes(page: CodexPage) -> list[VaultNote]:
    """Every note of the vault of `page` (a book's codex page), ordered by path."""
    if page.kind != "novel":
        raise ValueError("a vault is written for a book, not for a sidecar conversation")
    return _Vault(page).notes()
