"""The sidecar's HTTP paths (every one is kept stable for the front ends written against them)."""

API_PREFIX = "/api/kg-sidecar"
COMMIT_PATH = f"{API_PREFIX}/turn/commit"
RETRY_PATH = f"{API_PREFIX}/turn/retry"
REPLACE_PATH = f"{API_PREFIX}/turn/replace"
REWIND_PATH = f"{API_PREFIX}/conversation/rewind"
FORGET_PATH = f"{API_PREFIX}/conversation/forget"
RENAME_PATH = f"{API_PREFIX}/conversation/rename"
MEMORY_QUERY_PATH = f"{API_PREFIX}/memory/query"
CONVERSATIONS_PATH = f"{API_PREFIX}/conversations"
#: GET {CONVERSATION_PATH}/{conversation_id}/lorebook (the path issue 32 gives it).
CONVERSATION_PATH = f"{API_PREFIX}/conversation"
HEALTH_PATH = f"{API_PREFIX}/health"
