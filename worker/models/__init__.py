"""The models: config.json read as transformers reads it, the decoders of the supported
architectures (Llama, Qwen2, Qwen3, Mistral), their loader from a Hugging Face style directory,
and test models."""
