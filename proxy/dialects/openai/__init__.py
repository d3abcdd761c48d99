"""OpenAI's two APIs: chat completions and the Responses API."""
