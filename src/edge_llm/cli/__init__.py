"""Command-line entry points: serve, chat, model, bench; start-up checks and banner."""
