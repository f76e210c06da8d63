"""hybridlab: a reproducible pipeline for research on hybrid (linear-recurrent + attention) LLMs."""

__version__ = "0.1.0"
