"""The Prefect artifacts the session's API holds, by key (what a flow run published)."""

from __future__ import annotations


def artifact_keys() -> set[str]:
    """Every artifact key the Prefect API holds."""
    import asyncio

    from prefect.client.orchestration import get_client

    async def read() -> set[str]:
        async with get_client() as client:
            return {a.key for a in await client.read_artifacts() if a.key}

    return asyncio.run(read())
