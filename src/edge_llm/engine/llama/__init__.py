"""The llama.cpp boundary: the only package that imports llama_cpp.

- `runner`: the model, its generation context (batched decode, KV ops), its facts and vocabulary;
- `sampling`: each sequence's sampler, the lazy grammar check and log-probabilities;
- `embedding`: a second, small context on the same weights that computes hidden states for embeddings.

Everything else in the engine (scheduler, KV ledger, worker, embeddings queue) is plain Python over plain data.
"""
