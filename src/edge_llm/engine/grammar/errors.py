"""The one error of grammar checking."""


class GrammarError(ValueError):
    """A grammar (or the JSON schema it came from) that llama.cpp cannot, or must not, use."""
