"""Many models in one server: model name → its own engine, loaded on demand, unloaded when idle, within a memory
budget (registry.py); what can be served (specs.py); the pure parts (keep_alive.py, budget.py)."""
