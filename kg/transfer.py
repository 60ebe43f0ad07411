"""Export and import of the whole graph as deterministic JSON.

Nodes are identified by a `ref` built from their labels and `id` (or a content hash when
they have no id), never by server element ids, so two exports of the same graph are
byte-identical and an export can be loaded into another server. The schema meta node
is left out: it is migration state, owned by the target graph's migrations. So are the
operational properties (kg.vocabulary.OPERATIONAL_PROPERTIES: commit wall-clock times,
the committing process, slot timings): an export holds the world, not when it was written. Values go through the
exact value codec (int vs float, temporal types). An import file is untrusted: its
labels and relationship types must belong to the vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from neo4j import ManagedTransaction

from core.content import USER_TEXT_ENCODING
from kg import cypher
from kg import vocabulary as vocab
from kg.errors import ImportRefusedError
from kg.records import canonical_json, decode_props, encode_props

FORMAT = "skald-kg-export"
FORMAT_VERSION = 1

#: Unique key properties per label, used to MERGE on import with merge=True.
MERGE_KEYS: dict[str, tuple[str, ...]] = {
    vocab.ENTITY: ("id",),
    vocab.CHAPTER: ("id",),
    vocab.SCENE: ("id",),
    vocab.NOVEL_INFO: ("id",),
    vocab.WORLD_CONTAINER: ("id",),
    vocab.VALUE_NODE: ("id",),
    vocab.CHANGE_SET: ("id",),
    vocab.ENTITY_NAME: ("entity_id", "key"),
    vocab.MERGE_AUDIT: ("id",),
    vocab.KG_ENTITY: ("conversation_id", "entity_id"),
    vocab.KG_REL_EVENT: ("event_id",),
    vocab.KG_MILESTONE: ("milestone_id",),
    vocab.KG_TURN: ("key",),
}


def _node_ref(labels: list[str], props: dict[str, Any]) -> str:
    prefix = ":".join(labels)
    if isinstance(props.get("id"), str):
        return f"{prefix}/{props['id']}"
    digest = hashlib.sha256(canonical_json(props).encode("utf-8", "surrogatepass")).hexdigest()[:20]
    return f"{prefix}/#{digest}"


def export_tx(tx: ManagedTransaction) -> dict[str, Any]:
    raw_nodes = [r.data() for r in tx.run(cypher.EXPORT_NODES)]
    raw_rels = [r.data() for r in tx.run(cypher.EXPORT_RELS)]
    nodes: list[dict[str, Any]] = []
    ref_of: dict[str, str] = {}
    by_ref: dict[str, list[tuple[str, list[str], dict[str, Any], str]]] = defaultdict(list)
    for row in raw_nodes:
        labels = sorted(row["labels"])
        operational = frozenset().union(
            *(vocab.OPERATIONAL_PROPERTIES.get(label, frozenset()) for label in labels)
        )
        props = encode_props({k: v for k, v in row["props"].items() if k not in operational})
        by_ref[_node_ref(labels, props)].append((canonical_json(props), labels, props, row["eid"]))
    for ref, group in by_ref.items():
        group.sort(key=lambda g: g[0])
        for i, (_, labels, props, eid) in enumerate(group):
            # Duplicate refs (same labels and id, or identical content) get a stable suffix.
            unique = ref if i == 0 else f"{ref}~{i + 1}"
            ref_of[eid] = unique
            nodes.append({"ref": unique, "labels": labels, "properties": props})
    nodes.sort(key=lambda n: n["ref"])
    rels = [
        {
            "type": r["type"],
            "start": ref_of[r["src"]],
            "end": ref_of[r["tgt"]],
            "properties": encode_props(r["props"]),
        }
        for r in raw_rels
    ]
    rels.sort(key=lambda r: (r["type"], r["start"], r["end"], canonical_json(r["properties"])))
    return {"format": FORMAT, "version": FORMAT_VERSION, "nodes": nodes, "relationships": rels}


def dumps_export(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, indent=1, allow_nan=False) + "\n"


def write_export(data: dict[str, Any], path: Path) -> Path:
    """Atomic write (temp file + rename) so a crash never leaves half an export."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(dumps_export(data), encoding="utf-8")
    tmp.replace(path)
    return path


def read_export(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding=USER_TEXT_ENCODING))
    except OSError as exc:
        raise ImportRefusedError(f"cannot read import file {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ImportRefusedError(f"import file {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ImportRefusedError(f"import file {path} does not hold a {FORMAT} object")
    return data


def validate_export(data: dict[str, Any]) -> None:
    """Refuse anything but a well-formed export using only vocabulary labels and types."""
    if data.get("format") != FORMAT or data.get("version") != FORMAT_VERSION:
        raise ImportRefusedError(
            f"not a {FORMAT} version {FORMAT_VERSION} file",
            hint="create it with `python -m kg export`",
        )
    nodes, rels = data.get("nodes"), data.get("relationships")
    if not isinstance(nodes, list) or not isinstance(rels, list):
        raise ImportRefusedError("import file must have 'nodes' and 'relationships' lists")
    refs: set[str] = set()
    for node in nodes:
        if (
            not isinstance(node, dict)
            or not isinstance(node.get("ref"), str)
            or not isinstance(node.get("properties"), dict)
        ):
            raise ImportRefusedError(f"malformed node entry: {str(node)[:80]}")
        labels = node.get("labels")
        if (
            not isinstance(labels, list)
            or not labels
            or any(label not in vocab.ALL_LABELS for label in labels)
        ):
            raise ImportRefusedError(
                f"node {node['ref'][:80]!r} has labels outside the graph vocabulary: {str(labels)[:80]}"
            )
        if node["ref"] in refs:
            raise ImportRefusedError(f"duplicate node ref {node['ref'][:80]!r}")
        refs.add(node["ref"])
    for rel in rels:
        if not isinstance(rel, dict) or not isinstance(rel.get("properties"), dict):
            raise ImportRefusedError(f"malformed relationship entry: {str(rel)[:80]}")
        if rel.get("type") not in vocab.ALL_REL_TYPES:
            raise ImportRefusedError(
                f"relationship type {str(rel.get('type'))[:60]!r} is outside the graph vocabulary"
            )
        if rel.get("start") not in refs or rel.get("end") not in refs:
            raise ImportRefusedError(f"relationship {rel['type']} points at an unknown node ref")


def import_tx(
    tx: ManagedTransaction, data: dict[str, Any], *, merge: bool = False
) -> dict[str, int]:
    if not merge:
        existing = tx.run(cypher.COUNT_NON_META_NODES).single()
        if existing and existing["count"]:
            raise ImportRefusedError(
                f"the graph already holds {existing['count']} nodes",
                hint="import into an empty graph, or pass --merge to merge nodes by id",
            )
    eid_of: dict[str, str] = {}
    groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[dict[str, Any]]] = defaultdict(list)
    for node in data["nodes"]:
        labels = node["labels"]
        if vocab.SCHEMA_META in labels:
            continue  # the schema meta node belongs to the migrations of the target graph
        props = decode_props(node["properties"])
        keyed = [
            label
            for label in labels
            if label in MERGE_KEYS and all(k in props for k in MERGE_KEYS[label])
        ]
        if merge and keyed:
            first = keyed[0]
            ordered = (first, *[label for label in labels if label != first])
            groups[(ordered, MERGE_KEYS[first])].append({"ref": node["ref"], "props": props})
        else:
            groups[(tuple(labels), ())].append({"ref": node["ref"], "props": props})
    for (labels, keys), rows in sorted(groups.items()):
        query = cypher.import_merge_keyed(labels, keys) if keys else cypher.import_nodes(labels)
        for start in range(0, len(rows), 5000):
            for record in tx.run(query, rows=rows[start : start + 5000]):
                eid_of[record["ref"]] = record["eid"]
    by_type: dict[tuple[str, bool], list[dict[str, Any]]] = defaultdict(list)
    for rel in data["relationships"]:
        if rel["start"] not in eid_of or rel["end"] not in eid_of:
            continue
        props = decode_props(rel["properties"])
        by_type[(rel["type"], merge and "key" in props)].append(
            {"src": eid_of[rel["start"]], "tgt": eid_of[rel["end"]], "props": props}
        )
    count = 0
    for (rel_type, keyed), rows in sorted(by_type.items()):
        query = cypher.import_merge_rels(rel_type) if keyed else cypher.import_rels(rel_type)
        for start in range(0, len(rows), 5000):
            tx.run(query, rows=rows[start : start + 5000]).consume()
        count += len(rows)
    return {"nodes": len(eid_of), "relationships": count}
