"""Towards the upstreams: the proxy's own HTTP/1.1 client, retries, and the litellm transport
for providers reached through litellm. Nothing here knows compaction."""
