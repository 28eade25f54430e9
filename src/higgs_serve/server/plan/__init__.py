"""A request in: its fields (ours and the peers') validated and resolved into a `SpeechPlan` before any response starts, its cloning reference included."""
