"""mmtx: multimodal transformers — captioning, two-stream pretraining and VQA from shared blocks."""

__version__ = "0.1.0"
