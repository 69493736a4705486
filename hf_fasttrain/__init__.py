"""hf_fasttrain: drop-in speed-ups for language-model training with the Hugging Face Trainer."""

__version__ = "0.1.0"
