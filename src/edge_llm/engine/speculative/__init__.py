"""Speculative decoding: n-gram drafts (`drafting`), how many to verify per step (`speculation`, by the step's
cost model in `step_cost`), and verifying them with each sequence's own sampler (`acceptance`). Pure Python."""
