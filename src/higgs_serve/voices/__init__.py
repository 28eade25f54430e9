"""Voices: the persisted registry of named voices (their cached codes) and reference-clip encoding to codes."""
