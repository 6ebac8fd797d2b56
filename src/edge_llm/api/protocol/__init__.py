"""The wire, one module per endpoint family: request bodies as pydantic models, answers, error envelopes."""
