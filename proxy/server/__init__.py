"""The HTTP service: the ASGI app and its endpoints, the request path shared by every
dialect, the concurrency gate, tenants, the admin API and the process's lifecycle."""
