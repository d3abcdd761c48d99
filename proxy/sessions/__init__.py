"""Per-session state: session ids and keys, what a session keeps (plans, prepared summaries,
calibration, prompt-cache figures), and the stores that hold it (memory, Redis in every
topology)."""
