"""Training loops: L2G distillation for cross-encoders, FiD reader training, MoG router training."""
