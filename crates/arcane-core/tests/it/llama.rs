//! The local-AI service with the real `llama-server` and SmolLM2.
