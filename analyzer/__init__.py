"""model-analyzer: find the best serving configuration for a model."""
__version__ = "0.1.0"
