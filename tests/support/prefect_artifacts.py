"""The Prefect artifacts the session's API holds, by key (what a flow run published)."""

from __future__ import annotations


def artifact_keys(*wanted: str) -> set[str]:
    """Which of the `wanted` keys the Prefect API holds an artifact for.

    Asked by key: the session's API holds every artifact the suite's flows published (hundreds),
    and an unfiltered read returns only the API's first page of them."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def read() -> set[str]:
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=list(wanted)))
            )
            return {a.key for a in found if a.key}

    return asyncio.run(read())
