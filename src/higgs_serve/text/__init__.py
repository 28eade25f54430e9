"""Text segmentation for long-form and streaming input (pure: no torch, no engine)."""

from higgs_serve.text.incremental import IncrementalSegmenter
from higgs_serve.text.segmenter import Segment, group_segments, segment_text

__all__ = ["IncrementalSegmenter", "Segment", "group_segments", "segment_text"]
