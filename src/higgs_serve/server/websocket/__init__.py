"""WS /v1/audio/speech/stream: one session's config, its audio transport and the session itself (text in pieces, speech out sentence by sentence)."""
