//! Integer-only GPT-2 text codec (the Taco method). See docs/INTEGER_GPT2.md.
