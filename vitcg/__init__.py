"""vitcg: declarative CUDA graphs for the vision encoders of vision-language models."""

__version__ = "0.1.0"
