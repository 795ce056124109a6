"""LightningModules: what is trained and how it is scored."""
