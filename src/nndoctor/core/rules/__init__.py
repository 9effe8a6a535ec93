"""Pure rules shared by the PyTorch and the Keras checks (chance level, image batches,
initial loss, loss trend): numbers in, verdicts out, no framework imported."""
