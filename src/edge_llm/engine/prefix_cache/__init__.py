"""The prefix cache on disk (`--prefix-cache-dir`): the files (`store`) and the engine side that saves and
restores sequences' KV state through them (`disk`)."""
