"""The pure scheduler: which sequences run in the next step, their KV cells (`kv_ledger`), the step each plan
describes (`step_plan`), each sequence's state (`sequence`), and prompt/cache token matching (`token_match`).
No llama.cpp, no threads: unit tests drive it directly."""
