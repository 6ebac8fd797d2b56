"""The engine thread (an actor owning llama.cpp): its step loop and request lifecycle (`worker`), the requests in
flight (`active`), the channel back to the event loop (`channel`), the embeddings queue, the watchdog, the hooks
that run when it ends, incremental text decoding, and the `Runner` protocol it drives."""
