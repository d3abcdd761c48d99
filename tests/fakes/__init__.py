"""Strict fakes of the APIs the proxy talks to, on loopback, each on the shared base
(`tests.fakes.base`): the OpenAI API (`openai`: chat completions, Responses, embeddings),
Anthropic Messages (`anthropic`), Gemini (`gemini`, behind litellm), a compaction hook (`hook`)
and an upstream whose every byte a test scripts (`scripted`)."""
