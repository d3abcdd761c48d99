"""Compaction around the pure engine (`policies`): the per-request decision and its plan, the
summaries (prepared ahead, bounded, hooks), exact counts and their breakers."""
