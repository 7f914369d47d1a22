"""The model: a Llama decoder, its loader from a Hugging Face style directory, and test models."""
