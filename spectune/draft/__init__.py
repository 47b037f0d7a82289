"""Draft-head training: data (self-distillation), training loop, evaluation."""
