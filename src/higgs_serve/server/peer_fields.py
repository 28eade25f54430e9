"""Request fields that vllm-omni and sglang-omni clients send, and what they mean here.

Higgs-Audio V3 infers the language from the text and has one task (speak `input`, zero-shot or in
the voice of a reference), so `language` and `task_type` change nothing in the prompt: they are
checked (a value Higgs cannot serve is a 400 naming it, never silently dropped) and `language` is
echoed in the `X-Language` response header. Fields that would change the output in a way Higgs
cannot honour are refused with a reason (`UNSUPPORTED_FIELDS`).
"""

from __future__ import annotations

# The language tags of the model card (bosonai/higgs-audio-v3-tts-4b), ISO 639 -> English name.
LANGUAGES: dict[str, str] = {
    "af": "Afrikaans", "ar": "Arabic", "as": "Assamese", "ast": "Asturian", "az": "Azerbaijani",
    "ba": "Bashkir", "be": "Belarusian", "bg": "Bulgarian", "bn": "Bengali", "bs": "Bosnian",
    "ca": "Catalan", "ceb": "Cebuano", "ckb": "Central Kurdish", "cs": "Czech", "cy": "Welsh",
    "da": "Danish", "de": "German", "el": "Greek", "en": "English", "eo": "Esperanto",
    "es": "Spanish", "et": "Estonian", "eu": "Basque", "fa": "Persian", "fi": "Finnish",
    "fr": "French", "ga": "Irish", "gl": "Galician", "gu": "Gujarati", "ha": "Hausa",
    "he": "Hebrew", "hi": "Hindi", "hr": "Croatian", "ht": "Haitian Creole", "hu": "Hungarian",
    "hy": "Armenian", "id": "Indonesian", "is": "Icelandic", "it": "Italian", "jv": "Javanese",
    "ka": "Georgian", "kab": "Kabyle", "kam": "Kamba", "kea": "Kabuverdianu", "kk": "Kazakh",
    "kn": "Kannada", "ko": "Korean", "ky": "Kyrgyz", "la": "Latin", "lb": "Luxembourgish",
    "lg": "Ganda", "ln": "Lingala", "lt": "Lithuanian", "luo": "Luo", "lv": "Latvian",
    "mhr": "Eastern Mari", "mi": "Maori", "mk": "Macedonian", "ml": "Malayalam",
    "mn": "Mongolian", "mr": "Marathi", "ms": "Malay", "mt": "Maltese", "ne": "Nepali",
    "nl": "Dutch", "no": "Norwegian", "nso": "Northern Sotho", "ny": "Nyanja", "oc": "Occitan",
    "om": "Oromo", "pa": "Punjabi", "pl": "Polish", "ps": "Pashto", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "rw": "Kinyarwanda", "sd": "Sindhi", "sk": "Slovak",
    "sl": "Slovenian", "sn": "Shona", "so": "Somali", "sq": "Albanian", "sr": "Serbian",
    "sv": "Swedish", "sw": "Swahili", "ta": "Tamil", "te": "Telugu", "tg": "Tajik",
    "tl": "Tagalog", "tr": "Turkish", "ug": "Uyghur", "uk": "Ukrainian", "umb": "Umbundu",
    "ur": "Urdu", "uz": "Uzbek", "vi": "Vietnamese", "xh": "Xhosa", "zh": "Chinese",
    "zu": "Zulu",
}
AUTO = "auto"
_BY_NAME = {name.lower(): name for name in LANGUAGES.values()}

# vllm-omni's task types; Higgs serves zero-shot and cloning under the one it calls "Base".
TASK_TYPES = ("Base",)

# Peer fields that would change the output in ways Higgs-Audio V3 cannot: refused, with why.
UNSUPPORTED_FIELDS: dict[str, str] = {
    "speaker_embedding": "Higgs-Audio V3 clones from reference audio, not speaker embeddings",
    "x_vector_only_mode": "Higgs-Audio V3 has no speaker-embedding (x-vector) mode",
    "voice_prompt": "use ref_audio, references or a registered voice",
    "ref_audio_2": "one reference per request",
    "non_streaming_mode": "a Qwen3-TTS prompt mode; Higgs-Audio V3 has one prompt form",
    "repetition_penalty": "this server's sampler has no repetition penalty",
    "ambient_sound": "Higgs-Audio V3 has no ambient-sound control (use inline <|sfx:...|> tags)",
    "duration_seconds": "use max_new_tokens / min_new_tokens (25 frames per second)",
    "token_count": "use max_new_tokens / min_new_tokens (25 frames per second)",
    "duration_tokens": "use max_new_tokens / min_new_tokens (25 frames per second)",
}


def normalise_language(value: str) -> str:
    """'auto' / a model-card language name / its ISO code (a region suffix allowed, e.g. en-US)
    -> 'auto' or the English name. Raises ValueError naming the value otherwise."""
    text = value.strip()
    if text.lower() == AUTO:
        return AUTO
    if text.lower() in _BY_NAME:
        return _BY_NAME[text.lower()]
    code = text.replace("_", "-").split("-")[0].lower()
    if code in LANGUAGES:
        return LANGUAGES[code]
    raise ValueError(
        f"language {value!r} is not one the model card lists; Higgs-Audio V3 infers the "
        "language from the text, so send 'auto' (or leave it out), or a listed language name "
        "or ISO code (see docs/api.md)")


def normalise_task_type(value: str) -> str:
    for task in TASK_TYPES:
        if value.strip().lower() == task.lower():
            return task
    raise ValueError(
        f"task_type {value!r} is not available: Higgs-Audio V3 has one task, 'Base' (zero-shot, "
        "or cloning from a reference); leave task_type out or send 'Base'")


def explain_unknown(fields: list[str]) -> str:
    """The 400 message for fields the schema does not know (peers' unsupported ones explained)."""
    parts = [f"{name} ({UNSUPPORTED_FIELDS[name]})" if name in UNSUPPORTED_FIELDS else name
             for name in fields]
    known = [name for name in fields if name in UNSUPPORTED_FIELDS]
    lead = "not supported by Higgs-Audio V3" if len(known) == len(fields) else "unknown field(s)"
    return f"{lead}: {', '.join(parts)}"
