"""From messages to prompt tokens: chat templates, prompt building, tool-call grammar and parsing."""
