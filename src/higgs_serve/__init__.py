"""higgs-serve: a fast, production-grade server for the Higgs-Audio V3 text-to-speech model."""

__version__ = "0.1.0"
