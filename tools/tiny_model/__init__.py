"""The recipe behind tools/train_tiny_model.py: corpus, BPE tokenizer, DeepSeek-V3 training model,
export, evaluation and model card of moe-serve's embedded tiny model."""
