"""Beyond compaction: long-term memory, working memory and operations, stale reads,
policy comparison and retrieval, as pages of the dashboard and one API endpoint."""
