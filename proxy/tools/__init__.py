"""The command line and what it runs offline: replay of recorded conversations, charts, and
the admin API's client."""
