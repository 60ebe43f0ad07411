"""The scripted novel: what the scripted OpenAI-compatible server answers for a short book
(`script_novel`): two characters, a lighthouse, a ghost the validator rejects on demand, and
distinct prose per scene. Used by the novel flow's end-to-end tests and bench/pipeline_overhead.py.
"""

from __future__ import annotations

import re

from tests.support.scripted_llm import (
    ScriptedLLM,
    ScriptedRequest,
    quoting_extraction,
    scene_text_of,
    scripted_prose,
)

PREMISE = "A lighthouse keeper finds a letter from a sister who drowned ten years ago."
CHARACTERS = [
    {
        "name": "Mara Quill",
        "role": "protagonist",
        "description": "The keeper of Gull Rock light.",
        "traits": ["stubborn", "brave"],
        "motivation": "learn the truth",
        "backstory": "Lost her sister.",
        "voice": "Clipped, salty sentences.",
    },
    {
        "name": "Tobias Venn",
        "role": "supporting",
        "description": "The ferryman.",
        "traits": ["kind"],
        "motivation": "protect Mara",
        "backstory": "Grew up on the mainland.",
        "voice": "Slow and gentle, full of tide lore.",
    },
]


def _plan(request: ScriptedRequest) -> dict[str, object]:
    wanted = int(re.search(r"Plan exactly (\d+) scenes", request.text).group(1))  # type: ignore[union-attr]
    return {
        "scenes": [
            {
                "title": f"Scene {i}",
                "pov": "Mara Quill",
                "setting": "Gull Rock lighthouse",
                "characters": ["Mara Quill", "Tobias Venn"],
                "beats": [f"beat {i}"],
            }
            for i in range(1, wanted + 1)
        ]
    }


SCENERY = [
    "Rain hammered the gallery glass while gulls wheeled over the reef.",
    "The lamp room smelled of paraffin, brass polish and old rope.",
    "Fog swallowed the ferry bell and the tide crept over the slipway.",
    "A storm lantern swung above the chart table, throwing long shadows.",
    "Morning sun lit the cliffs and the kelp beds glittered below.",
    "Snow dusted the keeper's cottage and the generator coughed awake.",
    "The letter's wax seal cracked like river ice under her thumb.",
    "Waves boomed in the sea caves beneath the northern stairs.",
]


def scripted_draft(request: ScriptedRequest) -> str:
    where = re.search(r"Chapter (\d+), scene (\d+)", request.text)
    chapter, scene = (int(where.group(1)), int(where.group(2))) if where else (0, 0)
    # Distinct scenery and prose per scene keep scenes from looking like duplicates to the
    # validator; enough varied words pass the degeneration guard.
    scenery = SCENERY[(chapter * 3 + scene) % len(SCENERY)]
    body = scripted_prose(chapter * 3 + scene)
    if "## Guidance" in request.text:  # revision guidance rides in the prompt's guidance section
        return f"Mara Quill climbed the stairs of Gull Rock lighthouse with Tobias Venn, revised. {scenery} {body}"
    marker = " A Drowned Phantom watched." if "REJECT-ME" in request.text else ""
    return f"Mara Quill met Tobias Venn at Gull Rock lighthouse. {scenery}{marker} {body}"


def scripted_extraction(request: ScriptedRequest) -> dict[str, object]:
    entities = [
        {
            "name": "Mara Quill",
            "kind": "Character",
            "description": "The keeper.",
            "traits": ["brave"],
        },
        {"name": "Tobias Venn", "kind": "Character", "description": "The ferryman."},
        {"name": "Gull Rock lighthouse", "kind": "Location", "description": "A lighthouse."},
        {"name": "Drowned Phantom", "kind": "Character", "description": "A ghost."},
    ]
    relationships = [
        {"source": "Mara Quill", "target": "Tobias Venn", "type": "FRIEND_OF"},
        {"source": "Mara Quill", "target": "Gull Rock lighthouse", "type": "LOCATED_IN"},
    ]
    return quoting_extraction(scene_text_of(request), entities, relationships)


def script_novel(server: ScriptedLLM) -> None:
    server.on(schema="CharacterSheets", respond={"characters": CHARACTERS})
    server.on(
        schema="GlobalOutline",
        respond={
            "title": "The Drowned Letter",
            "logline": "A keeper chases a ghost's letter.",
            "setting": "Gull Rock",
            "themes": ["grief"],
            "acts": [
                {"number": 1, "summary": "The letter."},
                {"number": 2, "summary": "The truth."},
            ],
        },
    )
    server.on(
        schema="ChapterOutlines",
        respond=lambda r: {
            "chapters": [
                {
                    "number": 1,
                    "title": "The Letter",
                    "summary": "Mara finds the letter.",
                    "pov": "Mara Quill",
                    "setting": "Gull Rock lighthouse",
                    "key_beats": ["finds letter"],
                }
            ]
        },
    )
    server.on(schema="ScenePlan", respond=_plan)
    server.on(schema="SceneExtraction", respond=scripted_extraction)
    server.on(
        schema="QualityScores",
        respond={
            "coherence": 0.9,
            "prose_quality": 0.9,
            "plot_advancement": 0.9,
            "pacing": 0.9,
            "tone_consistency": 0.9,
            "feedback": "Good.",
        },
    )
    server.on(
        schema="ChapterSummary",
        respond=lambda r: {
            "summary": "Mara and Tobias meet at the lighthouse.",
            "key_events": ["meeting"],
        },
    )
    server.on(schema=None, contains="Write the scene", respond=scripted_draft)
